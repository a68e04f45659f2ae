-- consumer dedup: purge reads what it deletes.  It reaches the claims
-- older than a namespace's horizon through claims_ns_claimed_at_idx, oldest
-- first: the last call of a purge loop, which finds nothing to delete,
-- does not read the namespace.
\set VERBOSITY terse

-- rows of idem.claims read in this transaction, by sequential and index
-- scans
CREATE FUNCTION pg_temp.rows_read() RETURNS bigint LANGUAGE sql AS $$
    SELECT pg_stat_get_xact_tuples_returned('idem.claims'::regclass) +
           pg_stat_get_xact_tuples_fetched('idem.claims'::regclass)
$$;

SELECT idem_purge(NULL, 1000000) >= 0 AS cleared;
SELECT count(*) FILTER (WHERE r) AS claimed
  FROM unnest(idem_claim_batch(ARRAY(SELECT 'p' || g FROM generate_series(1, 20000) g), 'pp_big')) r;
SELECT idem_claim_batch(ARRAY['o1', 'o2', 'o3'], 'pp_big');
UPDATE idem.claims SET claimed_at = now() - '30 days'::interval WHERE ns = 'pp_big' AND msg_id LIKE 'o_';
ANALYZE idem.claims;

-- the index exists, with the columns purge looks for
SELECT indexrelid::regclass AS index, pg_get_indexdef(indexrelid) AS definition
  FROM pg_index WHERE indrelid = 'idem.claims'::regclass ORDER BY indexrelid::regclass::text;

-- a purge loop: 3 claims to delete, then nothing.  Each call reads what
-- it deletes (and a row or two per namespace of the database, to find
-- them), not the 20,003 claims of the namespace.
BEGIN;
SELECT pg_temp.rows_read() AS r0 \gset
SELECT idem_purge('pp_big', 2) AS deleted;
SELECT pg_temp.rows_read() - :r0 < 1000 AS reads_few;
SELECT pg_temp.rows_read() AS r0 \gset
SELECT idem_purge('pp_big', 2) AS deleted;
SELECT pg_temp.rows_read() - :r0 < 1000 AS reads_few;
SELECT pg_temp.rows_read() AS r0 \gset
SELECT idem_purge('pp_big', 2) AS deleted;
SELECT pg_temp.rows_read() - :r0 < 1000 AS reads_few;
SELECT pg_temp.rows_read() AS r0 \gset
SELECT idem_purge() AS deleted;
SELECT pg_temp.rows_read() - :r0 < 1000 AS reads_few;
COMMIT;

-- the plan of purge's query: the index scan finds nothing, and reads no
-- row of the namespace
BEGIN;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)
DELETE FROM idem.claims c
 WHERE c.ctid = ANY (ARRAY(
        SELECT v.ctid FROM idem.claims v
         WHERE v.ns = 'pp_big'
           AND v.claimed_at < now() - '7 days'::interval
         ORDER BY v.claimed_at
         LIMIT 10000
           FOR UPDATE SKIP LOCKED));
ROLLBACK;
-- the query explained is the one idem._purge_claims runs, with its table
-- and parameters written in: its text there
SELECT strpos(regexp_replace(prosrc, '\s+', ' ', 'g'),
              'DELETE FROM %1$s c WHERE c.ctid OPERATOR(pg_catalog.=) ANY (ARRAY( '
              'SELECT v.ctid FROM %1$s v WHERE v.ns OPERATOR(pg_catalog.=) $1 '
              'AND v.claimed_at OPERATOR(pg_catalog.<) $2 ORDER BY v.claimed_at LIMIT $3 '
              'FOR UPDATE SKIP LOCKED))') > 0 AS explained_is_purge
  FROM pg_proc WHERE oid = 'idem._purge_claims(text, integer)'::regprocedure;

DELETE FROM idem.claims WHERE ns = 'pp_big';
