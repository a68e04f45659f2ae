-- transactional outbox: send, lease, ack, nack, order per key, backoff,
-- dead letter and redrive, statistics, purge, bad input
\set VERBOSITY terse

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;
-- what a lease hands out, without ids and times
CREATE FUNCTION pg_temp.lease(relay text, n int DEFAULT 100, l interval DEFAULT '30 seconds')
RETURNS TABLE (topic text, key text, type text, payload jsonb, headers jsonb, attempt int)
LANGUAGE sql AS $$
    SELECT topic, key, type, payload, headers, attempt
      FROM idem_outbox_lease(relay, n, l) ORDER BY topic, key;
$$;
-- the id of a message, by its payload's "n"
CREATE FUNCTION pg_temp.id_of(n int) RETURNS uuid LANGUAGE sql AS $$
    SELECT id FROM idem.outbox WHERE (payload ->> 'n')::int = n;
$$;
CREATE FUNCTION pg_temp.keyrow(t text, k text) RETURNS text LANGUAGE sql AS $$
    SELECT format('dead=%s attempts=%s head=%s leased_by=%s error=%s', dead, attempts,
                  (SELECT (o.payload ->> 'n') FROM idem.outbox o WHERE o.id = head_id),
                  leased_by, last_error)
      FROM idem.outbox_keys WHERE topic = t AND key = k;
$$;

-- a send is a row of idem.outbox, with a uuid of version 8 that begins with its key's hash and seq
SELECT idem_outbox_send('orders', 'o-1', '{"n": 1}') IS NOT NULL AS sent;
SELECT aggregatetype, aggregateid, type, payload, headers,
       substr(id::text, 15, 1) AS uuid_version, created_at <= now() AS created
  FROM idem.outbox;
SELECT idem_outbox_send('orders', 'o-1', '{"n": 2}', '{"trace": "t-2"}', 'order.paid') IS NOT NULL AS sent;
SELECT idem_outbox_send('orders', 'o-1', '[3]') IS NOT NULL AS sent;
UPDATE idem.outbox SET payload = '{"n": 3}' WHERE payload = '[3]';
SELECT idem_outbox_send('orders', 'o-2', '{"n": 4}') IS NOT NULL AS sent;
SELECT idem_outbox_send('refunds', 'o-1', '{"n": 5}') IS NOT NULL AS sent;
-- an id is in its key's range, and a key's ids grow with seq
SELECT bool_and(id BETWEEN idem._outbox_id_bound(aggregatetype, aggregateid, false)
                       AND idem._outbox_id_bound(aggregatetype, aggregateid, true)) AS in_key_range,
       bool_and(key_hash = idem._outbox_key_hash(aggregatetype, aggregateid)) AS key_hashes
  FROM idem.outbox;
SELECT bool_and(a.id < b.id) AS by_seq
  FROM idem.outbox a JOIN idem.outbox b
    ON b.aggregatetype = a.aggregatetype AND b.aggregateid = a.aggregateid AND b.seq > a.seq;
-- ids order a key's messages by seq (every byte of seq compared in order),
-- whatever their random bits, and keys by key_hash, as signed integers: a
-- key's ids are one range
SELECT bool_and(idem._outbox_id('t', 'k', s) < idem._outbox_id('t', 'k', s + 1)) AS by_seq,
       bool_and(idem._outbox_id('t', 'k', s) BETWEEN idem._outbox_id_bound('t', 'k', false)
                                              AND idem._outbox_id_bound('t', 'k', true)) AS in_range
  FROM unnest(ARRAY[0, 1, 255, 1048575, 1048576, 4294967295, 4294967296,
                    140737488355327, 281474976710654]::int8[]) s, generate_series(1, 20) g;
-- the same key and seq make another id each time (random bits): ids that
-- another database, or the sequence started again, makes are not these
SELECT count(DISTINCT idem._outbox_id('t', 'k', 1)) AS distinct_ids FROM generate_series(1, 100);
SELECT bool_and(idem._outbox_id_bound('t', a.k, true) < idem._outbox_id_bound('t', b.k, false)) AS by_key_hash,
       count(*) FILTER (WHERE idem._outbox_key_hash('t', a.k) < 0) > 0 AS some_negative,
       count(*) FILTER (WHERE idem._outbox_key_hash('t', a.k) >= 0) > 0 AS some_positive
  FROM (SELECT 'k' || i AS k FROM generate_series(1, 40) i) a
  JOIN (SELECT 'k' || i AS k FROM generate_series(1, 40) i) b
    ON idem._outbox_key_hash('t', a.k) < idem._outbox_key_hash('t', b.k);
