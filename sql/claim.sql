-- consumer dedup: every outcome of idem_claim, idem_try_claim,
-- idem_claim_batch, idem_claim_info and idem_release
\set VERBOSITY terse

-- err(query): the SQLSTATE and message of the error the query raises
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS OR query_canceled THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- The message ids of this file start with "c_" and its namespaces with
-- "claim_", so that other files sharing the database do not interfere.

--
-- idem_claim: true for the first claim, false for every later one
--
SELECT idem_claim('c_m1');
SELECT idem_claim('c_m1');
SELECT idem_claim('c_m1');
-- the default namespace is called 'default'
SELECT idem_claim('c_m1', 'default');
SELECT idem_claim('c_m2', 'default'), idem_claim('c_m2');
-- two claims of one id in one statement: the second sees the first
SELECT idem_claim('c_m3') AS first, idem_claim('c_m3') AS second;
-- keys are compared byte for byte: case, spaces and accents all count
SELECT idem_claim('c_case'), idem_claim('C_CASE'), idem_claim('c_case '),
       idem_claim(' c_case'), idem_claim('c_case');
-- the row is what the table shows
SELECT ns, msg_id FROM idem.claims WHERE msg_id LIKE 'c\_m%' ORDER BY ns, msg_id;

--
-- namespaces isolate keys
--
SELECT idem_claim('c_shared', 'claim_a') AS a,
       idem_claim('c_shared', 'claim_b') AS b,
       idem_claim('c_shared', 'CLAIM_A') AS upper_a,
       idem_claim('c_shared') AS dflt;
SELECT idem_claim('c_shared', 'claim_a') AS a,
       idem_claim('c_shared', 'claim_b') AS b,
       idem_claim('c_shared', 'CLAIM_A') AS upper_a,
       idem_claim('c_shared') AS dflt;
-- releasing in one namespace leaves the others alone
SELECT idem_release('c_shared', 'claim_a');
SELECT idem_claim_info('c_shared', 'claim_a') IS NULL AS a_free,
       idem_claim_info('c_shared', 'claim_b') IS NOT NULL AS b_held,
       idem_claim_info('c_shared') IS NOT NULL AS default_held;
SELECT idem_claim('c_shared', 'claim_a') AS a, idem_claim('c_shared', 'claim_b') AS b;

--
-- idem_try_claim: claimed, duplicate (in_flight is below, with a
-- prepared transaction)
--
SELECT idem_try_claim('c_t1');
SELECT idem_try_claim('c_t1');
SELECT idem_try_claim('c_t1', 'claim_try');
SELECT pg_typeof(idem_try_claim('c_t2'));
SELECT idem_try_claim('c_t2') = 'duplicate'::idem_claim_result AS is_duplicate;
-- try_claim and claim share their rows
SELECT idem_claim('c_t1'), idem_try_claim('c_m1');
SELECT * FROM idem_try_claim('c_t3');

--
-- idem_claim_info: when, or NULL
--
SELECT idem_claim_info('c_never') IS NULL AS unclaimed;
SELECT idem_claim_info('c_m1', 'claim_other') IS NULL AS other_ns;
SELECT pg_typeof(idem_claim_info('c_m1'));
-- claimed_at is the claiming transaction's now(), in that transaction and
-- after it committed; a duplicate claim leaves it unchanged
BEGIN;
SELECT idem_claim('c_when');
SELECT idem_claim_info('c_when') = now() AS is_now;
SELECT claimed_at = now() AS row_is_now FROM idem.claims
 WHERE ns = 'default' AND msg_id = 'c_when';
CREATE TEMP TABLE claim_time AS SELECT now() AS at;
COMMIT;
SELECT pg_sleep(0.01);
BEGIN;
SELECT idem_claim('c_when');
SELECT idem_claim_info('c_when') = (SELECT at FROM claim_time) AS kept,
       idem_claim_info('c_when') < now() AS before_this_txn;
COMMIT;
-- an id claimed by this transaction is seen by idem_claim_info
BEGIN;
SELECT idem_claim_info('c_inside') IS NULL AS before;
SELECT idem_claim('c_inside');
SELECT idem_claim_info('c_inside') IS NOT NULL AS after;
ROLLBACK;

--
-- idem_release: true if a claim was deleted
--
SELECT idem_release('c_never');
SELECT idem_claim('c_r1');
SELECT idem_release('c_r1');
SELECT idem_release('c_r1');
SELECT idem_claim_info('c_r1') IS NULL AS released;
SELECT idem_claim('c_r1') AS claimable_again;
SELECT idem_release('c_r1', 'claim_other') AS other_ns;
SELECT idem_claim('c_r1') AS still_held;

