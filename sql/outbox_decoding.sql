-- transactional outbox: a committed send reaches logical decoding, in
-- commit order; a rolled-back one never does
\set VERBOSITY terse
SELECT 'init' FROM pg_create_logical_replication_slot('outbox_slot', 'test_decoding');

BEGIN;
SELECT idem_outbox_send('orders', 'o-1', '{"n": 1}', NULL, 'order.created') IS NOT NULL AS sent;
ROLLBACK;
BEGIN;
SELECT idem_outbox_send('orders', 'o-1', '{"n": 2}', NULL, 'order.created') IS NOT NULL AS sent;
SELECT idem_outbox_send('orders', 'o-2', '{"n": 3}', NULL, 'order.created') IS NOT NULL AS sent;
COMMIT;
SELECT idem_outbox_send('orders', 'o-1', '{"n": 4}', NULL, 'order.paid') IS NOT NULL AS sent;

-- the outbox's inserts, without ids, seqs and times
SELECT regexp_replace(regexp_replace(data, 'id\[uuid\]:''[^'']*''', 'id[uuid]:…'),
                      ' seq\[bigint\]:\d+ created_at\[timestamp with time zone\]:''[^'']*'' key_hash\[bigint\]:-?\d+', '') AS change
  FROM pg_logical_slot_get_changes('outbox_slot', NULL, NULL, 'include-xids', '0')
 WHERE data LIKE 'table idem.outbox:%' OR data IN ('BEGIN', 'COMMIT');
SELECT pg_drop_replication_slot('outbox_slot');