SELECT substr(idem._outbox_id('t', 'k', 0)::text, 15, 1) AS version,
       substr(idem._outbox_id('t', 'k', 0)::text, 20, 1) IN ('8', '9', 'a', 'b') AS variant,
       substr(idem._outbox_id_bound('t', 'k', true)::text, 15, 1) AS upper_version,
       substr(idem._outbox_id_bound('t', 'k', true)::text, 20, 1) AS upper_variant;
SELECT pg_temp.err($$SELECT idem._outbox_id('t', 'k', -1)$$);
SELECT pg_temp.err($$SELECT idem._outbox_id('t', 'k', 281474976710656)$$);
SELECT topic, key, dead, attempts FROM idem.outbox_keys ORDER BY topic, key;

-- one message per key: the oldest of each
SELECT * FROM pg_temp.lease('relay-a');
-- all leased: nothing more
SELECT * FROM pg_temp.lease('relay-b');
SELECT pg_temp.keyrow('orders', 'o-1');

-- ack: the next message of the key becomes its head
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of(1)]) AS acked;
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of(1)]) AS acked_again;
SELECT idem_outbox_ack(ARRAY[gen_random_uuid()]) AS unknown;
-- a message that was never leased is not acknowledged
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of(3)]) AS not_leased;
SELECT idem_outbox_ack(ARRAY[NULL::uuid]) AS null_element, idem_outbox_ack('{}') AS empty;
SELECT count(*) AS left FROM idem.outbox;
-- the ack leaves the key row as the lease wrote it (no write): the lease
-- ended with its message, and the next one is leased at once
SELECT pg_temp.keyrow('orders', 'o-1');
SELECT * FROM pg_temp.lease('relay-b');
-- several at once, some twice
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of(2), pg_temp.id_of(4), pg_temp.id_of(4), pg_temp.id_of(5)]) AS acked;
SELECT * FROM pg_temp.lease('relay-a');
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of(3)]) AS acked;
SELECT * FROM pg_temp.lease('relay-a');
SELECT count(*) AS left FROM idem.outbox;

-- order per key over many keys and messages, with batches smaller than the keys
SELECT count(idem_outbox_send('bulk', 'k' || (i % 7), jsonb_build_object('n', 100 + i)))
  FROM generate_series(1, 70) i;
CREATE TEMP TABLE delivered (n int, key text, batch int);
DO $$
DECLARE
    b int := 0;
    m record;
    ids uuid[];
BEGIN
    LOOP
        b := b + 1;
        ids := '{}';
        FOR m IN SELECT * FROM idem_outbox_lease('relay-a', 3) LOOP
            INSERT INTO delivered VALUES ((m.payload ->> 'n')::int, m.key, b);
            ids := ids || m.id;
        END LOOP;
        EXIT WHEN cardinality(ids) = 0;
        PERFORM idem_outbox_ack(ids);
    END LOOP;
END;
$$;
SELECT count(*) AS delivered, count(DISTINCT n) AS distinct_messages, max(batch) - 1 AS batches
  FROM delivered;
-- in each key, in the order of sending
SELECT count(*) AS out_of_order
  FROM (SELECT n, lag(n) OVER (PARTITION BY key ORDER BY batch) AS prev FROM delivered) d
 WHERE n < prev;
-- never two messages of one key in a batch
SELECT count(*) AS same_key_twice FROM (SELECT batch, key FROM delivered GROUP BY 1, 2 HAVING count(*) > 1) d;

-- a send that rolls back is never leased
BEGIN;
SELECT idem_outbox_send('orders', 'o-9', '{"n": 9}') IS NOT NULL AS sent;
ROLLBACK;
SELECT * FROM pg_temp.lease('relay-a');
-- nor a message of a savepoint rolled back
BEGIN;
SAVEPOINT s;
SELECT idem_outbox_send('orders', 'o-9', '{"n": 10}') IS NOT NULL AS sent;
ROLLBACK TO SAVEPOINT s;
SELECT idem_outbox_send('orders', 'o-9', '{"n": 11}') IS NOT NULL AS sent;
COMMIT;
SELECT * FROM pg_temp.lease('relay-a', 100, '10 milliseconds');

