-- idem_transition keeps nothing per call in the backend's caches: with a
-- composite primary key (whose equality, record_eq, keeps a cache in its
-- FmgrInfo's context at every call) and a domain state column (whose input
-- function keeps one too, and is set up again whenever the table's cache
-- entry is rebuilt), the memory used in CacheMemoryContext does not grow
-- with the calls.
\set VERBOSITY terse
CREATE FUNCTION pg_temp.cache_bytes() RETURNS bigint
LANGUAGE sql AS $$
    SELECT coalesce(sum(used_bytes), 0)::bigint FROM pg_backend_memory_contexts
     WHERE name = 'CacheMemoryContext'
$$;

SELECT idem_allow('mem', 'new', 'paid');
CREATE TYPE pair AS (a integer, b integer);
CREATE DOMAIN state AS text CHECK (VALUE <> '');
CREATE TABLE cp (id pair PRIMARY KEY, status state NOT NULL,
                 version bigint NOT NULL DEFAULT 0);
INSERT INTO cp (id, status) SELECT ROW(i, i)::pair, 'new' FROM generate_series(1, 10) i;
SELECT idem_guard('cp', 'mem', 'status', 'version');

-- every outcome a call can have, once, before measuring
SELECT idem_transition('cp', '(1,1)', 'paid');
SELECT idem_transition('cp', '(1,1)', 'paid');
SELECT idem_transition('cp', '(2,2)', 'paid', 5);
SELECT idem_transition('cp', '(9,9)', 'new');
SELECT idem_transition('cp', '(99,99)', 'paid');

-- requests decided by the trigger, on the locked row: the key is compared
-- there at every call (the statement runs once before measuring, so that
-- what it caches for good is cached)
CREATE FUNCTION pg_temp.moves(n integer) RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FILTER (WHERE idem_transition('cp', format('(%s,%s)', g % 10 + 1, g % 10 + 1),
                                                  'new') IN ('already', 'stale'))
      FROM generate_series(1, n) g
$$;
SELECT pg_temp.moves(100);
CREATE TEMP TABLE before AS SELECT pg_temp.cache_bytes() AS b;
SELECT pg_temp.moves(20000);
SELECT pg_temp.cache_bytes() - b < 64 * 1024 AS cache_bounded_by_calls FROM before;

-- the table's cache entry rebuilt at every call (any ALTER TABLE sends an
-- invalidation of the table)
DROP TABLE before;
CREATE TEMP TABLE before AS SELECT pg_temp.cache_bytes() AS b;
DO $$
BEGIN
    FOR i IN 1..300 LOOP
        ALTER TABLE cp SET (fillfactor = 100);
        PERFORM idem_transition('cp', '(3,3)', 'new');
    END LOOP;
END;
$$;
SELECT pg_temp.cache_bytes() - b < 64 * 1024 AS cache_bounded_by_rebuilds FROM before;

DROP TABLE cp;
DROP DOMAIN state;
DROP TYPE pair;
DELETE FROM idem.transitions;
