-- state-transition guard: triggers that write to the guarded table itself
-- while idem_transition moves a row.  The guard decides the request on the
-- request's own row only: another row updated meanwhile (by a BEFORE
-- trigger that fires before or after the guard, an AFTER trigger, or a
-- nested idem_transition) is an ordinary UPDATE of that row, checked and
-- versioned as such.  Each case runs on the direct path and through SPI.
-- The machine and tables of this file start with "gtw".
\set VERBOSITY terse

SELECT idem_allow('gtw', 'new', 'paid'), idem_allow('gtw', 'paid', 'shipped');

-- what the cascading trigger does when row 1 moves, set per case
CREATE TABLE gtw_mode (mode text);
INSERT INTO gtw_mode VALUES ('none');
CREATE FUNCTION gtw_cascade() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    m text := (SELECT mode FROM gtw_mode);
BEGIN
    IF OLD.id = 1 AND NEW.status IS DISTINCT FROM OLD.status THEN
        IF m = 'touch' THEN
            -- row 2 keeps its state: an update the guard only versions
            EXECUTE format('UPDATE %I SET note = %L WHERE id = 2', TG_TABLE_NAME,
                           'touched by ' || TG_NAME);
        ELSIF m = 'move' THEN
            EXECUTE format('UPDATE %I SET status = ''shipped'' WHERE id = 2', TG_TABLE_NAME);
        ELSIF m = 'transition' THEN
            PERFORM idem_transition(TG_RELID, '2', 'shipped');
        ELSIF m = 'self' THEN
            EXECUTE format('UPDATE %I SET note = ''self'' WHERE id = 1', TG_TABLE_NAME);
        END IF;
    END IF;
    RETURN CASE WHEN TG_WHEN = 'BEFORE' THEN NEW END;
END;
$$;
CREATE FUNCTION gtw_noop() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END;
$$;

-- One case: a fresh table with row 1 'new' at version 0 and row 2 'paid'
-- at version 5 (so that a request for 'paid' decided on row 2 would be
-- "already", and one at version 0 "stale"), the cascading trigger fired
-- "trig" (a_before: before the guard; z_before: after it; after: AFTER
-- ROW), on the direct path or through SPI (a statement-level trigger).
CREATE FUNCTION gtw_setup(path text, trig text, m text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DROP TABLE IF EXISTS gtw_t;
    CREATE TABLE gtw_t (id integer PRIMARY KEY, status text NOT NULL,
                        version bigint NOT NULL, note text);
    INSERT INTO gtw_t VALUES (1, 'new', 0, NULL), (2, 'paid', 5, NULL);
    PERFORM idem_guard('gtw_t', 'gtw', 'status', 'version');
    IF trig = 'after' THEN
        CREATE TRIGGER z_after AFTER UPDATE ON gtw_t
            FOR EACH ROW EXECUTE FUNCTION gtw_cascade();
    ELSE
        EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE ON gtw_t
                            FOR EACH ROW EXECUTE FUNCTION gtw_cascade()', trig);
    END IF;
    IF path = 'spi' THEN
        CREATE TRIGGER statement_noop AFTER UPDATE ON gtw_t
            FOR EACH STATEMENT EXECUTE FUNCTION gtw_noop();
    END IF;
    UPDATE gtw_mode SET mode = m;
END;
$$;
-- Move row 1 to 'paid'; the outcome (or the SQLSTATE) and both rows.
CREATE FUNCTION gtw_go(expected bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    outcome text;
    r1 text;
    r2 text;
BEGIN
    BEGIN
        outcome := idem_transition('gtw_t', '1', 'paid', expected);
    EXCEPTION WHEN OTHERS THEN
        outcome := SQLSTATE;
    END;
    SELECT format('%s %s %s', status, version, note) INTO r1 FROM gtw_t WHERE id = 1;
    SELECT format('%s %s %s', status, version, note) INTO r2 FROM gtw_t WHERE id = 2;
    RETURN format('%-9s | row 1: %-16s | row 2: %s', outcome, r1, r2);
END;
$$;
CREATE FUNCTION gtw_case(path text, trig text, m text, expected bigint)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM gtw_setup(path, trig, m);
    RETURN gtw_go(expected);
END;
$$;

SET client_min_messages = warning;
SELECT gtw_setup('direct', 'after', 'none');
RESET client_min_messages;
SELECT path, trig, m AS mode, expected, gtw_case(path, trig, m, expected) AS result
  FROM unnest(ARRAY['direct', 'spi']) AS path,
       unnest(ARRAY['a_before', 'z_before', 'after']) AS trig,
       unnest(ARRAY['touch', 'move', 'transition']) AS m,
       unnest(ARRAY[NULL, 0]::bigint[]) AS expected
 ORDER BY 1, 2, 3, 4 NULLS FIRST;

-- the guard alone among the BEFORE ROW triggers, with an AFTER trigger that
-- writes to row 2: the move is applied without locking the row first, and
-- row 2's update is still checked and versioned
SELECT gtw_setup('direct', 'after', 'touch');
SET client_min_messages = debug1;
SELECT gtw_go(NULL) AS alone_touch;
RESET client_min_messages;
SELECT gtw_case('direct', 'after', 'move', 0) AS alone_move;
-- the AFTER trigger's update of row 2 is itself an illegal move
SELECT idem_disallow('gtw', 'paid', 'shipped');
SELECT gtw_case('direct', 'after', 'move', 0) AS alone_illegal;
SELECT gtw_case('spi', 'a_before', 'move', NULL) AS spi_illegal;
SELECT idem_allow('gtw', 'paid', 'shipped');

-- a BEFORE trigger that updates the request's own row: the error of an
-- UPDATE whose row a trigger of the same command already changed, 27000
SELECT trig, gtw_case('direct', trig, 'self', NULL) AS direct, gtw_case('spi', trig, 'self', NULL) AS spi
  FROM unnest(ARRAY['a_before', 'z_before']) AS trig ORDER BY 1;
-- the same, by a hand-written UPDATE
SELECT gtw_setup('direct', 'a_before', 'self');
UPDATE gtw_t SET status = 'paid' WHERE id = 1;
SELECT * FROM gtw_t ORDER BY id;

DROP TABLE gtw_t, gtw_mode;
DROP FUNCTION gtw_case(text, text, text, bigint), gtw_setup(text, text, text),
              gtw_go(bigint), gtw_cascade(), gtw_noop();
SELECT idem_disallow('gtw', 'new', 'paid'), idem_disallow('gtw', 'paid', 'shipped');
