-- statistics: committed outcomes per namespace and kind, in shared memory
-- (the test servers preload idem); rolled-back work is not counted
\set VERBOSITY terse
SELECT idem_stats_reset();
CREATE FUNCTION pg_temp.stats(k text) RETURNS TABLE (ns text, operations bigint, duplicates bigint,
                                                     duplicate_rate float8, counters jsonb)
LANGUAGE sql AS $$
    SELECT ns, operations, duplicates, round(duplicate_rate::numeric, 3)::float8, counters
      FROM idem_stats WHERE kind = k AND ns LIKE 'st-%' ORDER BY ns;
$$;

-- claims: claimed, duplicate, in flight (idem_try_claim), rolled back
SELECT idem_claim('m1', 'st-claims'), idem_claim('m1', 'st-claims'), idem_claim('m2', 'st-claims');
SELECT idem_claim_batch(ARRAY['m2', 'm3', 'm4'], 'st-claims');
BEGIN;
SELECT idem_claim('m9', 'st-claims');
ROLLBACK;
BEGIN;
SELECT idem_claim('m5', 'st-claims');
SAVEPOINT s;
SELECT idem_claim('m6', 'st-claims'), idem_claim('m7', 'st-other');
ROLLBACK TO SAVEPOINT s;
SAVEPOINT t;
SELECT idem_claim('m8', 'st-claims');
RELEASE SAVEPOINT t;
COMMIT;
-- in flight: a claim held by a prepared transaction
BEGIN;
SELECT idem_claim('m10', 'st-claims');
PREPARE TRANSACTION 'idem_stats_pt';
SELECT idem_try_claim('m10', 'st-claims');
ROLLBACK PREPARED 'idem_stats_pt';
SELECT * FROM pg_temp.stats('claim');

-- many subtransactions of one transaction (a loop of exception blocks): the
-- counts of each that commits are added to its parent's, one entry per
-- namespace, not one per subtransaction kept until the session ends
CREATE TEMP TABLE top_mem AS
SELECT total_bytes FROM pg_backend_memory_contexts WHERE name = 'TopMemoryContext';
DO $$
BEGIN
    FOR i IN 1..5000 LOOP
        BEGIN
            PERFORM idem_claim('loop-' || i, 'st-loop');
            IF i % 5 = 0 THEN
                RAISE EXCEPTION 'undone';
            END IF;
        EXCEPTION WHEN raise_exception THEN
            NULL;
        END;
    END LOOP;
END;
$$;
SELECT ns, operations, counters->>'claimed' AS claimed FROM idem_stats WHERE kind = 'claim' AND ns = 'st-loop';
SELECT c.total_bytes - t.total_bytes < 100000 AS top_memory_bounded
  FROM pg_backend_memory_contexts c, top_mem t WHERE c.name = 'TopMemoryContext';

-- a prepared transaction is counted by COMMIT PREPARED, never when ROLLBACK
-- PREPARED rolls it back; one whose counts do not fit in its slot (more than
-- 8 namespaces) is counted when it is prepared
BEGIN;
SELECT idem_claim('p1', 'x2pc'), idem_claim('p1', 'x2pc');
PREPARE TRANSACTION 'idem-stats-rolled-back';
BEGIN;
SELECT idem_claim('p2', 'x2pc');
PREPARE TRANSACTION 'idem-stats-committed';
SELECT ns, counters FROM idem_stats WHERE kind = 'claim' AND ns = 'x2pc';
ROLLBACK PREPARED 'idem-stats-rolled-back';
SELECT ns, counters FROM idem_stats WHERE kind = 'claim' AND ns = 'x2pc';
COMMIT PREPARED 'idem-stats-committed';
SELECT ns, counters FROM idem_stats WHERE kind = 'claim' AND ns = 'x2pc';
BEGIN;
SELECT count(idem_claim('p3', 'x2pc-' || i)) FROM generate_series(1, 9) i;
PREPARE TRANSACTION 'idem-stats-many';
SELECT count(*) FROM idem_stats WHERE kind = 'claim' AND ns LIKE 'x2pc-%';
ROLLBACK PREPARED 'idem-stats-many';
-- a GID used again: each transaction is settled by its own outcome
BEGIN;
SELECT idem_claim('q1', 'x2pc-again');
PREPARE TRANSACTION 'idem-stats-again';
COMMIT PREPARED 'idem-stats-again';
BEGIN;
SELECT idem_claim('q2', 'x2pc-again'), idem_claim('q3', 'x2pc-again');
PREPARE TRANSACTION 'idem-stats-again';
SELECT ns, counters->>'claimed' AS claimed FROM idem_stats WHERE kind = 'claim' AND ns = 'x2pc-again';
ROLLBACK PREPARED 'idem-stats-again';
SELECT ns, counters->>'claimed' AS claimed FROM idem_stats WHERE kind = 'claim' AND ns = 'x2pc-again';

-- tokens: issued, consumed, and refused by reason
CREATE TEMP TABLE tok AS SELECT idem_token_issue('st-tokens', '1 hour') AS t;
SELECT idem_token_consume(t, 'st-tokens'), idem_token_consume(t, 'st-tokens') FROM tok;
SELECT idem_token_consume('not-a-token', 'st-tokens');
CREATE TEMP TABLE tok2 AS SELECT idem_token_issue('st-tokens', '1 millisecond') AS t;
SELECT pg_sleep(0.01);
SELECT idem_token_consume(t, 'st-tokens') FROM tok2;
SELECT * FROM pg_temp.stats('token');