--
-- claim, release and claim again: in one statement and in one transaction
--
SELECT idem_claim('c_crc1') AS claim, idem_release('c_crc1') AS release,
       idem_claim('c_crc1') AS claim_again, idem_release('c_crc1') AS release_again,
       idem_release('c_crc1') AS release_nothing, idem_claim('c_crc1') AS last_claim;
SELECT idem_claim('c_crc1') AS committed_claim_holds;
SELECT count(*) FROM idem.claims WHERE ns = 'default' AND msg_id = 'c_crc1';
BEGIN;
SELECT idem_claim('c_crc2');
SELECT idem_release('c_crc2');
SELECT idem_claim_info('c_crc2') IS NULL AS gone;
SELECT idem_claim('c_crc2');
SELECT idem_claim('c_crc2');
COMMIT;
SELECT idem_claim('c_crc2'), idem_claim_info('c_crc2') IS NOT NULL AS held;
-- release of a committed claim, then claim, in one transaction
BEGIN;
SELECT idem_release('c_crc2'), idem_claim('c_crc2'), idem_try_claim('c_crc2');
COMMIT;
SELECT count(*) FROM idem.claims WHERE ns = 'default' AND msg_id = 'c_crc2';

--
-- a rolled-back transaction releases its claims
--
BEGIN;
SELECT idem_claim('c_rb1'), idem_try_claim('c_rb2'),
       idem_claim_batch(ARRAY['c_rb3', 'c_rb4']);
ROLLBACK;
SELECT idem_claim_info('c_rb1') IS NULL AS rb1, idem_claim_info('c_rb2') IS NULL AS rb2,
       idem_claim_info('c_rb3') IS NULL AS rb3, idem_claim_info('c_rb4') IS NULL AS rb4;
SELECT idem_claim('c_rb1'), idem_try_claim('c_rb2'),
       idem_claim_batch(ARRAY['c_rb3', 'c_rb4']);
-- a transaction that fails is rolled back too
BEGIN;
SELECT idem_claim('c_rb5');
SELECT 1 / 0;
ROLLBACK;
SELECT idem_claim('c_rb5');
-- a rolled-back release restores the claim
BEGIN;
SELECT idem_release('c_rb5');
ROLLBACK;
SELECT idem_claim('c_rb5') AS still_held;

--
-- ROLLBACK TO SAVEPOINT releases what was claimed after the savepoint and
-- keeps what was claimed before it
--
BEGIN;
SELECT idem_claim('c_sp1');
SAVEPOINT s1;
SELECT idem_claim('c_sp2'), idem_claim_batch(ARRAY['c_sp3']);
SAVEPOINT s2;
SELECT idem_claim('c_sp4');
ROLLBACK TO SAVEPOINT s1;
SELECT idem_claim_info('c_sp1') IS NOT NULL AS sp1_kept,
       idem_claim_info('c_sp2') IS NULL AS sp2_released,
       idem_claim_info('c_sp3') IS NULL AS sp3_released,
       idem_claim_info('c_sp4') IS NULL AS sp4_released;
SELECT idem_claim('c_sp1') AS sp1, idem_claim('c_sp2') AS sp2;
COMMIT;
SELECT msg_id FROM idem.claims WHERE ns = 'default' AND msg_id LIKE 'c\_sp%' ORDER BY msg_id;
-- RELEASE SAVEPOINT keeps the claims of the subtransaction
BEGIN;
SAVEPOINT s1;
SELECT idem_claim('c_sp5');
RELEASE SAVEPOINT s1;
COMMIT;
SELECT idem_claim('c_sp5');
-- a savepoint rolled back after an error keeps the earlier claims
BEGIN;
SELECT idem_claim('c_sp6');
SAVEPOINT s1;
SELECT idem_claim('c_sp7');
SELECT idem_claim(NULL);
ROLLBACK TO SAVEPOINT s1;
SELECT idem_claim('c_sp6') AS sp6, idem_claim('c_sp7') AS sp7;
COMMIT;
-- a release rolled back to a savepoint restores the claim
BEGIN;
SAVEPOINT s1;
SELECT idem_release('c_sp6');
SELECT idem_claim_info('c_sp6') IS NULL AS released_inside;
ROLLBACK TO SAVEPOINT s1;
SELECT idem_claim_info('c_sp6') IS NOT NULL AS restored;
SELECT idem_claim('c_sp6') AS duplicate_again;
COMMIT;

