-- A lease among many keys whose messages were all delivered (their rows
-- stay until idem_outbox_purge) and a backlog too long for the index of
-- heads: the pass scans the key rows, a bounded set of candidates per
-- round.  Seeking the head of every idle key took a round per set, each
-- reading every key row (seconds per lease with 50,000 idle keys); once they
-- outnumber the index's pages the pass skips them.  The work is counted in
-- buffers, which do not depend on the machine's speed: here about 18,000
-- (the first lease seeks the head of every idle key once), 61,000 before.
\set VERBOSITY terse

-- 5,000 keys, delivered
SELECT count(idem_outbox_send('idle', 'k' || g, '{}')) AS sent FROM generate_series(1, 5000) g;
SELECT idem_outbox_ack(array_agg(id)) AS delivered FROM idem_outbox_lease('r0', 10000, '1 hour');
-- then one key with 5,000 messages, whose row is younger than the others
SELECT pg_sleep(0.01);
SELECT count(idem_outbox_send('idle', 'hot', '{}')) AS sent FROM generate_series(1, 5000) g;

CREATE FUNCTION lease_buffers(n int) RETURNS TABLE (leased bigint, buffers bigint) LANGUAGE plpgsql AS $$
DECLARE
    plan json;
BEGIN
    EXECUTE format('EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM idem_outbox_lease(%L, %s, %L)',
                   'r1', n, '1 hour') INTO plan;
    leased := (plan->0->'Plan'->>'Actual Rows')::bigint;
    buffers := (plan->0->'Plan'->>'Shared Hit Blocks')::bigint
             + (plan->0->'Plan'->>'Shared Read Blocks')::bigint;
    RETURN NEXT;
END;
$$;

-- a new session: its first lease tries the primary key of idem.outbox and gives up
\c
SELECT leased, buffers < 30000 AS bounded FROM lease_buffers(1);
SELECT leased, buffers < 30000 AS bounded FROM lease_buffers(1);

DROP FUNCTION lease_buffers(int);
DELETE FROM idem.outbox WHERE aggregatetype = 'idle';
DELETE FROM idem.outbox_keys WHERE topic = 'idle';
-- the tables' size sets how a lease reads them: back to what it was
VACUUM idem.outbox, idem.outbox_keys;
