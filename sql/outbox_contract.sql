-- promises of the outbox's README that the other files do not check: the
-- defaults of a topic never configured, the jitter of the backoff, what
-- idem_outbox_stats counts as pending, and the late acks of a run after a
-- redrive.  Its topics start with "oc_"; outputs are booleans or counts.
\set VERBOSITY terse

-- the leases below take every topic's messages: the files before leave none
SELECT count(*) AS messages_left_before FROM idem.outbox;

-- the id of a message, by its topic and its payload's "n"
CREATE FUNCTION pg_temp.id_of(t text, n int) RETURNS uuid LANGUAGE sql AS $$
    SELECT id FROM idem.outbox WHERE aggregatetype = t AND (payload ->> 'n')::int = n;
$$;
CREATE FUNCTION pg_temp.keyrow(t text, k text) RETURNS text LANGUAGE sql AS $$
    SELECT format('dead=%s attempts=%s', dead, attempts)
      FROM idem.outbox_keys WHERE topic = t AND key = k;
$$;

--
-- a topic never configured: 10 attempts, and a backoff of 1 second at first
--
SELECT count(*) AS settings FROM idem.outbox_topics WHERE topic = 'oc_default';
SELECT idem_outbox_send('oc_default', 'd', '{"n": 1}') IS NOT NULL AS sent;
-- nine leases, each nacked with a retry at once: still not dead
CREATE TEMP TABLE tries (attempt int, nacked boolean);
DO $$
DECLARE
    m record;
BEGIN
    FOR i IN 1..9 LOOP
        SELECT * INTO STRICT m FROM idem_outbox_lease('oc-relay', 10) WHERE topic = 'oc_default';
        INSERT INTO tries VALUES (m.attempt, idem_outbox_nack(m.id, 'e', '0'));
    END LOOP;
END;
$$;
SELECT array_agg(attempt ORDER BY attempt) AS attempts, bool_and(nacked) AS nacked FROM tries;
SELECT pg_temp.keyrow('oc_default', 'd');
SELECT dead, pending FROM idem_outbox_stats() WHERE topic = 'oc_default';
-- the tenth lease is the last attempt: its nack kills the message, even
-- with a retry at once
SELECT attempt, idem_outbox_nack(id, 'e', '0') AS nacked
  FROM idem_outbox_lease('oc-relay', 10) WHERE topic = 'oc_default';
SELECT pg_temp.keyrow('oc_default', 'd');
SELECT dead, pending FROM idem_outbox_stats() WHERE topic = 'oc_default';
SELECT count(*) AS leased FROM idem_outbox_lease('oc-relay', 10) WHERE topic = 'oc_default';
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of('oc_default', 1)]) AS dropped;

-- the first backoff of the default: half to all of 1 second
SELECT idem_outbox_send('oc_default', 'b', '{"n": 2}') IS NOT NULL AS sent;
SELECT attempt FROM idem_outbox_lease('oc-relay', 10) WHERE topic = 'oc_default';
CREATE TEMP TABLE t0 AS SELECT clock_timestamp() AS t;
SELECT idem_outbox_nack(pg_temp.id_of('oc_default', 2), 'e') AS nacked;
CREATE TEMP TABLE t1 AS SELECT clock_timestamp() AS t;
SELECT available_at - (SELECT t FROM t0) >= interval '500 ms' AS at_least_half,
       available_at - (SELECT t FROM t1) <= interval '1 second' AS at_most_base
  FROM idem.outbox_keys WHERE topic = 'oc_default' AND key = 'b';
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of('oc_default', 2)]) AS dropped;
DROP TABLE tries, t0, t1;

--
-- jitter: a random second half of the backoff is waited.  300 keys nacked
-- at their first attempt with a base of 1 hour: every wait within half an
-- hour and an hour, spread over it (the chance that all 300 fall within
-- 0.6 h and 1 h, or within 0.5 h and 0.9 h, is 0.8^300 each)
--
SELECT idem_outbox_configure('oc_jitter', 3, '1 hour', '1 hour');
SELECT count(idem_outbox_send('oc_jitter', 'j-' || i, jsonb_build_object('n', i)))
  FROM generate_series(1, 300) i;
CREATE TEMP TABLE jl AS
SELECT id, attempt FROM idem_outbox_lease('oc-relay', 1000) WHERE topic = 'oc_jitter';
SELECT count(*) AS leased, bool_and(attempt = 1) AS first_attempts FROM jl;
CREATE TEMP TABLE t0 AS SELECT clock_timestamp() AS t;
SELECT count(*) FILTER (WHERE idem_outbox_nack(id, 'e')) AS nacked FROM jl;
CREATE TEMP TABLE t1 AS SELECT clock_timestamp() AS t;
-- the wait of each: at least available_at - t1, at most available_at - t0
CREATE TEMP TABLE jw AS
SELECT extract(epoch FROM available_at - (SELECT t FROM t1)) / 3600 AS lo,
       extract(epoch FROM available_at - (SELECT t FROM t0)) / 3600 AS hi
  FROM idem.outbox_keys WHERE topic = 'oc_jitter';