-- a lease that runs out: leased again, and the attempt counts
SELECT pg_sleep(0.05);
SELECT * FROM pg_temp.lease('relay-b');
SELECT pg_temp.keyrow('orders', 'o-9');
-- the first relay's late ack still delivers it
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of(11)]) AS late_ack;
SELECT * FROM pg_temp.lease('relay-b');

-- nack: retry_after exactly when given
SELECT idem_outbox_send('orders', 'o-20', '{"n": 20}') IS NOT NULL AS sent;
SELECT * FROM pg_temp.lease('relay-a');
CREATE TEMP TABLE t0 AS SELECT clock_timestamp() AS t;
SELECT idem_outbox_nack(pg_temp.id_of(20), 'broker down', '1 hour') AS nacked;
SELECT available_at - (SELECT t FROM t0) BETWEEN '1 hour' AND '1 hour 1 minute' AS in_an_hour
  FROM idem.outbox_keys WHERE key = 'o-20';
SELECT pg_temp.keyrow('orders', 'o-20');
SELECT * FROM pg_temp.lease('relay-a');
-- a nack of a message that is not leased does nothing
SELECT idem_outbox_nack(pg_temp.id_of(20), 'again') AS nacked_twice;
SELECT idem_outbox_nack(gen_random_uuid(), 'unknown') AS unknown;
-- retry at once
UPDATE idem.outbox_keys SET available_at = now() WHERE key = 'o-20';
SELECT * FROM pg_temp.lease('relay-a');
SELECT idem_outbox_nack(pg_temp.id_of(20), 'broker down', '0') AS nacked;
SELECT * FROM pg_temp.lease('relay-a');

-- backoff: base * 2^(attempt - 1), bounded by the maximum, jittered over its second half
SELECT idem_outbox_configure('payments', 5, '100 milliseconds', '300 milliseconds');
SELECT idem_outbox_send('payments', 'p-1', '{"n": 30}') IS NOT NULL AS sent;
CREATE TEMP TABLE waits (attempt int, longest interval, shortest interval);
DO $$
DECLARE
    m record;
    t0 timestamptz;
    t1 timestamptz;
BEGIN
    FOR i IN 1..4 LOOP
        UPDATE idem.outbox_keys SET available_at = now() WHERE key = 'p-1';
        SELECT * INTO m FROM idem_outbox_lease('relay-a') WHERE key = 'p-1';
        t0 := clock_timestamp();
        PERFORM idem_outbox_nack(m.id, 'timeout');
        t1 := clock_timestamp();
        INSERT INTO waits SELECT m.attempt, available_at - t0, available_at - t1
          FROM idem.outbox_keys WHERE key = 'p-1';
    END LOOP;
END;
$$;
-- attempt 1: 50 to 100 ms, 2: 100 to 200 ms, then 150 to 300 ms
SELECT attempt,
       longest >= (CASE attempt WHEN 1 THEN 50 WHEN 2 THEN 100 ELSE 150 END) * interval '1 ms'
       AND shortest <= (CASE attempt WHEN 1 THEN 100 WHEN 2 THEN 200 ELSE 300 END) * interval '1 ms'
           AS within_bounds
  FROM waits ORDER BY attempt;
-- the wait passes: leased again (attempt 5, the last)
SELECT pg_sleep(0.35);
SELECT * FROM pg_temp.lease('relay-a') WHERE key = 'p-1';

-- dead letter: the last attempt failed; the key's later messages are held back
SELECT idem_outbox_send('payments', 'p-1', '{"n": 31}') IS NOT NULL AS sent;
SELECT idem_outbox_nack(pg_temp.id_of(30), 'rejected') AS nacked;
SELECT pg_temp.keyrow('payments', 'p-1');
UPDATE idem.outbox_keys SET available_at = now() - interval '1 hour' WHERE key = 'p-1';
SELECT * FROM pg_temp.lease('relay-a') WHERE topic = 'payments';
SELECT topic, pending, leased, dead, held_back FROM idem_outbox_stats();
-- redrive: back to pending, attempts from the start
SELECT idem_outbox_redrive('payments', 'p-2') AS other_key;
SELECT idem_outbox_redrive('payments') AS redriven;
SELECT idem_outbox_redrive() AS nothing_left;
SELECT * FROM pg_temp.lease('relay-a') WHERE topic = 'payments';
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of(30)]) AS acked;
SELECT * FROM pg_temp.lease('relay-a') WHERE topic = 'payments';
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of(31)]) AS acked;

