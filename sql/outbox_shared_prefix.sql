-- Two keys whose ids begin with the same prefix of their key_hash share one
-- range of the primary key, their messages interleaved in it by seq: each
-- key's head, runs and purge are still its own.
\set VERBOSITY terse

-- (p685 and p161086 of the topic "collide" have hashes with the same first
-- 32 bits, and different hashes)
SELECT idem._outbox_id_bound('collide', 'p685', false) = idem._outbox_id_bound('collide', 'p161086', false) AS same_range,
       idem._outbox_key_hash('collide', 'p685') <> idem._outbox_key_hash('collide', 'p161086') AS other_hash;

CREATE FUNCTION pg_temp.lease(relay text, per_key int)
RETURNS TABLE (key text, n int, attempt int)
LANGUAGE sql AS $$
    SELECT key, (payload ->> 'n')::int, attempt
      FROM idem_outbox_lease(relay, 100, '1 hour', per_key) WHERE topic = 'collide';
$$;
CREATE FUNCTION pg_temp.ack(k text, upto int) RETURNS int
LANGUAGE sql AS $$
    SELECT idem_outbox_ack(array_agg(id)) FROM idem.outbox
     WHERE aggregatetype = 'collide' AND aggregateid = k AND (payload ->> 'n')::int <= upto;
$$;

-- interleaved: the entries of the range alternate between the keys
SELECT count(idem_outbox_send('collide', CASE WHEN i % 2 = 1 THEN 'p685' ELSE 'p161086' END,
                              jsonb_build_object('n', (i + 1) / 2)))
  FROM generate_series(1, 8) i;
SELECT bool_and(id BETWEEN idem._outbox_id_bound('collide', 'p685', false)
                       AND idem._outbox_id_bound('collide', 'p685', true)) AS one_range
  FROM idem.outbox WHERE aggregatetype = 'collide';

-- each key's own head, once
SELECT * FROM pg_temp.lease('r1', 1) ORDER BY key;
SELECT * FROM pg_temp.lease('r2', 1) ORDER BY key;
-- the first key's next message once its head is delivered; the other key
-- is still leased
SELECT pg_temp.ack('p685', 1) AS acked;
SELECT * FROM pg_temp.lease('r2', 1) ORDER BY key;
-- runs: each key's messages after its head, and none of the other key's
SELECT pg_temp.ack('p685', 2) + pg_temp.ack('p161086', 1) AS acked;
SELECT * FROM pg_temp.lease('r3', 100) ORDER BY key, n;

-- the purge removes the row of a key whose messages were all delivered,
-- and keeps the other's, whose messages are in the same range
SELECT pg_temp.ack('p685', 4) AS acked;
SELECT idem_outbox_purge() >= 1 AS purged;
SELECT key FROM idem.outbox_keys WHERE topic = 'collide' ORDER BY key;
SELECT pg_temp.ack('p161086', 4) AS acked;
SELECT idem_outbox_purge() >= 1 AS purged;
SELECT count(*) AS key_rows FROM idem.outbox_keys WHERE topic = 'collide';
