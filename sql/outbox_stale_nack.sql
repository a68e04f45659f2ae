-- A relay whose lease ran out, and whose message another relay leased
-- since, reports its failure late: that must not end the other relay's
-- lease, since a message is never leased to two relays while its lease
-- lasts.  A relay names itself in idem_outbox_nack for that.
\set VERBOSITY terse

SELECT idem_outbox_send('stale', 's-1', '{"n": 1}') IS NOT NULL AS sent;
SELECT attempt FROM idem_outbox_lease('relay-a', 10000, '1 millisecond') WHERE topic = 'stale';
SELECT pg_sleep(0.01);
-- relay-a's lease ran out: relay-b leases the message for an hour
SELECT attempt FROM idem_outbox_lease('relay-b', 10000, '1 hour') WHERE topic = 'stale';
-- relay-a's late nack
SELECT idem_outbox_nack(id, 'timeout', '0', relay => 'relay-a') AS nacked
  FROM idem.outbox WHERE aggregatetype = 'stale';
-- relay-b's lease lasts: nobody else gets the message
SELECT count(*) AS leased_again FROM idem_outbox_lease('relay-c', 10000, '1 hour') WHERE topic = 'stale';

SELECT idem_outbox_ack(array_agg(id)) AS acked FROM idem.outbox WHERE aggregatetype = 'stale';
DELETE FROM idem.outbox_keys WHERE topic = 'stale';
