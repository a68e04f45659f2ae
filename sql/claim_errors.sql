-- consumer dedup: misuse of the claim functions, with the SQLSTATE of each
-- error
\set VERBOSITY terse

-- err(query): the SQLSTATE and message of the error the query raises
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

--
-- msg_id: NULL is 22004, empty is 22023, more than 512 bytes is 22001
--
SELECT pg_temp.err($$SELECT idem_claim(NULL)$$);
SELECT pg_temp.err($$SELECT idem_claim(NULL, 'ce')$$);
SELECT pg_temp.err($$SELECT idem_claim('')$$);
SELECT pg_temp.err($$SELECT idem_claim(repeat('k', 513))$$);
SELECT pg_temp.err($$SELECT idem_claim(repeat('é', 257))$$);
SELECT pg_temp.err($$SELECT idem_claim(repeat('k', 1024 * 1024))$$);
SELECT pg_temp.err($$SELECT idem_try_claim(NULL)$$);
SELECT pg_temp.err($$SELECT idem_try_claim('')$$);
SELECT pg_temp.err($$SELECT idem_try_claim(repeat('k', 513))$$);
SELECT pg_temp.err($$SELECT idem_claim_info(NULL)$$);
SELECT pg_temp.err($$SELECT idem_claim_info('')$$);
SELECT pg_temp.err($$SELECT idem_claim_info(repeat('k', 513))$$);
SELECT pg_temp.err($$SELECT idem_release(NULL)$$);
SELECT pg_temp.err($$SELECT idem_release('')$$);
SELECT pg_temp.err($$SELECT idem_release(repeat('k', 513))$$);

--
-- ns: NULL is 22004, empty is 22023, more than 63 bytes is 22001
--
SELECT pg_temp.err($$SELECT idem_claim('ce_1', NULL)$$);
SELECT pg_temp.err($$SELECT idem_claim('ce_1', '')$$);
SELECT pg_temp.err($$SELECT idem_claim('ce_1', repeat('n', 64))$$);
SELECT pg_temp.err($$SELECT idem_claim('ce_1', repeat('é', 32))$$);
SELECT pg_temp.err($$SELECT idem_try_claim('ce_1', NULL)$$);
SELECT pg_temp.err($$SELECT idem_try_claim('ce_1', '')$$);
SELECT pg_temp.err($$SELECT idem_try_claim('ce_1', repeat('n', 64))$$);
SELECT pg_temp.err($$SELECT idem_claim_info('ce_1', NULL)$$);
SELECT pg_temp.err($$SELECT idem_claim_info('ce_1', '')$$);
SELECT pg_temp.err($$SELECT idem_claim_info('ce_1', repeat('n', 64))$$);
SELECT pg_temp.err($$SELECT idem_release('ce_1', NULL)$$);
SELECT pg_temp.err($$SELECT idem_release('ce_1', '')$$);
SELECT pg_temp.err($$SELECT idem_release('ce_1', repeat('n', 64))$$);
-- the msg_id is checked first
SELECT pg_temp.err($$SELECT idem_claim(NULL, NULL)$$);
SELECT pg_temp.err($$SELECT idem_claim('', repeat('n', 64))$$);

--
-- idem_claim_batch: NULL array or element is 22004, an array of more than
-- one dimension is 2202E, each element is checked like a msg_id
--
SELECT pg_temp.err($$SELECT idem_claim_batch(NULL)$$);
SELECT pg_temp.err($$SELECT idem_claim_batch(NULL::text[], 'ce')$$);
SELECT pg_temp.err($$SELECT idem_claim_batch(ARRAY[NULL]::text[])$$);
SELECT pg_temp.err($$SELECT idem_claim_batch(ARRAY['ce_b1', NULL, 'ce_b3'])$$);
SELECT pg_temp.err($$SELECT idem_claim_batch(ARRAY['ce_b1', ''])$$);
SELECT pg_temp.err($$SELECT idem_claim_batch(ARRAY['ce_b1', repeat('k', 513)])$$);
SELECT pg_temp.err($$SELECT idem_claim_batch(ARRAY[['ce_b1', 'ce_b2'], ['ce_b3', 'ce_b4']])$$);
SELECT pg_temp.err($$SELECT idem_claim_batch('{{{ce_b1}}}'::text[])$$);
SELECT pg_temp.err($$SELECT idem_claim_batch(ARRAY['ce_b1'], NULL)$$);
SELECT pg_temp.err($$SELECT idem_claim_batch(ARRAY['ce_b1'], '')$$);
SELECT pg_temp.err($$SELECT idem_claim_batch(ARRAY['ce_b1'], repeat('n', 64))$$);
-- the namespace is checked even when the array is empty
SELECT pg_temp.err($$SELECT idem_claim_batch('{}', NULL)$$);
SELECT pg_temp.err($$SELECT idem_claim_batch('{}', '')$$);