--
-- idem_claim_batch: one result per element, in order
--
SELECT idem_claim_batch(ARRAY['c_b1', 'c_b2', 'c_b1', 'c_b3', 'c_b2', 'c_b1']);
SELECT idem_claim_batch(ARRAY['c_b1', 'c_b4', 'c_b4', 'c_m1']);
-- claimed in key order, answered in the array's: the first occurrence wins
SELECT idem_claim_batch(ARRAY['c_o9', 'c_o10', 'c_o1', 'c_o10', 'c_o', 'c_o1']);
SELECT idem_claim_batch(ARRAY['c_b1', 'c_b4'], 'claim_batch');
SELECT idem_claim_batch(ARRAY['c_b1', 'c_b4'], 'claim_batch');
SELECT idem_claim_batch('{}');
SELECT idem_claim_batch('{}', 'claim_batch');
SELECT idem_claim_batch(ARRAY['c_b5']);
-- an array with other bounds: the results keep its subscripts, as an array cast does
SELECT idem_claim_batch('[0:2]={c_b6,c_b7,c_b6}'::text[]);
-- elements claimed by a batch are claims like any other
SELECT idem_claim('c_b5'), idem_try_claim('c_b6'), idem_release('c_b7');
SELECT idem_claim_batch(ARRAY['c_b5', 'c_b6', 'c_b7']);
-- a batch of 100,000 ids in one call
SELECT count(*) FILTER (WHERE x) AS claimed, count(*) FILTER (WHERE NOT x) AS duplicates
  FROM unnest(idem_claim_batch(
        ARRAY(SELECT 'b' || g FROM generate_series(1, 100000) g), 'claim_big')) x;
SELECT count(*) FILTER (WHERE x) AS claimed, count(*) FILTER (WHERE NOT x) AS duplicates
  FROM unnest(idem_claim_batch(
        ARRAY(SELECT 'b' || g FROM generate_series(1, 100000) g), 'claim_big')) x;
SELECT count(*) FROM idem.claims WHERE ns = 'claim_big';
-- half new, half old, in one call
SELECT count(*) FILTER (WHERE x) AS claimed, count(*) FILTER (WHERE NOT x) AS duplicates
  FROM unnest(idem_claim_batch(
        ARRAY(SELECT 'b' || g FROM generate_series(50001, 150000) g), 'claim_big')) x;
-- the order of the results is the order of the ids
SELECT idem_claim_batch(ARRAY(SELECT 'b' || g FROM generate_series(149996, 150005) g), 'claim_big');

--
-- key sizes: 512 bytes of msg_id and 63 bytes of ns are accepted
--
SELECT idem_claim(repeat('k', 512), repeat('n', 63));
SELECT idem_claim(repeat('k', 512), repeat('n', 63));
SELECT idem_try_claim(repeat('k', 512), repeat('n', 63)),
       idem_claim_info(repeat('k', 512), repeat('n', 63)) IS NOT NULL AS held,
       idem_claim_batch(ARRAY[repeat('k', 512), repeat('j', 512)], repeat('n', 63));
SELECT octet_length(msg_id), octet_length(ns) FROM idem.claims
 WHERE ns = repeat('n', 63) ORDER BY msg_id;
SELECT idem_release(repeat('k', 512), repeat('n', 63));
-- limits are in bytes: 256 two-byte characters are 512 bytes
SELECT idem_claim(repeat('é', 256), repeat('é', 31) || 'n');
SELECT idem_claim(repeat('é', 256), repeat('é', 31) || 'n');
-- a one-byte key
SELECT idem_claim('x', 'y'), idem_claim('x', 'y');

--
-- multibyte UTF-8 keys
--
SELECT idem_claim('c_日本語', 'claim_名前'), idem_claim('c_日本語', 'claim_名前');
SELECT idem_claim('c_🎉', 'claim_🎉'), idem_try_claim('c_🎉', 'claim_🎉');
-- composed and decomposed forms are different keys
SELECT idem_claim(U&'c_\00E9'), idem_claim(U&'c_e\0301'), idem_claim(U&'c_\00E9');
SELECT msg_id, octet_length(msg_id) FROM idem.claims
 WHERE ns = 'claim_名前' OR ns = 'claim_🎉' ORDER BY ns, msg_id;
SELECT idem_release('c_日本語', 'claim_名前'), idem_claim_info('c_日本語', 'claim_名前') IS NULL;

