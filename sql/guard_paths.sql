-- idem_transition updates most rows itself, without a plan; tables with
-- row-level security, rules, statement-level triggers, transition tables or
-- stored generated columns go through SPI.  Both paths must give the same
-- outcomes and leave the same rows, with every part of an UPDATE: row
-- triggers before and after (per column as well), constraints, indexes,
-- deferred uniqueness, privileges.
\set VERBOSITY terse

CREATE FUNCTION err(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text;
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    RETURN st || ': ' || msg;
END;
$$;

SELECT idem_allow('p', 'new', 'paid');
SELECT idem_allow('p', 'paid', 'shipped');
SELECT idem_allow('p', 'paid', 'held');

-- what the triggers and rules saw, in order
CREATE TABLE seen (n serial, tbl text, what text, old_state text,
                   new_state text, old_version bigint, new_version bigint);
CREATE FUNCTION see_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO seen (tbl, what, old_state, new_state, old_version, new_version)
    VALUES (TG_TABLE_NAME, TG_WHEN || ' ' || TG_ARGV[0], OLD.status,
            NEW.status, OLD.version, NEW.version);
    IF TG_WHEN = 'AFTER' AND NEW.note = 'boom' THEN
        RAISE EXCEPTION 'after trigger refuses row %', NEW.id;
    END IF;
    RETURN NEW;
END;
$$;
CREATE FUNCTION see_statement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO seen (tbl, what) VALUES (TG_TABLE_NAME, TG_WHEN || ' statement');
    RETURN NULL;
END;
$$;

CREATE TABLE customers (id integer PRIMARY KEY);
INSERT INTO customers VALUES (1);

-- every table has the same columns, constraints, indexes and row triggers
CREATE FUNCTION make_table(t text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format($f$
        CREATE TABLE %1$I (
            id       integer PRIMARY KEY,
            status   text NOT NULL CHECK (status <> 'held'),
            version  bigint NOT NULL DEFAULT 0,
            customer integer REFERENCES customers,
            note     text UNIQUE DEFERRABLE INITIALLY DEFERRED
        );
        -- the state is indexed: a transition is not a HOT update
        CREATE INDEX ON %1$I (status, id);
        CREATE TRIGGER b_of_status BEFORE UPDATE OF status ON %1$I
            FOR EACH ROW EXECUTE FUNCTION see_row('of status');
        CREATE TRIGGER b_of_note BEFORE UPDATE OF note ON %1$I
            FOR EACH ROW EXECUTE FUNCTION see_row('of note');
        CREATE TRIGGER z_after AFTER UPDATE ON %1$I
            FOR EACH ROW EXECUTE FUNCTION see_row('row');
        INSERT INTO %1$I (id, status, customer, note) VALUES
            (1, 'new', 1, 'a'), (2, 'new', 1, 'boom'), (3, 'new', NULL, 'c'),
            (4, 'new', 1, 'd');
        SELECT idem_guard(%1$L, 'p', 'status', 'version');
    $f$, t);
END;
$$;
SELECT make_table('t_direct');
-- the guard alone among the BEFORE ROW triggers: a move that applies to the
-- row the snapshot sees is written without locking the row first
SELECT make_table('t_alone');
DROP TRIGGER b_of_status ON t_alone;
DROP TRIGGER b_of_note ON t_alone;
-- through SPI: a statement-level trigger, a rule, a stored generated column
SELECT make_table('t_statement');
CREATE TRIGGER after_statement AFTER UPDATE ON t_statement
    FOR EACH STATEMENT EXECUTE FUNCTION see_statement();
SELECT make_table('t_rule');
CREATE RULE also_seen AS ON UPDATE TO t_rule DO ALSO
    INSERT INTO seen (tbl, what, old_state, new_state)
    VALUES ('t_rule', 'rule', OLD.status, NEW.status);
SELECT make_table('t_generated');
ALTER TABLE t_generated ADD COLUMN shout text
    GENERATED ALWAYS AS (upper(status)) STORED;

-- the same requests on every table
CREATE FUNCTION scenario(t regclass) RETURNS TABLE (request text, outcome text)
LANGUAGE plpgsql AS $$
BEGIN
    request := '1 -> paid at 0'; outcome := idem_transition(t, '1', 'paid', 0); RETURN NEXT;
    request := 'the retry'; outcome := idem_transition(t, '1', 'paid', 0); RETURN NEXT;
    request := '1 -> new, late'; outcome := idem_transition(t, '1', 'new'); RETURN NEXT;
    request := '4 -> shipped'; outcome := idem_transition(t, '4', 'shipped'); RETURN NEXT;
    request := '9 -> paid'; outcome := idem_transition(t, '9', 'paid'); RETURN NEXT;
    request := '1 -> held, refused by CHECK';
    outcome := replace(err(format($q$SELECT idem_transition(%L, '1', 'held')$q$, t)),
                       t::text, 't'); RETURN NEXT;
    request := '2 -> paid, refused by an AFTER trigger';
    outcome := err(format($q$SELECT idem_transition(%L, '2', 'paid')$q$, t)); RETURN NEXT;
    -- the second call of a statement sees what the first did
    request := '3 -> paid -> shipped in one statement';
    EXECUTE format($q$SELECT idem_transition(%1$L, '3', 'paid', 0) || ' ' ||
                             idem_transition(%1$L, '3', 'shipped', 1)$q$, t)
       INTO outcome;
    RETURN NEXT;
    -- a move undone with its subtransaction can be made again
    BEGIN
        PERFORM idem_transition(t, '4', 'paid');
        RAISE EXCEPTION 'undo';
    EXCEPTION WHEN raise_exception THEN
        NULL;
    END;
    request := '4 -> paid after a rollback'; outcome := idem_transition(t, '4', 'paid', 0); RETURN NEXT;
END;
$$;

CREATE TABLE outcomes (t text, n serial, request text, outcome text);
INSERT INTO outcomes (t, request, outcome) SELECT 't_direct', * FROM scenario('t_direct');
INSERT INTO outcomes (t, request, outcome) SELECT 't_alone', * FROM scenario('t_alone');
INSERT INTO outcomes (t, request, outcome) SELECT 't_statement', * FROM scenario('t_statement');
INSERT INTO outcomes (t, request, outcome) SELECT 't_rule', * FROM scenario('t_rule');
INSERT INTO outcomes (t, request, outcome) SELECT 't_generated', * FROM scenario('t_generated');

-- the direct path
SELECT request, outcome FROM outcomes WHERE t = 't_direct' ORDER BY n;
SELECT id, status, version, customer, note FROM t_direct ORDER BY id;
-- (the triggers of the moves made: a refused move runs none)
SELECT what, old_state, new_state, old_version, new_version
  FROM seen WHERE tbl = 't_direct' ORDER BY n;

-- the paths through SPI: the same outcomes (no row differs)...
SELECT o.t, o.request, o.outcome, d.outcome AS direct
  FROM outcomes o JOIN outcomes d ON d.t = 't_direct' AND d.request = o.request
 WHERE o.outcome IS DISTINCT FROM d.outcome;
SELECT t, count(*) FROM outcomes GROUP BY t ORDER BY t;
-- ...the same rows...
(SELECT 't_alone' AS t, id, status, version, customer, note FROM t_alone
 UNION ALL SELECT 't_statement', id, status, version, customer, note FROM t_statement
 UNION ALL SELECT 't_rule', id, status, version, customer, note FROM t_rule
 UNION ALL SELECT 't_generated', id, status, version, customer, note FROM t_generated)
EXCEPT
SELECT t, id, status, version, customer, note
  FROM t_direct, unnest(ARRAY['t_alone', 't_statement', 't_rule', 't_generated']) t;
-- ...the same row triggers, in the same order
CREATE FUNCTION row_triggers(t text) RETURNS text[] LANGUAGE sql AS $$
    SELECT array_agg(format('%s %s>%s %s>%s', what, old_state, new_state,
                            old_version, new_version) ORDER BY n)
      FROM seen WHERE tbl = t AND what NOT IN ('AFTER statement', 'rule')
$$;
SELECT t, row_triggers(t) = row_triggers('t_direct') AS same
  FROM unnest(ARRAY['t_statement', 't_rule', 't_generated']) t;
-- (t_alone has the AFTER trigger only)
SELECT row_triggers('t_alone') =
       (SELECT array_agg(x ORDER BY i) FROM unnest(row_triggers('t_direct')) WITH ORDINALITY u(x, i)
         WHERE x LIKE 'AFTER%') AS same_after_triggers;
-- and what sent them through SPI did its part: the statement trigger fired
-- once per call that ran the UPDATE (a move allowed, or no row) and was not
-- rolled back, the rule once per move allowed (a refused move is judged on
-- the locked row first, and runs neither), the generated column follows the
-- state
SELECT tbl, what, count(*) FROM seen
 WHERE what IN ('AFTER statement', 'rule') GROUP BY 1, 2 ORDER BY 1, 2;
SELECT id, status, shout FROM t_generated ORDER BY id;
-- each table took the path it should
SET client_min_messages = debug1;
SELECT idem_transition(t::regclass, '9', 'paid')
  FROM unnest(ARRAY['t_direct', 't_statement', 't_rule', 't_generated']) t;
INSERT INTO t_alone (id, status) VALUES (10, 'new');
INSERT INTO t_direct (id, status) VALUES (10, 'new');
-- a move that applies: without a lock first only where the guard is alone
SELECT idem_transition('t_alone', '10', 'paid');
SELECT idem_transition('t_direct', '10', 'paid');
-- one that does not apply is decided on the locked row
SELECT idem_transition('t_alone', '10', 'new');
RESET client_min_messages;

-- as a role that is not the owner: row-level security (through SPI) and
-- column privileges (on the direct path) apply as they do to an UPDATE
CREATE ROLE regress_idem_paths;
SELECT make_table('t_rls');
ALTER TABLE t_rls ENABLE ROW LEVEL SECURITY;
CREATE POLICY not_two ON t_rls USING (id <> 2);
GRANT SELECT, UPDATE ON t_rls TO regress_idem_paths;
GRANT SELECT (id, status, version), UPDATE (status) ON t_direct TO regress_idem_paths;
GRANT INSERT ON seen TO regress_idem_paths;
GRANT USAGE ON SEQUENCE seen_n_seq TO regress_idem_paths;
SET ROLE regress_idem_paths;
SET client_min_messages = debug1;
SELECT idem_transition('t_rls', '2', 'paid');
RESET client_min_messages;
SELECT idem_transition('t_rls', '1', 'paid', 0);
SELECT idem_transition('t_direct', '4', 'shipped', 1);
RESET ROLE;
REVOKE SELECT (id) ON t_direct FROM regress_idem_paths;
SET ROLE regress_idem_paths;
SELECT err($$SELECT idem_transition('t_direct', '1', 'shipped')$$);
RESET ROLE;
GRANT SELECT (id) ON t_direct TO regress_idem_paths;
REVOKE UPDATE (status) ON t_direct FROM regress_idem_paths;
GRANT UPDATE (note) ON t_direct TO regress_idem_paths;
SET ROLE regress_idem_paths;
SELECT err($$SELECT idem_transition('t_direct', '1', 'shipped')$$);
RESET ROLE;
SELECT id, status, version FROM t_rls ORDER BY id;
SELECT id, status, version FROM t_direct ORDER BY id;
DROP OWNED BY regress_idem_paths;
DROP ROLE regress_idem_paths;

DROP TABLE t_direct, t_alone, t_statement, t_rule, t_generated, t_rls, customers, seen,
           outcomes;
DROP FUNCTION make_table(text), scenario(regclass), row_triggers(text),
              see_row(), see_statement(), err(text);
DELETE FROM idem.transitions;
