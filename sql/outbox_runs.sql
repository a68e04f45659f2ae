-- idem_outbox_lease(..., per_key): a key's consecutive messages in one
-- lease (a run), the ack that releases the key, a nack in a run, a run
-- whose lease runs out, and the attempts of every message of it
\set VERBOSITY terse

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;
-- a lease of the topic "runs", in the order handed out: n and attempt
CREATE FUNCTION pg_temp.lease(relay text, per_key int, n int DEFAULT 100,
                              l interval DEFAULT '1 hour')
RETURNS TABLE (key text, n int, attempt int)
LANGUAGE sql AS $$
    SELECT key, (payload ->> 'n')::int, attempt
      FROM idem_outbox_lease(relay, n, l, per_key) WHERE topic = 'runs';
$$;
CREATE FUNCTION pg_temp.id_of(n int) RETURNS uuid LANGUAGE sql AS $$
    SELECT id FROM idem.outbox WHERE aggregatetype = 'runs' AND (payload ->> 'n')::int = n;
$$;
CREATE FUNCTION pg_temp.ack(VARIADIC ns int[]) RETURNS int LANGUAGE sql AS $$
    SELECT idem_outbox_ack(array_agg(pg_temp.id_of(n))) FROM unnest(ns) AS n;
$$;
CREATE FUNCTION pg_temp.stats() RETURNS text LANGUAGE sql AS $$
    SELECT format('pending=%s leased=%s dead=%s held_back=%s', pending, leased, dead, held_back)
      FROM idem_outbox_stats() WHERE topic = 'runs';
$$;
CREATE FUNCTION pg_temp.send(k text, VARIADIC ns int[]) RETURNS void LANGUAGE sql AS $$
    SELECT count(idem_outbox_send('runs', k, jsonb_build_object('n', n))) FROM unnest(ns) AS n;
$$;

-- bad per_key
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('r', 10, '1 hour', NULL)$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('r', 10, '1 hour', 0)$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_lease('r', 10, '1 hour', 10001)$$);

-- a run: the head and the messages after it, in order, each at its first
-- attempt; another key's run beside it
SELECT pg_temp.send('a', 1, 2, 3, 4, 5);
SELECT pg_temp.send('b', 101, 102);
SELECT * FROM pg_temp.lease('relay-1', 3) ORDER BY key, n;
SELECT pg_temp.stats();
-- the key is leased: nothing more of it, to anybody
SELECT * FROM pg_temp.lease('relay-2', 3);
-- the ack of a run's first messages deletes them and keeps the key leased
SELECT pg_temp.ack(1) AS acked;
SELECT * FROM pg_temp.lease('relay-2', 3);
SELECT pg_temp.stats();
-- the ack of its last message releases it
SELECT pg_temp.ack(2, 3, 101, 102) AS acked;
SELECT * FROM pg_temp.lease('relay-2', 3);
-- a message not leased (after the run) cannot be acknowledged
SELECT pg_temp.send('a', 6);
SELECT pg_temp.ack(6) AS acked_6;
SELECT pg_temp.stats();

SELECT pg_temp.ack(4, 5) AS acked;
SELECT * FROM pg_temp.lease('relay-1', 3);
SELECT pg_temp.ack(6) AS acked;

