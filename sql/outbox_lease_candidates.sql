-- A lease keeps only the best candidates of its scan of the key rows, about
-- twice as many as it may lease: the keys that have waited longest must
-- still come first, and keys whose head cannot be leased (here key rows
-- whose messages were all delivered) must not hide the others, however many
-- come before them.
-- Everything runs in one transaction that rolls back, so that what other
-- tests left in the outbox is leased here at most for the transaction.
\set VERBOSITY terse
BEGIN;

-- 50 keys with one message each, which became available one minute apart,
-- in an order unrelated to the order of their rows
SELECT count(idem_outbox_send('cand', 'live-' || i, jsonb_build_object('i', i)))
  FROM generate_series(1, 50) i;
UPDATE idem.outbox_keys SET available_at = now() - ((i * 37 % 50) + 10) * interval '1 minute'
  FROM (SELECT i FROM generate_series(1, 50) i) g
 WHERE topic = 'cand' AND key = 'live-' || i;
-- the 3 that waited longest, oldest first
SELECT topic, key FROM idem_outbox_lease('relay-a', 3, '1 hour');
SELECT topic, key FROM idem_outbox_lease('relay-a', 1, '1 hour');

-- 100 key rows without messages, older than every key that has one
INSERT INTO idem.outbox_keys (topic, key, dead, attempts, available_at)
    SELECT 'cand', 'idle-' || i, false, 0, now() - interval '1 day' - i * interval '1 second'
      FROM generate_series(1, 100) i;
SELECT topic, key FROM idem_outbox_lease('relay-a', 1, '1 hour');
SELECT count(*) AS leased, count(DISTINCT key) AS keys
  FROM idem_outbox_lease('relay-a', 10000, '1 hour') WHERE topic = 'cand';
SELECT count(*) AS left FROM idem_outbox_lease('relay-a', 10000, '1 hour') WHERE topic = 'cand';

-- after passes that sought the head of many keys without one, a lease reads
-- the primary key of idem.outbox whole first and seeks only the keys that have an
-- entry there: a key that sends again is leased, and the others are not
DELETE FROM idem.outbox o USING idem.outbox_keys k
 WHERE k.topic = 'cand' AND o.aggregatetype = k.topic AND o.aggregateid = k.key AND k.head_id = o.id;
UPDATE idem.outbox_keys SET head_id = NULL, leased_by = NULL, attempts = 0, available_at = now() - interval '1 hour'
 WHERE topic = 'cand';
SELECT count(*) AS left FROM idem_outbox_lease('relay-a', 10000, '1 hour') WHERE topic = 'cand';
SELECT count(*) AS left FROM idem_outbox_lease('relay-a', 10000, '1 hour') WHERE topic = 'cand';
SELECT idem_outbox_send('cand', 'idle-50', '{"again": 1}') IS NOT NULL AS sent;
SELECT idem_outbox_send('cand', 'live-7', '{"again": 2}') IS NOT NULL AS sent;
SELECT topic, key, payload FROM idem_outbox_lease('relay-a', 10000, '1 hour') WHERE topic = 'cand' ORDER BY key;
SELECT count(*) AS left FROM idem_outbox_lease('relay-a', 10000, '1 hour') WHERE topic = 'cand';
ROLLBACK;
