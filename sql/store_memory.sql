-- memory of the storage layer stays bounded: per-call state is not kept in
-- the backend-lifetime executor state, and cached index definitions
-- replaced by an invalidation are freed
\set VERBOSITY terse
CREATE FUNCTION pg_temp.backend_bytes(ctx text) RETURNS bigint
LANGUAGE sql AS $$
    SELECT coalesce(sum(total_bytes), 0)::bigint FROM pg_backend_memory_contexts
     WHERE name = ctx AND parent = 'TopMemoryContext'
$$;

-- an expression index and a partial index on idem's table make the store
-- fall back to the executor's way of opening indexes
CREATE INDEX claims_len ON idem.claims ((length(msg_id)));
CREATE INDEX claims_part ON idem.claims (claimed_at) WHERE ns = 'memtest';
SELECT count(*) FILTER (WHERE idem_claim('w' || g, 'memtest')) FROM generate_series(1, 100) g;
CREATE TEMP TABLE before AS SELECT pg_temp.backend_bytes('ExecutorState') AS b;
SELECT count(*) FILTER (WHERE idem_claim('m' || g, 'memtest')) FROM generate_series(1, 20000) g;
SELECT count(*) FILTER (WHERE x) FROM unnest(idem_claim_batch(ARRAY(SELECT 'n' || g FROM generate_series(1, 20000) g), 'memtest')) x;
SELECT pg_temp.backend_bytes('ExecutorState') - b < 512 * 1024 AS executor_state_bounded FROM before;
-- the indexes were maintained: the partial and expression indexes find the rows
SET enable_seqscan = off;
SELECT count(*) FROM idem.claims WHERE ns = 'memtest' AND claimed_at IS NOT NULL;
SELECT count(*) FROM idem.claims WHERE length(msg_id) = 6 AND ns = 'memtest';
RESET enable_seqscan;
DROP INDEX idem.claims_len;
DROP INDEX idem.claims_part;

-- a claim that fails while waiting leaves its store counted until the end of
-- the transaction; index definitions replaced meanwhile must not stay behind
BEGIN;
SELECT idem_claim('held', 'memtest');
PREPARE TRANSACTION 'idem_store_memory';
CREATE TEMP TABLE ctx0 AS
    SELECT count(*) AS n FROM pg_backend_memory_contexts WHERE name = 'idem store indexes';
BEGIN;
SET LOCAL lock_timeout = '10ms';
SAVEPOINT a;
SELECT idem_claim('held', 'memtest');
ROLLBACK TO a;
ANALYZE idem.claims;
SELECT idem_claim('b1', 'memtest');
SAVEPOINT b;
SELECT idem_claim('held', 'memtest');
ROLLBACK TO b;
ANALYZE idem.claims;
SELECT idem_claim('b2', 'memtest');
COMMIT;
SELECT idem_claim('b3', 'memtest');
SELECT count(*) <= (SELECT n FROM ctx0) AS index_contexts_bounded
  FROM pg_backend_memory_contexts WHERE name = 'idem store indexes';
ROLLBACK PREPARED 'idem_store_memory';
DELETE FROM idem.claims WHERE ns = 'memtest';