-- transitions, by machine
CREATE TABLE st_orders (id int PRIMARY KEY, status text NOT NULL, version bigint NOT NULL DEFAULT 0);
SELECT idem_allow('st-order', 'new', 'paid');
SELECT idem_guard('st_orders', 'st-order', 'status', 'version');
INSERT INTO st_orders VALUES (1, 'new');
SELECT idem_transition('st_orders', '1', 'paid'), idem_transition('st_orders', '1', 'paid'),
       idem_transition('st_orders', '1', 'new'), idem_transition('st_orders', '2', 'paid');
SELECT * FROM pg_temp.stats('transition');

-- requests: statuses of begin, and finished requests
SELECT status FROM idem_request_begin('r1', 'fp', 'st-requests');
SELECT idem_request_finish('r1', 200, '{}', 'st-requests');
SELECT status FROM idem_request_begin('r1', 'fp', 'st-requests');
SELECT status FROM idem_request_begin('r1', 'other', 'st-requests');
SELECT * FROM pg_temp.stats('request');

-- outbox: sent, leased, delivered, retried, leased again, dead
SELECT idem_outbox_configure('st-topic', 2, '1 second', '1 second');
SELECT count(idem_outbox_send('st-topic', k, '{}')) FROM unnest(ARRAY['a', 'b', 'c']) k;
BEGIN;
SELECT idem_outbox_send('st-topic', 'z', '{}') IS NOT NULL AS rolled_back;
ROLLBACK;
CREATE TEMP TABLE leased AS SELECT id, key FROM idem_outbox_lease('st-relay') WHERE topic = 'st-topic';
SELECT idem_outbox_ack(array_agg(id)) FROM leased WHERE key = 'a';
SELECT idem_outbox_nack(id, 'down', '0') FROM leased WHERE key IN ('b', 'c');
SELECT count(*) FROM idem_outbox_lease('st-relay') WHERE topic = 'st-topic';
SELECT idem_outbox_nack(id, 'down') FROM leased WHERE key = 'b';
-- the rate is the share of leases that were redeliveries: one message leased
-- four times is 3 of 4, not 3 redeliveries per message sent
SELECT idem_outbox_configure('st-topic4', 10, '1 second', '1 second');
SELECT idem_outbox_send('st-topic4', 'k', '{}') IS NOT NULL AS sent;
SELECT idem_outbox_nack(id, 'down', '0') FROM idem_outbox_lease('st-relay') WHERE topic = 'st-topic4';
SELECT idem_outbox_nack(id, 'down', '0') FROM idem_outbox_lease('st-relay') WHERE topic = 'st-topic4';
SELECT idem_outbox_nack(id, 'down', '0') FROM idem_outbox_lease('st-relay') WHERE topic = 'st-topic4';
SELECT idem_outbox_nack(id, 'down', '0') FROM idem_outbox_lease('st-relay') WHERE topic = 'st-topic4';
SELECT * FROM pg_temp.stats('outbox');

-- the Prometheus text has a HELP and a TYPE line per counter, and every
-- sample line is "name{namespace="…",outcome="…"} value"
SELECT count(*) FILTER (WHERE l LIKE '# HELP %') AS help, count(*) FILTER (WHERE l LIKE '# TYPE %') AS type,
       count(*) FILTER (WHERE l !~ '^(# (HELP|TYPE) |idem_[a-z_]+(\{namespace="([^"\\]|\\.)*",outcome="[a-z_]+"\})? [0-9.e+]+$)') AS bad
  FROM regexp_split_to_table(rtrim(idem_metrics(), E'\n'), E'\n') l;
SELECT l AS bad_line FROM regexp_split_to_table(rtrim(idem_metrics(), E'\n'), E'\n') l
 WHERE l !~ '^(# (HELP|TYPE) |idem_[a-z_]+(\{namespace="([^"\\]|\\.)*",outcome="[a-z_]+"\})? [0-9.e+]+$)';
SELECT l FROM regexp_split_to_table(idem_metrics(), E'\n') l
 WHERE l LIKE 'idem_claims_total{namespace="st-claims"%' ORDER BY l;
-- label values are escaped
SELECT idem_claim('m', E'st-"quoted"\\');
SELECT l FROM regexp_split_to_table(idem_metrics(), E'\n') l
 WHERE l LIKE 'idem_claims_total{namespace="st-\\"quoted%claimed%';

-- reset: back to zero, the namespaces stay
SELECT idem_stats_reset();
SELECT ns, operations, duplicates, duplicate_rate FROM pg_temp.stats('claim');

-- who may read and reset them
CREATE ROLE regress_idem_stats_app;
SET ROLE regress_idem_stats_app;
SELECT count(*) FROM idem_stats;
SELECT idem_stats_reset();
RESET ROLE;
GRANT pg_monitor TO regress_idem_stats_app;
SET ROLE regress_idem_stats_app;
SELECT count(*) >= 0 AS monitor_reads FROM idem_stats;
SELECT idem_metrics() LIKE '# HELP%' AS monitor_scrapes;
SELECT idem_stats_reset();
RESET ROLE;
DROP ROLE regress_idem_stats_app;