-- a lease that runs out on the last attempt kills the message too
SELECT idem_outbox_configure('short', 1, '1 second', '1 second');
SELECT idem_outbox_send('short', 's-1', '{"n": 40}') IS NOT NULL AS sent;
SELECT * FROM pg_temp.lease('relay-a', 10, '1 millisecond') WHERE topic = 'short';
SELECT pg_sleep(0.01);
SELECT * FROM pg_temp.lease('relay-a') WHERE topic = 'short';
SELECT pg_temp.keyrow('short', 's-1');
SELECT topic, pending, leased, dead FROM idem_outbox_stats() WHERE topic = 'short';
-- a late ack of a dead message still delivers it
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of(40)]) AS acked;
SELECT pg_temp.keyrow('short', 's-1');

-- statistics: pending, leased, dead and the age of the oldest pending message
SELECT idem_outbox_send('stats', 'a', '{"n": 50}') IS NOT NULL AS sent;
SELECT idem_outbox_send('stats', 'a', '{"n": 51}') IS NOT NULL AS sent;
SELECT idem_outbox_send('stats', 'b', '{"n": 52}') IS NOT NULL AS sent;
SELECT count(*) FROM idem_outbox_lease('relay-a', 1) WHERE topic = 'stats';
SELECT topic, pending, leased, dead, oldest_pending_age >= '0' AS age
  FROM idem_outbox_stats() WHERE topic = 'stats';

-- purge: the rows of keys without messages go; a key with messages stays
SELECT count(*) AS key_rows FROM idem.outbox_keys;
SELECT idem_outbox_purge() AS purged;
SELECT topic, key FROM idem.outbox_keys ORDER BY 1, 2;
-- a key sends again after its row was purged
SELECT idem_outbox_send('orders', 'o-1', '{"n": 60}') IS NOT NULL AS sent;
SELECT * FROM pg_temp.lease('relay-a') WHERE topic = 'orders';
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.err('SELECT idem_outbox_purge()');
ROLLBACK;