--
-- no such function: wrong types and wrong number of arguments (42883)
--
SELECT pg_temp.err($$SELECT idem_claim(1)$$);
SELECT pg_temp.err($$SELECT idem_claim()$$);
SELECT pg_temp.err($$SELECT idem_claim('ce_1', 'ce', 'extra')$$);
SELECT pg_temp.err($$SELECT idem_claim_batch(ARRAY[1, 2])$$);
SELECT pg_temp.err($$SELECT idem_claim_batch('ce_b1'::text)$$);

--
-- the errors as a client sees them, with their detail and hint
--
\set VERBOSITY default
SELECT idem_claim(repeat('k', 600));
SELECT idem_claim('ce_1', repeat('n', 70));
SELECT idem_claim('');
SELECT idem_claim_batch(ARRAY['ce_b1', NULL]);
-- an empty or too long element is named as a null one is
SELECT idem_claim_batch(ARRAY['ce_b1', 'ce_b2', '']);
SELECT idem_claim_batch(ARRAY['ce_b1', repeat('k', 513)]);
SELECT idem_claim_batch(NULL);
SELECT idem_claim_batch(ARRAY[['ce_b1'], ['ce_b2']]);
\set VERBOSITY terse

--
-- nothing is written by a call that fails: not even the valid elements of
-- a batch that come before the bad one.  In a fresh transaction, a call
-- that had inserted a row would have been given a transaction id and
-- counted an insertion into idem.claims, even if rolled back.
--
BEGIN;
SELECT pg_temp.err($$SELECT idem_claim_batch(ARRAY['ce_w1', 'ce_w2', NULL, 'ce_w4'])$$);
SELECT pg_temp.err($$SELECT idem_claim_batch(ARRAY['ce_w1', 'ce_w2', repeat('k', 513)])$$);
SELECT pg_temp.err($$SELECT idem_claim_batch(ARRAY['ce_w1', 'ce_w2', ''])$$);
SELECT pg_temp.err($$SELECT idem_claim_batch(ARRAY['ce_w1'], '')$$);
SELECT pg_temp.err($$SELECT idem_claim('ce_w1', repeat('n', 64))$$);
SELECT txid_current_if_assigned() IS NULL AS no_xid,
       pg_stat_get_xact_tuples_inserted('idem.claims'::regclass) AS inserted;
-- the probe above can fail: a good batch does both
SELECT idem_claim_batch(ARRAY['ce_w5', 'ce_w6']);
SELECT txid_current_if_assigned() IS NULL AS no_xid,
       pg_stat_get_xact_tuples_inserted('idem.claims'::regclass) AS inserted;
COMMIT;
SELECT idem_claim_info('ce_w1') IS NULL AS w1_free, idem_claim_info('ce_w2') IS NULL AS w2_free,
       idem_claim_info('ce_w5') IS NOT NULL AS w5_held;
SELECT idem_claim_batch(ARRAY['ce_w1', 'ce_w2', 'ce_w5']);

-- an error after a claim in the same transaction takes the claim with it
BEGIN;
SELECT idem_claim('ce_w7');
SELECT idem_claim('ce_w8', '');
COMMIT;
SELECT idem_claim('ce_w7');

-- a failing call leaves the claims made before it in the same statement
-- uncommitted, and the statement rolls them back (the failing call is made
-- only once the claim was)
SELECT pg_temp.err($$SELECT CASE WHEN idem_claim('ce_w9') THEN idem_claim(NULL) END$$);
SELECT idem_claim_info('ce_w9') IS NULL AS w9_free;
SELECT idem_claim('ce_w9') AS w9_claimed_again;

-- more ids than one batch takes (NULLs count: the array is refused whole)
SELECT pg_temp.err($$SELECT idem_claim_batch(array_fill(NULL::text, ARRAY[10000001]))$$);
