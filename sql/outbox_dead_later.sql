-- A message can be dead before any lease writes so in its key's row: a
-- message of a run nacked for good while an earlier one of the run is
-- still to be acknowledged, a head whose last lease ran out, a head whose
-- topic's maximum attempts were lowered below its count.  The earlier
-- message is leased again, idem_outbox_stats counts the dead message as
-- dead (and those behind it as held back), and idem_outbox_redrive puts it
-- back, at its first attempt.
\set VERBOSITY terse
SET TIME ZONE 'UTC';

CREATE FUNCTION st(t text) RETURNS TABLE (pending bigint, leased bigint, dead bigint, held_back bigint)
LANGUAGE sql AS $$
    SELECT s.pending, s.leased, s.dead, s.held_back FROM idem_outbox_stats() s WHERE s.topic = t
$$;

-- 1. A run of 1, 2, 3 (of 4 messages).  Message 2 is refused for good while
-- the ack of message 1 was lost: message 1 is leased again, at its second
-- attempt, and message 2 is dead behind it, with its error.
SELECT count(idem_outbox_send('dl-run', 'k', jsonb_build_object('n', n))) AS sent FROM generate_series(1, 4) n;
CREATE TEMP TABLE l AS SELECT id, (payload->>'n')::int AS n, attempt FROM idem_outbox_lease('r1', 10, '1 hour', 3);
SELECT n, attempt FROM l ORDER BY n;
SELECT idem_outbox_nack((SELECT id FROM l WHERE n = 2), 'refused: bad schema', NULL, 'r1', true) AS nacked;
SELECT dead, attempts, leased_by, dead_kept = (SELECT seq FROM idem.outbox WHERE id = (SELECT id FROM l WHERE n = 2)) AS kept_2, error_kept
  FROM idem.outbox_keys WHERE topic = 'dl-run';
SELECT * FROM st('dl-run');
-- the nack's backoff, then message 1 alone
UPDATE idem.outbox_keys SET available_at = now() WHERE topic = 'dl-run';
SELECT payload->>'n' AS n, attempt FROM idem_outbox_lease('r2', 10, '1 hour', 3);
SELECT * FROM st('dl-run');
SELECT idem_outbox_ack(ARRAY(SELECT id FROM l WHERE n = 1)) AS acked;
-- message 2 is the head now: dead, not leased
SELECT * FROM st('dl-run');
SELECT count(*) AS leased FROM idem_outbox_lease('r2', 10, '1 hour', 3);
SELECT dead, attempts, last_error, dead_kept, error_kept FROM idem.outbox_keys WHERE topic = 'dl-run';
-- its death counted once, by the nack
SELECT counters->>'dead' AS dead FROM idem_stats WHERE kind = 'outbox' AND ns = 'dl-run';
SELECT idem_outbox_redrive('dl-run') AS redriven;
SELECT payload->>'n' AS n, attempt FROM idem_outbox_lease('r2', 10, '1 hour', 3);
SELECT idem_outbox_ack(ARRAY(SELECT id FROM idem.outbox WHERE aggregatetype = 'dl-run' AND (payload->>'n')::int = 2)) AS acked;
SELECT payload->>'n' AS n, attempt FROM idem_outbox_lease('r2', 10, '1 hour', 3);
DROP TABLE l;

-- 2. The same with a last attempt (max_attempts 1): message 1 had its last
-- attempt too, and is dead as well, until the late ack of the relay that
-- leased the run drops it; message 2 is then the head, dead with the nack's
-- error.
SELECT idem_outbox_configure('dl-one', 1, '1 second', '1 minute');
SELECT count(idem_outbox_send('dl-one', 'k', jsonb_build_object('n', n))) AS sent FROM generate_series(1, 3) n;
CREATE TEMP TABLE l AS SELECT id, (payload->>'n')::int AS n, attempt FROM idem_outbox_lease('r1', 10, '1 hour', 3);
SELECT idem_outbox_nack((SELECT id FROM l WHERE n = 2), 'HTTP 503', '0', 'r1') AS nacked;
SELECT * FROM st('dl-one');
SELECT idem_outbox_ack(ARRAY(SELECT id FROM l WHERE n = 1)) AS acked;
SELECT count(*) AS leased FROM idem_outbox_lease('r1', 10, '1 hour', 3);
SELECT dead, attempts, last_error FROM idem.outbox_keys WHERE topic = 'dl-one';
SELECT * FROM st('dl-one');
DROP TABLE l;

-- 3. Message 2 made dead, then dropped by its ack: message 3 is not held
-- back, and is leased once message 1 is delivered.
SELECT count(idem_outbox_send('dl-drop', 'k', jsonb_build_object('n', n))) AS sent FROM generate_series(1, 3) n;
CREATE TEMP TABLE l AS SELECT id, (payload->>'n')::int AS n, attempt FROM idem_outbox_lease('r1', 10, '1 hour', 3);
SELECT idem_outbox_nack((SELECT id FROM l WHERE n = 2), 'refused', '0', 'r1', true) AS nacked;
SELECT idem_outbox_ack(ARRAY(SELECT id FROM l WHERE n = 2)) AS acked;
SELECT * FROM st('dl-drop');
SELECT idem_outbox_ack(ARRAY(SELECT id FROM l WHERE n = 1)) AS acked;
SELECT payload->>'n' AS n, attempt FROM idem_outbox_lease('r1', 10, '1 hour', 3);
SELECT dead, dead_kept, error_kept FROM idem.outbox_keys WHERE topic = 'dl-drop';
DROP TABLE l;