SELECT count(*) AS waits,
       bool_and(hi >= 0.5 AND lo <= 1) AS within_half_and_whole,
       min(hi) < 0.6 AS some_short,
       max(lo) > 0.9 AS some_long,
       count(*) FILTER (WHERE hi < 0.75) > 0 AS first_half,
       count(*) FILTER (WHERE lo > 0.75) > 0 AS second_half
  FROM jw;
-- none is leased again before its wait
SELECT count(*) AS leased_again FROM idem_outbox_lease('oc-relay', 1000) WHERE topic = 'oc_jitter';
DROP TABLE jl, jw, t0, t1;

--
-- statistics: a message waiting for its retry is pending, and the age of
-- the oldest pending message is that of the oldest one, leased before
--
SELECT idem_outbox_send('oc_stats', 'a', '{"n": 1}') IS NOT NULL AS sent;
SELECT attempt FROM idem_outbox_lease('oc-relay', 10, '1 hour') WHERE topic = 'oc_stats';
SELECT pending, leased, dead, held_back, oldest_pending_age IS NULL AS no_pending
  FROM idem_outbox_stats() WHERE topic = 'oc_stats';
SELECT pg_sleep(0.3);
SELECT idem_outbox_send('oc_stats', 'b', '{"n": 2}') IS NOT NULL AS sent;
SELECT idem_outbox_nack(pg_temp.id_of('oc_stats', 1), 'e', '1 hour') AS nacked;
SELECT s.pending, s.leased, s.dead, s.held_back,
       s.oldest_pending_age >= now() - a.created_at - interval '10 ms' AS age_of_a,
       s.oldest_pending_age > now() - b.created_at + interval '200 ms' AS older_than_b
  FROM idem_outbox_stats() s,
       idem.outbox a, idem.outbox b
 WHERE s.topic = 'oc_stats' AND a.id = pg_temp.id_of('oc_stats', 1) AND b.id = pg_temp.id_of('oc_stats', 2);
-- b is leased; a is not, until its retry is due
SELECT key, attempt FROM idem_outbox_lease('oc-relay', 10, '1 hour') WHERE topic = 'oc_stats';
SELECT pending, leased FROM idem_outbox_stats() WHERE topic = 'oc_stats';
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of('oc_stats', 1), pg_temp.id_of('oc_stats', 2)]) AS acked;

--
-- a run whose head died, redriven: the late ack of the run's other
-- messages by the relay that leased it counts 0, and they are delivered
-- again, each at its first attempt
--
SELECT idem_outbox_configure('oc_redrive', 1, '1 second', '1 minute');
SELECT count(idem_outbox_send('oc_redrive', 'r', jsonb_build_object('n', i)))
  FROM generate_series(1, 3) i;
SELECT (payload ->> 'n')::int AS n, attempt
  FROM idem_outbox_lease('oc-relay', 10, '1 millisecond', per_key => 3) WHERE topic = 'oc_redrive';
SELECT pg_sleep(0.01);
-- its lease ran out at its last attempt: the head is dead, the rest held back
SELECT count(*) AS leased FROM idem_outbox_lease('oc-relay', 10, '1 hour', per_key => 3) WHERE topic = 'oc_redrive';
SELECT pending, leased, dead, held_back FROM idem_outbox_stats() WHERE topic = 'oc_redrive';
SELECT idem_outbox_redrive('oc_redrive', 'r') AS redriven;
-- the late ack of messages 2 and 3
SELECT idem_outbox_ack(ARRAY[pg_temp.id_of('oc_redrive', 2), pg_temp.id_of('oc_redrive', 3)]) AS late_ack;
SELECT count(*) AS left FROM idem.outbox WHERE aggregatetype = 'oc_redrive';
-- one at a time, in order, each at its first attempt
SELECT (payload ->> 'n')::int AS n, attempt, idem_outbox_ack(ARRAY[id]) AS acked
  FROM idem_outbox_lease('oc-relay', 10, '1 hour') WHERE topic = 'oc_redrive';
SELECT (payload ->> 'n')::int AS n, attempt, idem_outbox_ack(ARRAY[id]) AS acked
  FROM idem_outbox_lease('oc-relay', 10, '1 hour') WHERE topic = 'oc_redrive';
SELECT (payload ->> 'n')::int AS n, attempt, idem_outbox_ack(ARRAY[id]) AS acked
  FROM idem_outbox_lease('oc-relay', 10, '1 hour') WHERE topic = 'oc_redrive';
SELECT count(*) AS leased FROM idem_outbox_lease('oc-relay', 10, '1 hour') WHERE topic = 'oc_redrive';

-- the lease leases every message it returns, read or not: a LIMIT reads one
-- row of three, and the three are leased (with an attempt each)
SELECT count(idem_outbox_send('oc_limit', 'k' || i, '{}')) FROM generate_series(1, 3) i;
SELECT count(*) AS read FROM (SELECT * FROM idem_outbox_lease('oc-limit', 3, '1 hour') LIMIT 1) l;
SELECT count(*) FILTER (WHERE leased_by = 'oc-limit' AND attempts = 1) AS leased
  FROM idem.outbox_keys WHERE topic = 'oc_limit';
-- nothing is left of this file
DELETE FROM idem.outbox WHERE aggregatetype LIKE 'oc\_%';
DELETE FROM idem.outbox_keys WHERE topic LIKE 'oc\_%';
DELETE FROM idem.outbox_topics WHERE topic LIKE 'oc\_%';