-- bad input: clear errors, nothing written
SELECT count(*) AS before FROM idem.outbox;
SELECT pg_temp.err($$SELECT idem_outbox_send(NULL, 'k', '{}')$$);
SELECT pg_temp.err($$SELECT idem_outbox_send('t', NULL, '{}')$$);
SELECT pg_temp.err($$SELECT idem_outbox_send('', 'k', '{}')$$);
SELECT pg_temp.err($$SELECT idem_outbox_send('t', '', '{}')$$);
SELECT pg_temp.err($$SELECT idem_outbox_send(repeat('t', 256), 'k', '{}')$$);
SELECT pg_temp.err($$SELECT idem_outbox_send('t', repeat('k', 1025), '{}')$$);
SELECT pg_temp.err($$SELECT idem_outbox_send('t', 'k', NULL)$$);
SELECT pg_temp.err($$SELECT idem_outbox_send('t', 'k', '42')$$);
SELECT pg_temp.err($$SELECT idem_outbox_send('t', 'k', 'null')$$);
SELECT pg_temp.err($$SELECT idem_outbox_send('t', 'k', '{}', '[1]')$$);
SELECT pg_temp.err($$SELECT idem_outbox_send('t', 'k', '{}', NULL, '')$$);
SELECT pg_temp.err($$SELECT idem_outbox_send('t', 'k', '{}', NULL, repeat('x', 256))$$);
SELECT count(*) AS after FROM idem.outbox;
-- the longest topic and key
SELECT idem_outbox_send(repeat('t', 255), repeat('k', 1024), '{}') IS NOT NULL AS longest;
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease(NULL)$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('')$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('r', 0)$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('r', 10001)$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('r', NULL)$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('r', 1, NULL)$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('r', 1, '0')$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('r', 1, '-1 second')$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('r', 1, '1 day 1 second')$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('r', 1, '25 hours')$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('r', 1, '1000000 days')$$);
SELECT pg_temp.err($$SELECT count(*) FROM idem_outbox_lease('r', 1, '24 hours') WHERE false$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('r', 1, '1 month')$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('r', 1, '1 day -1 hour')$$);
SELECT pg_temp.err($$SELECT idem_outbox_ack(NULL)$$);
SELECT pg_temp.err($$SELECT idem_outbox_ack('{{00000000-0000-0000-0000-000000000000}}')$$);
SELECT pg_temp.err($$SELECT idem_outbox_nack(NULL, 'e')$$);
SELECT pg_temp.err($$SELECT idem_outbox_nack(gen_random_uuid(), NULL)$$);
SELECT pg_temp.err($$SELECT idem_outbox_nack(gen_random_uuid(), 'e', '-1 second')$$);
SELECT pg_temp.err($$SELECT idem_outbox_nack(gen_random_uuid(), 'e', '2 days')$$);
SELECT pg_temp.err($$SELECT idem_outbox_nack(gen_random_uuid(), 'e', '24 hours 1 microsecond')$$);
SELECT pg_temp.err($$SELECT idem_outbox_nack(gen_random_uuid(), 'e', '1 day')$$);
SELECT pg_temp.err($$SELECT idem_outbox_configure(NULL, 1, '1 second', '1 second')$$);
SELECT pg_temp.err($$SELECT idem_outbox_configure('t', 0, '1 second', '1 second')$$);
SELECT pg_temp.err($$SELECT idem_outbox_configure('t', 1001, '1 second', '1 second')$$);
SELECT pg_temp.err($$SELECT idem_outbox_configure('t', 3, '0', '1 second')$$);
SELECT pg_temp.err($$SELECT idem_outbox_configure('t', 3, '2 seconds', '1 second')$$);
SELECT pg_temp.err($$SELECT idem_outbox_configure('t', 3, '1 second', '2 days')$$);
SELECT pg_temp.err($$SELECT idem_outbox_configure('t', 3, '1 second', '1 month')$$);
SELECT pg_temp.err($$SELECT idem_outbox_configure('t', 3, '1 second', '1 day -1 hour')$$);
SELECT pg_temp.err($$SELECT idem_outbox_configure('', 3, '1 second', '1 minute')$$);
SELECT pg_temp.err($$SELECT idem_outbox_redrive(NULL, 'k')$$);
SELECT pg_temp.err($$SELECT idem_outbox_purge(NULL)$$);
SELECT topic, max_attempts, backoff_base, backoff_max FROM idem.outbox_topics ORDER BY 1;
-- a long error is kept to its first 2000 bytes, on a character boundary
SELECT idem_outbox_send('long', 'l', '{"n": 70}') IS NOT NULL AS sent;
SELECT count(*) FROM idem_outbox_lease('relay-a') WHERE topic = 'long';
SELECT idem_outbox_nack(pg_temp.id_of(70), repeat('é', 1500)) AS nacked;
SELECT octet_length(last_error), char_length(last_error) FROM idem.outbox_keys WHERE topic = 'long';

-- in a read-only transaction: refused as an INSERT would be, every
-- function that writes, also with nothing to write (an empty ack, an
-- unknown id); the ack and the nack are also given a leased message
BEGIN READ ONLY;
SELECT pg_temp.err($$SELECT idem_outbox_send('t', 'k', '{}')$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('r')$$);
SELECT pg_temp.err(format('SELECT idem_outbox_ack(%L)', ARRAY[pg_temp.id_of(50)]));
SELECT pg_temp.err($$SELECT idem_outbox_ack('{}')$$);
SELECT pg_temp.err(format('SELECT idem_outbox_nack(%L, %L)', pg_temp.id_of(50), 'e'));
SELECT pg_temp.err($$SELECT idem_outbox_nack(gen_random_uuid(), 'e', '0')$$);
SELECT pg_temp.err($$SELECT idem_outbox_redrive()$$);
SELECT pg_temp.err($$SELECT idem_outbox_redrive('stats', 'a')$$);
SELECT pg_temp.err($$SELECT idem_outbox_configure('stats', 3, '1 second', '1 minute')$$);
SELECT pg_temp.err($$SELECT idem_outbox_purge()$$);
SELECT pg_temp.err($$SELECT idem_outbox_purge('0', 1)$$);
ROLLBACK;