-- 4. A head whose last lease ran out is dead before any lease visits its
-- key: counted dead (also in a read-only transaction), and redriven.
SELECT idem_outbox_configure('dl-exp', 1, '1 second', '1 minute');
SELECT count(idem_outbox_send('dl-exp', 'k', jsonb_build_object('n', n))) AS sent FROM generate_series(1, 3) n;
SELECT payload->>'n' AS n, attempt FROM idem_outbox_lease('r1', 10, '1 hour');
UPDATE idem.outbox_keys SET available_at = now() - interval '1 second' WHERE topic = 'dl-exp';
SELECT * FROM st('dl-exp');
SELECT dead FROM idem.outbox_keys WHERE topic = 'dl-exp';
BEGIN READ ONLY;
SELECT * FROM st('dl-exp');
COMMIT;
SELECT idem_outbox_redrive('dl-exp', 'k') AS redriven;
SELECT * FROM st('dl-exp');
SELECT payload->>'n' AS n, attempt FROM idem_outbox_lease('r1', 10, '1 hour');
-- a run whose lease ran out: its head is dead at once, the rest held back
SELECT idem_outbox_ack(ARRAY(SELECT id FROM idem.outbox WHERE aggregatetype = 'dl-exp' AND payload->>'n' = '1')) AS acked;
SELECT payload->>'n' AS n, attempt FROM idem_outbox_lease('r1', 10, '1 hour', 2);
UPDATE idem.outbox_keys SET available_at = now() - interval '1 second' WHERE topic = 'dl-exp';
SELECT * FROM st('dl-exp');
SELECT idem_outbox_redrive('dl-exp') AS redriven;
SELECT payload->>'n' AS n, attempt FROM idem_outbox_lease('r1', 10, '1 hour', 2) WHERE topic = 'dl-exp';

-- 5. A message waiting for its retry, when its topic's maximum attempts are
-- lowered below its count: dead, with its nack's error.
SELECT idem_outbox_configure('dl-low', 5, '1 second', '1 minute');
SELECT count(idem_outbox_send('dl-low', 'k', jsonb_build_object('n', n))) AS sent FROM generate_series(1, 2) n;
SELECT idem_outbox_nack(id, 'broker down', '0') FROM idem_outbox_lease('r1', 10, '1 hour') WHERE topic = 'dl-low';
SELECT idem_outbox_nack(id, 'broker down again', '1 hour') FROM idem_outbox_lease('r1', 10, '1 hour') WHERE topic = 'dl-low';
SELECT * FROM st('dl-low');
SELECT idem_outbox_configure('dl-low', 2, '1 second', '1 minute');
SELECT * FROM st('dl-low');
-- a relay's lease marks it so once the retry is due
UPDATE idem.outbox_keys SET available_at = now() WHERE topic = 'dl-low';
SELECT count(*) AS leased FROM idem_outbox_lease('r1', 10, '1 hour') WHERE topic = 'dl-low';
SELECT dead, attempts, last_error FROM idem.outbox_keys WHERE topic = 'dl-low';
SELECT idem_outbox_redrive('dl-low') AS redriven;
SELECT payload->>'n' AS n, attempt FROM idem_outbox_lease('r1', 10, '1 hour') WHERE topic = 'dl-low';

-- 6. A redrive while message 2 of a run is dead behind message 1: message 2
-- comes back at its first attempt, alone, and the key then goes on with
-- runs (the redrive ends the old run, as it does for a dead head); the late
-- ack of message 3 by the relay of the old run counts 0.
SELECT count(idem_outbox_send('dl-again', 'k', jsonb_build_object('n', n))) AS sent FROM generate_series(1, 4) n;
CREATE TEMP TABLE l AS SELECT id, (payload->>'n')::int AS n, attempt FROM idem_outbox_lease('r1', 10, '1 hour', 3);
SELECT idem_outbox_nack((SELECT id FROM l WHERE n = 2), 'refused', '0', 'r1', true) AS nacked;
SELECT * FROM st('dl-again');
SELECT idem_outbox_redrive('dl-again') AS redriven;
SELECT * FROM st('dl-again');
SELECT payload->>'n' AS n, attempt FROM idem_outbox_lease('r2', 10, '1 hour', 3);
SELECT idem_outbox_ack(ARRAY(SELECT id FROM l WHERE n = 1)) AS acked;
SELECT payload->>'n' AS n, attempt FROM idem_outbox_lease('r2', 10, '1 hour', 3);
SELECT idem_outbox_ack(ARRAY(SELECT id FROM l WHERE n = 3)) AS late_ack;
SELECT count(*) AS leased_meanwhile FROM idem_outbox_lease('r3', 10, '1 hour', 3);
SELECT idem_outbox_ack(ARRAY(SELECT id FROM l WHERE n = 2)) AS acked;
SELECT payload->>'n' AS n, attempt FROM idem_outbox_lease('r2', 10, '1 hour', 3);
DROP TABLE l;

-- 7. idem_outbox_stats only reads: ACCESS SHARE on the outbox's relations,
-- which neither a purge nor CREATE INDEX waits for
BEGIN;
SELECT count(*) > 0 AS topics FROM idem_outbox_stats();
SELECT DISTINCT c.relname, l.mode FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
 WHERE l.pid = pg_backend_pid() AND c.relname LIKE 'outbox%' ORDER BY 1, 2;
COMMIT;

-- the function behind them is internal
SELECT has_function_privilege('public', 'idem._outbox_dead_heads(text, text)', 'EXECUTE') AS public_may,
       has_function_privilege('public', 'idem._outbox_redrive(text, text)', 'EXECUTE') AS public_may_redrive;

DELETE FROM idem.outbox WHERE aggregatetype LIKE 'dl-%';
DELETE FROM idem.outbox_keys WHERE topic LIKE 'dl-%';
DELETE FROM idem.outbox_topics WHERE topic LIKE 'dl-%';
DROP FUNCTION st(text);