-- a run's lease runs out: its messages are leased one at a time, each at
-- its second attempt (it was leased once), and a run comes after them
SELECT pg_temp.send('a', 7, 8, 9, 10);
SELECT * FROM pg_temp.lease('relay-1', 3, l => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT * FROM pg_temp.lease('relay-2', 3);
-- relay-1's late ack of the message it delivered counts, and releases
SELECT pg_temp.ack(7) AS acked_late;
SELECT * FROM pg_temp.lease('relay-2', 3);
SELECT pg_temp.ack(8) AS acked;
SELECT * FROM pg_temp.lease('relay-2', 3);
SELECT pg_temp.ack(9) AS acked;
SELECT pg_temp.send('a', 11);
SELECT * FROM pg_temp.lease('relay-2', 3);
SELECT pg_temp.ack(10, 11) AS acked;

-- a nack in a run: the messages before it were delivered (acknowledged
-- after the nack here), it waits for its retry, at its second attempt, and
-- the messages after it are released with it, leased one at a time
SELECT pg_temp.send('c', 21, 22, 23, 24);
SELECT * FROM pg_temp.lease('relay-1', 4);
SELECT idem_outbox_nack(pg_temp.id_of(22), 'boom', '0', relay => 'relay-1') AS nacked;
SELECT pg_temp.ack(21) AS acked;
SELECT dead, attempts, (SELECT payload ->> 'n' FROM idem.outbox WHERE id = head_id) AS head,
       leased_by, last_error
  FROM idem.outbox_keys WHERE topic = 'runs' AND key = 'c';
SELECT * FROM pg_temp.lease('relay-2', 4);
-- a nack of a message of the old run while its head is leased alone: no
SELECT idem_outbox_nack(pg_temp.id_of(23), 'late', '0') AS nacked_23;
SELECT pg_temp.ack(22) AS acked;
SELECT * FROM pg_temp.lease('relay-2', 4);
SELECT pg_temp.ack(23) AS acked;
SELECT * FROM pg_temp.lease('relay-2', 4);
SELECT pg_temp.ack(24) AS acked;

-- a nack of the run's head ends the run: a late ack of its last message
-- deletes that message and leaves the key to wait for the retry
SELECT pg_temp.send('h', 71, 72, 73);
SELECT * FROM pg_temp.lease('relay-1', 3);
SELECT idem_outbox_nack(pg_temp.id_of(71), 'broker down', '1 hour', relay => 'relay-1') AS nacked;
SELECT pg_temp.ack(73) AS acked_73;
SELECT attempts, leased_by, last_error, available_at > now() + interval '59 minutes' AS waits
  FROM idem.outbox_keys WHERE topic = 'runs' AND key = 'h';
SELECT * FROM pg_temp.lease('relay-2', 3);
SELECT pg_temp.ack(71, 72) AS acked;

-- the last message of a run acknowledged before its head releases the key:
-- the head is then leased alone, at its second attempt
SELECT pg_temp.send('d', 31, 32);
SELECT * FROM pg_temp.lease('relay-1', 2);
SELECT pg_temp.ack(32) AS acked;
SELECT * FROM pg_temp.lease('relay-2', 2);
SELECT pg_temp.ack(31) AS acked;

-- max_messages bounds a run; what is left of the key waits for the next
-- lease of the key
SELECT pg_temp.send('e', 41, 42, 43, 44);
SELECT * FROM pg_temp.lease('relay-1', 10, n => 2);
SELECT pg_temp.ack(43) AS acked_43;
SELECT pg_temp.ack(41, 42) AS acked;
SELECT * FROM pg_temp.lease('relay-1', 10);
SELECT pg_temp.ack(43, 44) AS acked;

-- attempts with runs: a run that runs out with 2 attempts allowed; its head
-- dies at its third lease, the rest is held back; a redrive starts afresh,
-- each message at its first attempt, but with no run over the messages
-- leased before (the late ack of one would end the run: see lease_run)
SELECT idem_outbox_configure('runs', 2, '1 second', '1 minute');
SELECT pg_temp.send('f', 51, 52);
SELECT * FROM pg_temp.lease('relay-1', 2, l => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT * FROM pg_temp.lease('relay-1', 2, l => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT * FROM pg_temp.lease('relay-1', 2);
SELECT pg_temp.stats();
SELECT idem_outbox_redrive('runs', 'f') AS redriven;
SELECT pg_temp.send('f', 53, 54);
SELECT * FROM pg_temp.lease('relay-1', 2);
SELECT pg_temp.ack(51) AS acked;
SELECT * FROM pg_temp.lease('relay-1', 3);
SELECT pg_temp.ack(52, 53, 54) AS acked;

-- per_key 1 is the lease of one message per key
SELECT pg_temp.send('g', 61, 62);
SELECT * FROM pg_temp.lease('relay-1', 1);
SELECT pg_temp.ack(61) AS acked;
SELECT * FROM pg_temp.lease('relay-1', 1);
SELECT pg_temp.ack(62) AS acked;

SELECT count(*) AS left_over FROM idem.outbox WHERE aggregatetype = 'runs';
DELETE FROM idem.outbox_keys WHERE topic = 'runs';
DELETE FROM idem.outbox_topics WHERE topic = 'runs';