-- a failure that is permanent (the receiver refused the message itself): dead at once
SELECT idem_outbox_send('perm', 'p', '{"n": 80}') IS NOT NULL AS sent;
SELECT count(*) FROM idem_outbox_lease('relay-a') WHERE topic = 'perm';
SELECT idem_outbox_nack(pg_temp.id_of(80), 'HTTP 400', permanent => true) AS nacked;
SELECT pg_temp.keyrow('perm', 'p');
SELECT pg_temp.err($$SELECT idem_outbox_nack(gen_random_uuid(), 'e', NULL, NULL, NULL)$$);

-- purge in batches: at most max_rows key rows per call, until none is left;
-- the maintenance round passes its max_rows on
BEGIN;
DELETE FROM idem.outbox_keys k
 WHERE NOT EXISTS (SELECT 1 FROM idem.outbox o WHERE o.aggregatetype = k.topic AND o.aggregateid = k.key);
INSERT INTO idem.outbox_keys (topic, key, dead, attempts, available_at)
SELECT 'batch', 'b-' || i, false, 0, now() FROM generate_series(1, 7) i;
SELECT idem_outbox_purge('0', 3) AS purged;
SELECT count(*) AS idle_left FROM idem.outbox_keys WHERE topic = 'batch';
SELECT purged FROM idem_maintenance(3) WHERE kind = 'outbox_keys';
ROLLBACK;
-- READ UNCOMMITTED is READ COMMITTED in PostgreSQL: the round purges them too
BEGIN ISOLATION LEVEL READ UNCOMMITTED;
DELETE FROM idem.outbox_keys k
 WHERE NOT EXISTS (SELECT 1 FROM idem.outbox o WHERE o.aggregatetype = k.topic AND o.aggregateid = k.key);
INSERT INTO idem.outbox_keys (topic, key, dead, attempts, available_at)
SELECT 'batch', 'b-' || i, false, 0, now() FROM generate_series(1, 7) i;
SELECT idem_outbox_purge('0', 3) AS purged;
SELECT purged FROM idem_maintenance(3) WHERE kind = 'outbox_keys';
SELECT idem_outbox_purge(max_rows => 3) AS purged;
SELECT idem_outbox_purge('0', 3) AS purged;
SELECT count(*) AS idle_left FROM idem.outbox_keys WHERE topic = 'batch';
ROLLBACK;
SELECT pg_temp.err($$SELECT idem_outbox_purge('0', NULL)$$);
SELECT pg_temp.err($$SELECT idem_outbox_purge('0', 0)$$);

-- the keys that have waited longest first: the ack of a head leased alone
-- writes no key row, and its key counts as waiting since that lease began
DELETE FROM idem.outbox;
DELETE FROM idem.outbox_keys;
SELECT idem_outbox_send('fair', 'a', '{"n": 901}') IS NOT NULL AS sent;
SELECT * FROM pg_temp.lease('fair-relay', 1, '1 hour');
SELECT idem_outbox_send('fair', 'a', '{"n": 902}') IS NOT NULL AS sent;
SELECT idem_outbox_send('fair', 'b', '{"n": 903}') IS NOT NULL AS sent;
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of(901)]) AS acked;
SELECT * FROM pg_temp.lease('fair-relay', 1, '1 hour');
SELECT * FROM pg_temp.lease('fair-relay', 1, '1 hour');
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of(902), pg_temp.id_of(903)]) AS acked;
SELECT count(*) AS left FROM idem.outbox;

-- a message that failed once, then delivered: its ack writes the key's row,
-- and the error goes with the message
SELECT idem_outbox_send('fair', 'c', '{"n": 904}') IS NOT NULL AS sent;
SELECT * FROM pg_temp.lease('fair-relay', 10, '1 hour');
SELECT idem_outbox_nack(pg_temp.id_of(904), 'HTTP 503', '0') AS nacked;
SELECT * FROM pg_temp.lease('fair-relay', 10, '1 hour');
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of(904)]) AS acked;
SELECT pg_temp.keyrow('fair', 'c');
