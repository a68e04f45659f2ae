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

-- the plan of purge's own DELETE, as auto_explain logs it: the index scan
-- finds nothing, and reads no row of the namespace.  The test servers write
-- their log to their standard error, which a backend shares: the plan is
-- read back from there, in JSON, its costs and times left out.
LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_nested_statements = on;
SET auto_explain.log_analyze = on;
SET auto_explain.log_timing = off;
SET auto_explain.log_format = json;
SET auto_explain.log_level = log;
SELECT (pg_stat_file('/proc/self/fd/2')).size AS log_start \gset
SELECT idem_purge('pp_big') AS deleted;
RESET auto_explain.log_min_duration;
CREATE TEMP TABLE purge_plan AS
SELECT substr(m, strpos(m, 'plan:') + 5)::jsonb -> 'Plan' AS plan
  FROM regexp_split_to_table(pg_read_file('/proc/self/fd/2', :log_start,
                                          (pg_stat_file('/proc/self/fd/2')).size - :log_start),
                             E'\n(?=[^\t])') m
 WHERE m LIKE '%LOG:  duration: %plan:%' AND m LIKE '%"Query Text": "DELETE FROM idem.claims c%';
SELECT count(*) AS plans FROM purge_plan;
WITH RECURSIVE node(n, depth, path) AS (
    SELECT plan, 0, ARRAY[]::bigint[] FROM purge_plan
    UNION ALL
    SELECT c.value, depth + 1, path || c.i
      FROM node, jsonb_array_elements(n -> 'Plans') WITH ORDINALITY c(value, i)
)
SELECT repeat('  ', depth) || concat_ws(' ', n ->> 'Subplan Name', n ->> 'Node Type', n ->> 'Operation',
                                        'on ' || (n ->> 'Relation Name'), 'using ' || (n ->> 'Index Name'),
                                        'rows=' || (n ->> 'Actual Rows'),
                                        'loops=' || (n ->> 'Actual Loops')) AS node,
       regexp_replace(coalesce(n ->> 'Index Cond', n ->> 'TID Cond'),
                      '''[^'']*''::timestamp with time zone', 'cutoff') AS cond
  FROM node ORDER BY path;

DELETE FROM idem.claims WHERE ns = 'pp_big';
