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

-- no other snapshot of this database (autovacuum's ANALYZE of idem.outbox,
-- a test running beside this one) may keep the deleted messages visible:
-- their entries are marked dead, and removed by VACUUM, only once no
-- transaction can see them
CREATE FUNCTION pg_temp.horizon_clear() RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1 .. 6000 LOOP
		PERFORM pg_stat_clear_snapshot();
		IF NOT EXISTS (SELECT FROM pg_stat_activity
						WHERE datname = current_database()
						  AND pid <> pg_backend_pid()
						  AND backend_xmin IS NOT NULL) THEN
			RETURN true;
		END IF;
		PERFORM pg_sleep(0.01);
	END LOOP;
	RETURN false;
END
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
SELECT pg_temp.horizon_clear();
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
-- where the last probe of a range started is where the next one starts,
-- without a descent, on a leaf whose LSN has not moved since.  VACUUM
-- removes the entries of the first three messages of "shift" from their
-- leaf: the fourth is then where the first was, and the leaf's LSN moved
SELECT pg_temp.horizon_clear();
VACUUM (INDEX_CLEANUP ON) idem.outbox;
SELECT count(idem_outbox_send('hint', 'shift', jsonb_build_object('n', i)))
  FROM generate_series(1, 5) i;
SET client_min_messages = warning;	-- pages deleted by VACUUM
SELECT min(b) AS blk, count(DISTINCT b) AS leaves
  FROM generate_series(1, pg_relation_size('idem.outbox_pkey') /
                          current_setting('block_size')::int - 1) AS b,
       LATERAL bt_page_stats('idem.outbox_pkey', b::int) AS s,
       LATERAL bt_page_items('idem.outbox_pkey', b::int) AS i
 WHERE s.type = 'l' AND i.htid IN (SELECT ctid FROM idem.outbox WHERE aggregatetype = 'hint') \gset
RESET client_min_messages;
SELECT :leaves AS leaves;
SELECT count(*) AS entries FROM bt_page_items('idem.outbox_pkey', :blk) \gset
SELECT * FROM pg_temp.lease('hint', 'r5');
SELECT pg_temp.ack('hint', 'shift', 1) AS acked;
SELECT * FROM pg_temp.lease('hint', 'r5');
SELECT pg_temp.ack('hint', 'shift', 2) AS acked;
SELECT * FROM pg_temp.lease('hint', 'r5');
SELECT pg_temp.ack('hint', 'shift', 3) AS acked;
SELECT pg_temp.horizon_clear();
VACUUM (INDEX_CLEANUP ON) idem.outbox;
SELECT :entries - count(*) AS removed FROM bt_page_items('idem.outbox_pkey', :blk);
SELECT * FROM pg_temp.lease('hint', 'r5');
SELECT pg_temp.ack('hint', 'shift', 4) AS acked;
SELECT * FROM pg_temp.lease('hint', 'r5');
SELECT pg_temp.ack('hint', 'shift', 5) AS acked;
SELECT * FROM pg_temp.lease('hint', 'r5');

-- a TRUNCATE in the transaction that made the table's files empties them in
-- place: the leaf a probe remembers may be past the end of the index
BEGIN;
TRUNCATE idem.outbox;
SELECT count(idem_outbox_send('trunc', 'k' || i, '{}'))
  FROM generate_series(1, 3000) i;
SELECT count(*) AS leased FROM idem_outbox_lease('r6', 10000);
TRUNCATE idem.outbox;
-- the key with the last range, on a leaf added by a split
SELECT k AS last_key
  FROM (SELECT 'k' || i AS k FROM generate_series(1, 3000) i) s
 ORDER BY idem._outbox_id_bound('trunc', k, false) DESC LIMIT 1 \gset
SELECT idem_outbox_send('trunc', :'last_key', '{}') IS NOT NULL AS sent;
SELECT count(*) AS leased FROM idem_outbox_lease('r6', 10000);
ROLLBACK;
SELECT idem_outbox_purge() >= 4 AS purged;
SELECT count(*) AS key_rows FROM idem.outbox_keys WHERE topic IN ('probe', 'collide', 'hint');

DROP EXTENSION pageinspect;
