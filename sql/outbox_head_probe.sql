-- The lease finds a key's head on the leaves of the primary key itself:
-- past the entries of messages no transaction can see any more (which it
-- marks dead, as an index scan does), across leaves holding only those,
-- and past the entries of another key that shares the range, taken a few
-- at a time.
\set VERBOSITY terse
CREATE EXTENSION IF NOT EXISTS pageinspect;

CREATE FUNCTION pg_temp.lease(t text, relay text, per_key int DEFAULT 1)
RETURNS TABLE (key text, n int, attempt int)
LANGUAGE sql AS $$
    SELECT key, (payload ->> 'n')::int, attempt
      FROM idem_outbox_lease(relay, 10000, '1 hour', per_key) WHERE topic = t;
$$;
CREATE FUNCTION pg_temp.ack(t text, k text, upto int) RETURNS int
LANGUAGE sql AS $$
    SELECT idem_outbox_ack(array_agg(id)) FROM idem.outbox
     WHERE aggregatetype = t AND aggregateid = k AND (payload ->> 'n')::int <= upto;
$$;
-- entries of the primary key's leaves marked dead
CREATE FUNCTION pg_temp.dead_entries() RETURNS bigint
LANGUAGE sql AS $$
    SELECT count(*)
      FROM generate_series(1, pg_relation_size('idem.outbox_pkey') /
                              current_setting('block_size')::int - 1) AS b,
           LATERAL bt_page_stats('idem.outbox_pkey', b::int) AS s,
           LATERAL bt_page_items('idem.outbox_pkey', b::int) AS i
     WHERE s.type = 'l' AND i.dead;
$$;

-- 2,000 messages of one key, leased as one run; the first 1,990 are
-- delivered, and their entries fill several leaves
SELECT count(idem_outbox_send('probe', 'deep', jsonb_build_object('n', i)))
  FROM generate_series(1, 2000) i;
SELECT count(*) AS leased, min(n), max(n), max(attempt) AS attempt
  FROM pg_temp.lease('probe', 'r1', 1990);
SELECT pg_temp.ack('probe', 'deep', 1990) AS acked;
WITH p AS (SELECT substr(replace(idem._outbox_id_bound('probe', 'deep', false)::text, '-', ''), 1, 8) AS prefix)
SELECT count(DISTINCT b) >= 4 AS several_leaves
  FROM p,
       generate_series(1, pg_relation_size('idem.outbox_pkey') /
                          current_setting('block_size')::int - 1) AS b,
       LATERAL bt_page_stats('idem.outbox_pkey', b::int) AS s,
       LATERAL bt_page_items('idem.outbox_pkey', b::int) AS i
 WHERE s.type = 'l' AND replace(substr(i.data, 1, 11), ' ', '') = p.prefix;
SELECT pg_temp.dead_entries() AS dead_before \gset
-- the head: the 1,991st, past the leaves of delivered messages
SELECT * FROM pg_temp.lease('probe', 'r2');
-- whose entries are now marked dead, as an index scan marks them
SELECT pg_temp.dead_entries() - :dead_before >= 1000 AS marked_dead;
SELECT pg_temp.ack('probe', 'deep', 1991) AS acked;
SELECT count(*) AS leased, min(n), max(n) FROM pg_temp.lease('probe', 'r2', 100);
SELECT pg_temp.ack('probe', 'deep', 2000) AS acked;
SELECT * FROM pg_temp.lease('probe', 'r2');

-- (p685 and p161086 of the topic "collide" have ids in one range: see
-- outbox_shared_prefix) twenty messages of one key, then one of the other:
-- the other's head is past the first one's twenty entries
SELECT count(idem_outbox_send('collide', 'p161086', jsonb_build_object('n', i)))
  FROM generate_series(1, 20) i;
SELECT idem_outbox_send('collide', 'p685', '{"n": 1}') IS NOT NULL AS sent;
SELECT * FROM pg_temp.lease('collide', 'r3') ORDER BY key;
SELECT pg_temp.ack('collide', 'p161086', 1) + pg_temp.ack('collide', 'p685', 1) AS acked;
SELECT count(*) AS leased, min(n), max(n) FROM pg_temp.lease('collide', 'r3', 100);
SELECT pg_temp.ack('collide', 'p161086', 20) AS acked;
SELECT * FROM pg_temp.lease('collide', 'r3');

-- a message updated by hand with a change of an indexed column (an index
-- made for it): two entries of the primary key with its id, the visible
-- one after the other.  The first is the eighth entry of the range, the
-- last of what the probe takes at a time
SELECT count(idem_outbox_send('collide', 'p161086', jsonb_build_object('n', i)))
  FROM generate_series(21, 27) i;
SELECT idem_outbox_send('collide', 'p685', '{"n": 2}') IS NOT NULL AS sent;
CREATE INDEX outbox_probe_v ON idem.outbox ((payload ->> 'v'));
UPDATE idem.outbox SET payload = payload || '{"v": 1}'
 WHERE aggregatetype = 'collide' AND aggregateid = 'p685';
DROP INDEX idem.outbox_probe_v;
-- the updated message is p685's head
SELECT * FROM pg_temp.lease('collide', 'r4') ORDER BY key;
SELECT pg_temp.ack('collide', 'p161086', 21) + pg_temp.ack('collide', 'p685', 2) AS acked;
SELECT count(*) AS leased, min(n), max(n) FROM pg_temp.lease('collide', 'r4', 100);
SELECT pg_temp.ack('collide', 'p161086', 27) AS acked;
SELECT * FROM pg_temp.lease('collide', 'r4');
-- where the last probe of a range started is where the next one starts, on
-- a leaf that has not changed since, and that holds an entry before the
-- range ("before" is before "shift" in the index); VACUUM removes the
-- entries of the first three messages, and the fourth is where the first
-- was
VACUUM (INDEX_CLEANUP ON) idem.outbox;
SELECT idem._outbox_id_bound('hint', 'before', false) <
       idem._outbox_id_bound('hint', 'shift', false) AS before_first;
SELECT idem_outbox_send('hint', 'before', '{"n": 0}') IS NOT NULL AS sent;
SELECT count(idem_outbox_send('hint', 'shift', jsonb_build_object('n', i)))
  FROM generate_series(1, 5) i;
SELECT * FROM pg_temp.lease('hint', 'r5') ORDER BY key;
SELECT pg_temp.ack('hint', 'shift', 1) AS acked;
SELECT * FROM pg_temp.lease('hint', 'r5');
SELECT pg_temp.ack('hint', 'shift', 2) AS acked;
SELECT * FROM pg_temp.lease('hint', 'r5');
SELECT pg_temp.ack('hint', 'shift', 3) AS acked;
VACUUM (INDEX_CLEANUP ON) idem.outbox;
SELECT * FROM pg_temp.lease('hint', 'r5');
SELECT pg_temp.ack('hint', 'shift', 4) AS acked;
SELECT * FROM pg_temp.lease('hint', 'r5');
SELECT pg_temp.ack('hint', 'shift', 5) + pg_temp.ack('hint', 'before', 0) AS acked;
SELECT * FROM pg_temp.lease('hint', 'r5');
SELECT idem_outbox_purge() >= 5 AS purged;
SELECT count(*) AS key_rows FROM idem.outbox_keys WHERE topic IN ('probe', 'collide', 'hint');

DROP EXTENSION pageinspect;
