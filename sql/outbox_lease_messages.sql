-- With many idle keys and a short backlog, a lease finds the keys that have
-- messages through the primary key of idem.outbox instead of scanning every key row:
-- the same messages in the same order (the keys that have waited longest
-- first, never a dead key or one in backoff, one message per key), without
-- a scan of idem.outbox_keys.  A long backlog makes it scan the key rows.
-- Everything runs in one transaction that rolls back.
\set VERBOSITY terse
BEGIN;

-- 2000 keys whose messages were all delivered long ago
INSERT INTO idem.outbox_keys (topic, key, dead, attempts, available_at)
    SELECT 'msgs', 'idle-' || i, false, 0, now() - interval '1 day'
      FROM generate_series(1, 2000) i;
-- 5 keys with two messages each, available in an order unrelated to sending
SELECT count(idem_outbox_send('msgs', 'live-' || i, jsonb_build_object('i', i)))
  FROM generate_series(1, 5) i;
SELECT count(idem_outbox_send('msgs', 'live-' || i, jsonb_build_object('i', i, 'second', true)))
  FROM generate_series(1, 5) i;
UPDATE idem.outbox_keys SET available_at = now() - ((i * 3 % 5) + 1) * interval '1 minute'
  FROM generate_series(1, 5) i
 WHERE topic = 'msgs' AND key = 'live-' || i;
-- a dead key and a key in backoff, with messages
SELECT idem_outbox_send('msgs', 'dead-1', '{}') IS NOT NULL AS sent,
       idem_outbox_send('msgs', 'later-1', '{}') IS NOT NULL AS sent;
UPDATE idem.outbox_keys SET dead = true WHERE topic = 'msgs' AND key = 'dead-1';
UPDATE idem.outbox_keys SET available_at = now() + interval '1 hour'
 WHERE topic = 'msgs' AND key = 'later-1';

SELECT seq_scan AS scans FROM pg_stat_xact_user_tables
 WHERE relid = 'idem.outbox_keys'::regclass \gset
SELECT key, payload FROM idem_outbox_lease('relay-m', 3, '1 hour') WHERE topic = 'msgs';
SELECT key, payload FROM idem_outbox_lease('relay-m', 100, '1 hour') WHERE topic = 'msgs' ORDER BY key;
SELECT count(*) AS left FROM idem_outbox_lease('relay-m', 100, '1 hour') WHERE topic = 'msgs';
SELECT seq_scan - :scans AS scans_of_key_rows FROM pg_stat_xact_user_tables
 WHERE relid = 'idem.outbox_keys'::regclass;

-- the heads acknowledged: the second messages are leased, still without a scan
SELECT idem_outbox_ack(array_agg(o.id)) AS acked
  FROM idem.outbox o JOIN idem.outbox_keys k ON k.topic = o.aggregatetype AND k.key = o.aggregateid AND k.head_id = o.id
 WHERE k.topic = 'msgs' AND k.key LIKE 'live-%';
SELECT key, payload FROM idem_outbox_lease('relay-m', 100, '1 hour') WHERE topic = 'msgs' ORDER BY key;
SELECT seq_scan - :scans AS scans_of_key_rows FROM pg_stat_xact_user_tables
 WHERE relid = 'idem.outbox_keys'::regclass;

-- a long backlog: the key rows are scanned, with the same answers
SELECT count(idem_outbox_send('msgs', 'bulk-' || (i % 7), jsonb_build_object('i', i)))
  FROM generate_series(1, 3000) i;
SELECT key, payload FROM idem_outbox_lease('relay-m', 100, '1 hour') WHERE topic = 'msgs' ORDER BY key;
SELECT seq_scan - :scans > 0 AS key_rows_scanned FROM pg_stat_xact_user_tables
 WHERE relid = 'idem.outbox_keys'::regclass;
ROLLBACK;
