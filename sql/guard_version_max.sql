-- state-transition guard: versions at the largest value of their type.  A
-- version that cannot go up fails with 22003, through a plain UPDATE and
-- through idem_transition on each of its paths (the guard alone, another
-- BEFORE ROW trigger, SPI), for smallint, integer and bigint; it never wraps
-- round.  The machine and tables of this file start with "gvm".
\set VERBOSITY terse

-- the outcome of a statement's first column, or the SQLSTATE it raised
CREATE FUNCTION gvm_run(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r text;
BEGIN
    EXECUTE q INTO r;
    RETURN coalesce(r, 'ok');
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END;
$$;
CREATE FUNCTION gvm_noop() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN CASE WHEN TG_LEVEL = 'ROW' THEN NEW END;
END;
$$;

SELECT idem_allow('gvm', 'new', 'paid'), idem_allow('gvm', 'paid', 'shipped');

-- one table per version type and path; rows 1 and 2 start one below and at
-- the largest version, row 3 at the smallest
CREATE FUNCTION gvm_make(typ regtype, path text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    t text := format('gvm_%s_%s', typ, path);
    hi text := CASE typ WHEN 'smallint'::regtype THEN '32767'
                        WHEN 'integer'::regtype THEN '2147483647'
                        ELSE '9223372036854775807' END;
BEGIN
    EXECUTE format($f$
        CREATE TABLE %1$I (id integer PRIMARY KEY, status text NOT NULL,
                           version %2$s NOT NULL, note text);
        INSERT INTO %1$I VALUES (1, 'new', %3$s - 1, NULL), (2, 'new', %3$s, NULL),
                                (3, 'paid', -%3$s - 1, NULL);
        SELECT idem_guard(%1$L, 'gvm', 'status', 'version');
    $f$, t, typ, hi);
    IF path = 'locked' THEN
        EXECUTE format('CREATE TRIGGER a_noop BEFORE UPDATE ON %I FOR EACH ROW EXECUTE FUNCTION gvm_noop()', t);
    ELSIF path = 'spi' THEN
        EXECUTE format('CREATE TRIGGER a_noop AFTER UPDATE ON %I FOR EACH STATEMENT EXECUTE FUNCTION gvm_noop()', t);
    END IF;
    RETURN t;
END;
$$;

CREATE TABLE gvm_outcomes (t text, n serial, request text, outcome text);
CREATE FUNCTION gvm_scenario(t text, hi text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    below text := (hi::numeric - 1)::text;
    req text;
BEGIN
    FOREACH req IN ARRAY ARRAY[
        -- one below the largest: the last move there is
        format($q$SELECT idem_transition(%L, '1', 'paid')$q$, t),
        -- at the largest: no move, with or without the expected version
        format($q$SELECT idem_transition(%L, '1', 'shipped')$q$, t),
        format($q$SELECT idem_transition(%L, '1', 'shipped', %s)$q$, t, hi),
        format($q$SELECT idem_transition(%L, '2', 'paid')$q$, t),
        format($q$SELECT idem_transition(%L, '2', 'paid', %s)$q$, t, hi),
        -- requests that write nothing are answered as always
        format($q$SELECT idem_transition(%L, '2', 'paid', %s)$q$, t, below),
        format($q$SELECT idem_transition(%L, '2', 'new', %s)$q$, t, below),
        format($q$SELECT idem_transition(%L, '2', 'new')$q$, t),
        -- a plain UPDATE, moving the row or not, or naming the version
        format($q$UPDATE %I SET status = 'paid' WHERE id = 2 RETURNING version::text$q$, t),
        format($q$UPDATE %I SET note = 'x' WHERE id = 2 RETURNING version::text$q$, t),
        format($q$UPDATE %I SET note = 'x', version = version WHERE id = 2 RETURNING version::text$q$, t),
        format($q$UPDATE %I SET note = 'x' WHERE id = 1 RETURNING version::text$q$, t),
        -- the largest expected version there is, on a row at the smallest
        format($q$SELECT idem_transition(%L, '3', 'paid', 9223372036854775807)$q$, t),
        format($q$SELECT idem_transition(%L, '3', 'shipped', 9223372036854775807)$q$, t)]
    LOOP
        INSERT INTO gvm_outcomes (t, request, outcome)
        VALUES (t, regexp_replace(req, 'gvm_\w+', 't'), gvm_run(req));
    END LOOP;
END;
$$;

SELECT gvm_scenario(gvm_make(typ, path), hi)
  FROM (VALUES ('smallint'::regtype, '32767'), ('integer', '2147483647'),
               ('bigint', '9223372036854775807')) AS v(typ, hi),
       unnest(ARRAY['alone', 'locked', 'spi']) AS path;

-- the outcomes on the guard-alone path of each type...
SELECT t, request, outcome FROM gvm_outcomes WHERE t LIKE '%\_alone' ORDER BY n;
-- ...are those of the other paths
SELECT o.t, o.request, o.outcome, a.outcome AS alone
  FROM gvm_outcomes o
  JOIN gvm_outcomes a ON a.t = regexp_replace(o.t, '_[a-z]+$', '_alone') AND a.request = o.request
 WHERE o.outcome IS DISTINCT FROM a.outcome;
SELECT count(*) AS outcomes FROM gvm_outcomes;

-- no row went past the largest version, nor round to a negative one
SELECT 'smallint' AS typ, id, status, version::text, note FROM gvm_smallint_alone
UNION ALL SELECT 'integer', id, status, version::text, note FROM gvm_integer_alone
UNION ALL SELECT 'bigint', id, status, version::text, note FROM gvm_bigint_alone
ORDER BY 1 DESC, 2;
SELECT t, count(*) AS rows_differing
  FROM (SELECT 'locked' AS t, * FROM (SELECT * FROM gvm_integer_locked EXCEPT SELECT * FROM gvm_integer_alone) d
        UNION ALL SELECT 'spi', * FROM (SELECT * FROM gvm_integer_spi EXCEPT SELECT * FROM gvm_integer_alone) d
        UNION ALL SELECT 'locked', * FROM (SELECT id, status, version::bigint, note FROM gvm_bigint_locked
                                         EXCEPT SELECT id, status, version::bigint, note FROM gvm_bigint_alone) d
        UNION ALL SELECT 'spi', * FROM (SELECT id, status, version::bigint, note FROM gvm_bigint_spi
                                      EXCEPT SELECT id, status, version::bigint, note FROM gvm_bigint_alone) d) x
 GROUP BY t ORDER BY t;

-- the error says why
\set VERBOSITY default
\set SHOW_CONTEXT never
SELECT idem_transition('gvm_integer_alone', '2', 'paid');
UPDATE gvm_bigint_alone SET status = 'paid' WHERE id = 2;
\set VERBOSITY terse
\set SHOW_CONTEXT errors

-- a row whose version is null (damaged: written while the column's NOT
-- NULL was off, here by editing the catalog) is refused with 23502 by an
-- UPDATE and by idem_transition (not read as version 0); the other rows move
CREATE TABLE gvm_null (id int PRIMARY KEY, status text NOT NULL, version bigint NOT NULL DEFAULT 0);
INSERT INTO gvm_null VALUES (1, 'new'), (2, 'new');
UPDATE pg_attribute SET attnotnull = false
 WHERE attrelid = 'gvm_null'::regclass AND attname = 'version';
UPDATE gvm_null SET version = NULL WHERE id = 1;
UPDATE pg_attribute SET attnotnull = true
 WHERE attrelid = 'gvm_null'::regclass AND attname = 'version';
SELECT idem_guard('gvm_null', 'gvm', 'status', 'version');
SELECT gvm_run($$UPDATE gvm_null SET status = 'paid' WHERE id = 1$$) AS "update",
       gvm_run($$UPDATE gvm_null SET status = 'paid', version = 1 WHERE id = 1$$) AS update_version,
       gvm_run($$SELECT idem_transition('gvm_null', '1', 'paid')$$) AS transition,
       gvm_run($$SELECT idem_transition('gvm_null', '2', 'paid')$$) AS other_row;
SELECT * FROM gvm_null ORDER BY id;
DROP TABLE gvm_null;

DO $$
DECLARE
    t text;
BEGIN
    FOR t IN SELECT DISTINCT gvm_outcomes.t FROM gvm_outcomes LOOP
        EXECUTE format('DROP TABLE %I', t);
    END LOOP;
END;
$$;
DROP TABLE gvm_outcomes;
DROP FUNCTION gvm_run(text), gvm_noop(), gvm_make(regtype, text), gvm_scenario(text, text);
SELECT idem_disallow('gvm', 'new', 'paid'), idem_disallow('gvm', 'paid', 'shipped');
