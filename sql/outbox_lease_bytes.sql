-- idem_outbox_lease(..., max_bytes): no more message is taken once those
-- taken weigh max_bytes (payload and headers as stored, uncompressed); at
-- least one is; a run ends there too; NULL is no limit; 0 or less is
-- refused.  Its topics start with "lb_"; nothing is left of them.
\set VERBOSITY terse

-- every message of this file weighs the same: w bytes
SELECT pg_column_size(jsonb_build_object('pad', repeat('x', 1000))) AS w \gset
SELECT count(idem_outbox_send('lb_keys', 'k' || i, jsonb_build_object('pad', repeat('x', 1000))))
  FROM generate_series(1, 10) i;

-- 2.5 messages' weight: the third takes the lease past it, and is the last
SELECT count(*) AS leased FROM idem_outbox_lease('lb-relay', 10, '1 hour', max_bytes => (:w * 5 / 2)::bigint);
-- 1 byte: one message, whatever its weight
SELECT count(*) AS leased FROM idem_outbox_lease('lb-relay', 10, '1 hour', max_bytes => 1);
-- exactly two messages' weight: two
SELECT count(*) AS leased FROM idem_outbox_lease('lb-relay', 10, '1 hour', max_bytes => :w * 2);
-- NULL: no limit, the other four
SELECT count(*) AS leased FROM idem_outbox_lease('lb-relay', 10, '1 hour', max_bytes => NULL);

-- a run ends where the lease weighs max_bytes
SELECT count(idem_outbox_send('lb_run', 'r', jsonb_build_object('pad', repeat('x', 1000))))
  FROM generate_series(1, 6);
SELECT count(*) AS leased, count(DISTINCT key) AS keys
  FROM idem_outbox_lease('lb-relay', 10, '1 hour', 10, (:w * 5 / 2)::bigint) WHERE topic = 'lb_run';
SELECT leased_through - head_seq + 1 AS run_of FROM idem.outbox_keys k,
       LATERAL (SELECT min(seq) AS head_seq FROM idem.outbox WHERE aggregatetype = 'lb_run') h
 WHERE topic = 'lb_run';

-- a payload stored compressed weighs its uncompressed size: 1 MB of one
-- letter (a few kB on disk) fills a lease of 100 kB alone
SELECT count(idem_outbox_send('lb_big', 'b' || i, jsonb_build_object('pad', repeat('y', 1000000))))
  FROM generate_series(1, 2) i;
SELECT pg_column_size(payload) < 100000 AS stored_compressed FROM idem.outbox WHERE aggregatetype = 'lb_big' LIMIT 1;
SELECT count(*) AS leased FROM idem_outbox_lease('lb-relay', 10, '1 hour', max_bytes => 100000);

-- refused
SELECT * FROM idem_outbox_lease('lb-relay', 10, '1 hour', max_bytes => 0);
SELECT * FROM idem_outbox_lease('lb-relay', 10, '1 hour', max_bytes => -1);

-- nothing is left of this file
DELETE FROM idem.outbox WHERE aggregatetype LIKE 'lb\_%';
DELETE FROM idem.outbox_keys WHERE topic LIKE 'lb\_%';
DELETE FROM idem.outbox_topics WHERE topic LIKE 'lb\_%';
