-- statistics of a transaction that counts in many namespaces: its entries
-- are found through a hash table once they are many (searching the list made
-- such a transaction quadratic; bench/stats/many_namespaces.sh times it), and
-- subtransactions that commit or roll back still add or drop their counts
\set VERBOSITY terse
SELECT idem_stats_reset();

-- exception blocks over 60 namespaces (more than are searched in the list),
-- one in three rolled back, some nested
DO $$
BEGIN
    FOR i IN 1..300 LOOP
        BEGIN
            PERFORM idem_try_claim('m' || (i % 7), 'stn-' || (i % 60));
            BEGIN
                PERFORM idem_try_claim('n' || (i % 5), 'stn-' || (i % 45));
                IF i % 4 = 0 THEN
                    RAISE EXCEPTION 'undo the inner block';
                END IF;
            EXCEPTION WHEN raise_exception THEN
                NULL;
            END;
            IF i % 3 = 0 THEN
                RAISE EXCEPTION 'undo the outer block';
            END IF;
        EXCEPTION WHEN raise_exception THEN
            NULL;
        END;
    END LOOP;
END
$$;
-- the counts are those of the blocks that stand: as many operations as
-- calls that were not undone, as many claimed as rows claimed
SELECT count(*) AS namespaces, sum(operations) AS operations,
       sum((counters->>'claimed')::bigint) AS claimed,
       sum((counters->>'duplicate')::bigint) AS duplicates
  FROM idem_stats WHERE kind = 'claim' AND ns LIKE 'stn-%';
-- what stands, from the claims themselves
SELECT count(*) AS claims FROM idem.claims WHERE ns LIKE 'stn-%';
SELECT count(*) FILTER (WHERE i % 3 <> 0) + count(*) FILTER (WHERE i % 3 <> 0 AND i % 4 <> 0) AS calls
  FROM generate_series(1, 300) i;

-- a transaction keeps its own entries for at most 65,536 namespaces, the
-- further ones counted under "*" (200,000 took some 150 MB, two million
-- failed with an internal error)
BEGIN;
SET LOCAL statement_timeout = '120s';
SELECT count(idem_token_consume('x', 'stc-' || g)) FROM generate_series(1, 200000) g;
SELECT sum(total_bytes) < 100 * 1024 * 1024 AS bounded FROM pg_backend_memory_contexts;
COMMIT;
SELECT sum(operations) AS operations
  FROM idem_stats WHERE kind = 'token' AND (ns LIKE 'stc-%' OR ns = '*');

DELETE FROM idem.claims WHERE ns LIKE 'stn-%';
SELECT idem_stats_reset();
