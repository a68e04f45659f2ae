-- The attempts a key's row keeps for messages an earlier head came before
-- again (attempts_kept: pairs of seq and attempts; see
-- specs/outbox_late_sender) are taken when such a message is the head.
-- Written by hand, the column is read as well as it can be: pairs with a
-- NULL, an odd last element and pairs of messages gone are dropped when
-- the row is written, and a count is clamped to 0 and to the largest int.
\set VERBOSITY terse

SELECT count(idem_outbox_send('kept', 'k', jsonb_build_object('n', n))) AS sent FROM generate_series(1, 3) n;
CREATE TEMP TABLE s AS SELECT seq, (payload->>'n')::int AS n FROM idem.outbox WHERE aggregatetype = 'kept';

-- n = 1 had 3 leases: this one is its fourth; the pair of a seq before it
-- (a message gone), the NULL pair and the odd element go
UPDATE idem.outbox_keys SET attempts_kept = ARRAY[(SELECT seq FROM s WHERE n = 2), 6,
                                                  (SELECT seq FROM s WHERE n = 1), 3,
                                                  0, 7, NULL, 1, 5]
 WHERE topic = 'kept';
SELECT payload->>'n' AS n, attempt FROM idem_outbox_lease('relay', 10, '1 hour', 5) WHERE topic = 'kept';
SELECT attempts, attempts_kept = ARRAY[(SELECT seq FROM s WHERE n = 2), 6] AS kept_n2
  FROM idem.outbox_keys WHERE topic = 'kept';
SELECT idem_outbox_ack(ARRAY(SELECT head_id FROM idem.outbox_keys WHERE topic = 'kept')) AS acked;

-- n = 2: six leases before, so its seventh now, alone (no run)
SELECT payload->>'n' AS n, attempt FROM idem_outbox_lease('relay', 10, '1 hour', 5) WHERE topic = 'kept';
SELECT attempts_kept IS NULL AS none_kept FROM idem.outbox_keys WHERE topic = 'kept';
SELECT idem_outbox_ack(ARRAY(SELECT head_id FROM idem.outbox_keys WHERE topic = 'kept')) AS acked;

-- a negative count is none (not its low 32 bits)
UPDATE idem.outbox_keys SET attempts_kept = ARRAY[(SELECT seq FROM s WHERE n = 3), -4294967295]
 WHERE topic = 'kept';
SELECT payload->>'n' AS n, attempt FROM idem_outbox_lease('relay', 10, '1 millisecond') WHERE topic = 'kept';
SELECT pg_sleep(0.01);

-- a two-dimensional array is read as its elements in order; a count beyond
-- the topic's attempts makes the head dead, its lease having run out
UPDATE idem.outbox_keys SET attempts_kept = ARRAY[[(SELECT seq FROM s WHERE n = 3), 99999999999]],
                            head_id = NULL
 WHERE topic = 'kept';
SELECT count(*) AS leased FROM idem_outbox_lease('relay', 10, '1 hour') WHERE topic = 'kept';
SELECT dead, attempts, last_error, attempts_kept FROM idem.outbox_keys WHERE topic = 'kept';
SELECT idem_outbox_ack(ARRAY(SELECT head_id FROM idem.outbox_keys WHERE topic = 'kept')) AS acked;

DELETE FROM idem.outbox_keys WHERE topic = 'kept';