--
-- a claim in a loop: PL/pgSQL keeps its plans, and so does PREPARE
--
CREATE FUNCTION pg_temp.claim_loop(prefix text, n int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    firsts int := 0;
BEGIN
    FOR i IN 1..n LOOP
        IF idem_claim(prefix || i, 'claim_loop') THEN
            firsts := firsts + 1;
        END IF;
        -- the same id again in the same transaction is a duplicate
        IF idem_claim(prefix || i, 'claim_loop') THEN
            RAISE EXCEPTION 'second claim of % was not a duplicate', prefix || i;
        END IF;
    END LOOP;
    RETURN firsts;
END $$;
SELECT pg_temp.claim_loop('c_l', 1000);
SELECT pg_temp.claim_loop('c_l', 1000);
SELECT pg_temp.claim_loop('c_l', 1010);
SELECT count(*) FROM idem.claims WHERE ns = 'claim_loop';
SET plan_cache_mode = force_generic_plan;
PREPARE claim_stmt(text) AS SELECT idem_claim($1, 'claim_prep');
PREPARE try_stmt(text) AS SELECT idem_try_claim($1, 'claim_prep');
EXECUTE claim_stmt('c_p1');
EXECUTE claim_stmt('c_p1');
EXECUTE claim_stmt('c_p2');
EXECUTE try_stmt('c_p2');
EXECUTE try_stmt('c_p3');
EXECUTE try_stmt('c_p3');
DEALLOCATE claim_stmt;
DEALLOCATE try_stmt;
RESET plan_cache_mode;

--
-- a read-only transaction refuses claims and releases (25006) but can read
--
SELECT idem_claim('c_ro1');
BEGIN;
SET TRANSACTION READ ONLY;
SELECT idem_claim_info('c_ro1') IS NOT NULL AS held,
       idem_claim_info('c_ro2') IS NULL AS free;
SELECT pg_temp.err($$SELECT idem_claim('c_ro2')$$) AS claim;
SELECT pg_temp.err($$SELECT idem_try_claim('c_ro2')$$) AS try_claim;
SELECT pg_temp.err($$SELECT idem_claim_batch(ARRAY['c_ro2'])$$) AS batch;
SELECT pg_temp.err($$SELECT idem_release('c_ro1')$$) AS release;
-- a duplicate is refused too: the call is a write
SELECT pg_temp.err($$SELECT idem_claim('c_ro1')$$) AS duplicate_claim;
SELECT idem_claim_info('c_ro1') IS NOT NULL AS still_readable;
COMMIT;
SET default_transaction_read_only = on;
SELECT pg_temp.err($$SELECT idem_claim('c_ro2')$$) AS claim;
RESET default_transaction_read_only;
SELECT idem_claim_info('c_ro1') IS NOT NULL AS ro1_held,
       idem_claim_info('c_ro2') IS NULL AS ro2_free;

--
-- an uncommitted claim of another transaction: a prepared transaction
-- holds it
--
BEGIN;
SELECT idem_claim('c_pt1'), idem_claim('c_pt2'), idem_claim('c_pt3');
PREPARE TRANSACTION 'idem_claim_pt';
-- never waits: in flight, and not visible to idem_claim_info
SELECT idem_try_claim('c_pt1');
SELECT idem_claim_info('c_pt1') IS NULL AS not_visible;
-- idem_claim waits like a unique index, and gives up on lock_timeout
SET lock_timeout = '10ms';
SELECT pg_temp.err($$SELECT idem_claim('c_pt1')$$) AS claim;
SELECT pg_temp.err($$SELECT idem_claim_batch(ARRAY['c_pt_free', 'c_pt2'])$$) AS batch;
SELECT pg_temp.err($$SELECT idem_release('c_pt3')$$) AS release;
RESET lock_timeout;
SET statement_timeout = '250ms';
SELECT pg_temp.err($$SELECT idem_claim('c_pt1')$$) AS claim;
RESET statement_timeout;
-- the batch that timed out claimed nothing
SELECT idem_claim_info('c_pt_free') IS NULL AS batch_undone;
-- other ids are not held up
SELECT idem_claim('c_pt4'), idem_try_claim('c_pt5');
COMMIT PREPARED 'idem_claim_pt';
-- committed: duplicates now
SELECT idem_try_claim('c_pt1'), idem_claim('c_pt2'), idem_claim_info('c_pt3') IS NOT NULL AS held;
-- the same with an abort: the ids are free again
BEGIN;
SELECT idem_claim('c_pt6');
PREPARE TRANSACTION 'idem_claim_pt';
SELECT idem_try_claim('c_pt6');
ROLLBACK PREPARED 'idem_claim_pt';
SELECT idem_claim_info('c_pt6') IS NULL AS free;
SELECT idem_try_claim('c_pt6'), idem_claim('c_pt6');
-- an uncommitted release is in flight too; the claim stays visible
BEGIN;
SELECT idem_release('c_pt6');
PREPARE TRANSACTION 'idem_claim_pt';
SELECT idem_try_claim('c_pt6');
SELECT idem_claim_info('c_pt6') IS NOT NULL AS still_visible;
SET lock_timeout = '10ms';
SELECT pg_temp.err($$SELECT idem_claim('c_pt6')$$) AS claim;
RESET lock_timeout;
ROLLBACK PREPARED 'idem_claim_pt';
SELECT idem_try_claim('c_pt6');
BEGIN;
SELECT idem_release('c_pt6');
PREPARE TRANSACTION 'idem_claim_pt';
SELECT idem_try_claim('c_pt6');
COMMIT PREPARED 'idem_claim_pt';
SELECT idem_try_claim('c_pt6');
SELECT count(*) FROM pg_prepared_xacts;
