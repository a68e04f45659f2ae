-- consumer dedup: retention (the dedup horizon) and purge
\set VERBOSITY terse

-- err(query): the SQLSTATE and message of the error the query raises
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- The namespaces of this file start with "ret_".  Claims are made old by
-- moving their claimed_at back, as only a test may do.
CREATE FUNCTION pg_temp.age_claims(space text, pattern text, age interval) RETURNS bigint
LANGUAGE sql AS $$
    WITH u AS (UPDATE idem.claims SET claimed_at = now() - age
                WHERE ns = space AND msg_id LIKE pattern RETURNING 1)
    SELECT count(*) FROM u;
$$;
CREATE FUNCTION pg_temp.left_in(space text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT coalesce(array_agg(msg_id ORDER BY msg_id), '{}') FROM idem.claims WHERE ns = space;
$$;

-- Start from a table with nothing older than its horizon, whatever ran
-- before in this database.
SELECT idem_purge(NULL, 1000000) >= 0 AS cleared;

--
-- the default retention is 7 days
--
SELECT count(*) AS settings FROM idem.namespaces WHERE ns LIKE 'ret\_%';
SELECT idem_claim_batch(ARRAY['r1', 'r2', 'r3', 'r4'], 'ret_default');
-- claims just made are never purged
SELECT idem_purge('ret_default');
SELECT idem_purge();
SELECT pg_temp.left_in('ret_default');
-- younger than 7 days: kept; exactly 7 days: kept; older: purged
BEGIN;
SELECT pg_temp.age_claims('ret_default', 'r1', '6 days 23:00:00');
SELECT pg_temp.age_claims('ret_default', 'r2', '7 days');
SELECT pg_temp.age_claims('ret_default', 'r3', '7 days 00:00:00.000001');
SELECT pg_temp.age_claims('ret_default', 'r4', '30 days');
SELECT idem_purge('ret_default');
SELECT pg_temp.left_in('ret_default');
-- the kept claims are made young again: the 7-day-old one would be purged
-- by the next purge
SELECT pg_temp.age_claims('ret_default', 'r%', '0');
COMMIT;
-- a purged id can be claimed again; the kept ones are still duplicates
BEGIN;
SELECT idem_claim_batch(ARRAY['r1', 'r2', 'r3', 'r4'], 'ret_default');
SELECT idem_claim_info('r3', 'ret_default') = now() AS reclaimed_now,
       idem_claim_info('r1', 'ret_default') < now() AS kept_older;
COMMIT;

--
-- a namespace with a short retention: only rows older than its horizon,
-- and only in that namespace, are purged
--
SELECT idem_set_retention('ret_short', '1 day');
SELECT ns, retention FROM idem.namespaces WHERE ns LIKE 'ret\_%' ORDER BY ns;
SELECT idem_claim_batch(ARRAY['s_old1', 's_old2', 's_old3', 's_new1', 's_new2'], 'ret_short');
SELECT idem_claim_batch(ARRAY['s_old1', 's_old2', 's_new1'], 'ret_other');
SELECT pg_temp.age_claims('ret_short', 's\_old%', '2 days');
SELECT pg_temp.age_claims('ret_short', 's\_new2', '23 hours');
SELECT pg_temp.age_claims('ret_other', 's\_old%', '2 days');
SELECT idem_purge('ret_short');
SELECT pg_temp.left_in('ret_short') AS ret_short, pg_temp.left_in('ret_other') AS ret_other;
-- ret_other keeps 7 days: its 2-day-old claims stay, even when every
-- namespace is purged
SELECT idem_purge();
SELECT pg_temp.left_in('ret_short') AS ret_short, pg_temp.left_in('ret_other') AS ret_other;
SELECT idem_claim('s_old1', 'ret_other') AS other_still_dup,
       idem_claim('s_old1', 'ret_short') AS short_claimable;

--
-- changing the retention: the last setting counts, and one row is kept
-- per namespace
--
SELECT idem_set_retention('ret_change', '1 day');
SELECT idem_set_retention('ret_change', '3 days');
SELECT ns, retention FROM idem.namespaces WHERE ns = 'ret_change';
SELECT idem_claim_batch(ARRAY['c1', 'c2'], 'ret_change');
SELECT pg_temp.age_claims('ret_change', 'c%', '2 days');
SELECT idem_purge('ret_change');
SELECT idem_set_retention('ret_change', '1 day');
SELECT idem_purge('ret_change');
SELECT pg_temp.left_in('ret_change');
-- a longer unit: a month, which lasts 28 to 31 days
SELECT idem_set_retention('ret_change', '1 mon');
SELECT ns, retention FROM idem.namespaces WHERE ns = 'ret_change';
SELECT idem_claim_batch(ARRAY['c1', 'c2'], 'ret_change');
SELECT pg_temp.age_claims('ret_change', 'c1', '27 days');
SELECT pg_temp.age_claims('ret_change', 'c2', '32 days');
SELECT idem_purge('ret_change');
SELECT pg_temp.left_in('ret_change');
-- a setting may be made before the namespace has any claim, and a
-- namespace with settings but no claims purges nothing
SELECT idem_set_retention('ret_empty', '1 second');
SELECT idem_purge('ret_empty');
SELECT ns, retention FROM idem.namespaces WHERE ns LIKE 'ret\_%' ORDER BY ns;

--
-- max_rows bounds one call
--
SELECT idem_set_retention('ret_batch', '1 hour');
SELECT idem_claim_batch(ARRAY['b1', 'b2', 'b3', 'b4', 'b5', 'b6'], 'ret_batch');
SELECT pg_temp.age_claims('ret_batch', 'b_', '2 hours');
SELECT pg_temp.age_claims('ret_batch', 'b6', '50 minutes');
SELECT idem_purge('ret_batch', 2);
SELECT idem_purge('ret_batch', 2);
SELECT idem_purge('ret_batch', 2);
SELECT idem_purge('ret_batch', 2);
SELECT pg_temp.left_in('ret_batch');
-- across namespaces, the budget is shared by all of them
SELECT idem_claim_batch(ARRAY['b1', 'b2', 'b3'], 'ret_batch'),
       idem_claim_batch(ARRAY['b1', 'b2', 'b3'], 'ret_short');
SELECT pg_temp.age_claims('ret_batch', 'b_', '2 hours') AS batch_aged,
       pg_temp.age_claims('ret_batch', 'b6', '50 minutes') AS batch_young,
       pg_temp.age_claims('ret_short', 'b_', '2 days') AS short_aged;
-- 3 + 3 rows are past their horizon, and no other row is
SELECT ns, count(*) AS eligible FROM idem.claims
 WHERE claimed_at < now() - idem.retention_of(ns) GROUP BY ns ORDER BY ns;
-- namespaces are purged in order: 3 from ret_batch, then 1 from ret_short
SELECT idem_purge(NULL, 4);
SELECT pg_temp.left_in('ret_batch') AS ret_batch,
       (SELECT count(*) FROM idem.claims WHERE ns = 'ret_short' AND msg_id LIKE 'b_') AS ret_short_b;
SELECT idem_purge(NULL, 4);
SELECT idem_purge(NULL, 4);
SELECT pg_temp.left_in('ret_batch') AS ret_batch, pg_temp.left_in('ret_short') AS ret_short;
-- purge(ns) leaves the other namespaces alone, whatever their age
SELECT idem_claim('x1', 'ret_batch'), idem_claim('x1', 'ret_short');
SELECT pg_temp.age_claims('ret_batch', 'x1', '3 days') AS batch_aged,
       pg_temp.age_claims('ret_short', 'x1', '3 days') AS short_aged;
SELECT idem_purge('ret_short', 10);
SELECT idem_claim_info('x1', 'ret_batch') IS NOT NULL AS batch_kept,
       idem_claim_info('x1', 'ret_short') IS NULL AS short_purged;
SELECT idem_purge('ret_batch', 10);
SELECT idem_claim_info('x1', 'ret_batch') IS NULL AS batch_purged;

--
-- misuse, with SQLSTATEs; none of it changes a setting
--
SELECT pg_temp.err($$SELECT idem_set_retention(NULL, '1 day')$$);
SELECT pg_temp.err($$SELECT idem_set_retention('', '1 day')$$);
SELECT pg_temp.err($$SELECT idem_set_retention(repeat('n', 64), '1 day')$$);
SELECT pg_temp.err($$SELECT idem_set_retention('ret_short', NULL)$$);
SELECT pg_temp.err($$SELECT idem_set_retention('ret_short', '0')$$);
SELECT pg_temp.err($$SELECT idem_set_retention('ret_short', '-1 day')$$);
SELECT pg_temp.err($$SELECT idem_set_retention('ret_short', '1 day -24 hours')$$);
SELECT pg_temp.err($$SELECT idem_set_retention('ret_short', '-1 microsecond')$$);
SELECT pg_temp.err($$SELECT idem_purge('ret_short', NULL)$$);
SELECT pg_temp.err($$SELECT idem_purge('ret_short', 0)$$);
SELECT pg_temp.err($$SELECT idem_purge('ret_short', -5)$$);
SELECT pg_temp.err($$SELECT idem_purge(NULL, NULL)$$);
SELECT pg_temp.err($$SELECT idem_purge('')$$);
SELECT pg_temp.err($$SELECT idem_purge(repeat('n', 64))$$);
SELECT ns, retention FROM idem.namespaces WHERE ns LIKE 'ret\_%' ORDER BY ns;
\set VERBOSITY default
\set SHOW_CONTEXT never
SELECT idem_set_retention('ret_short', '-2 days');
SELECT idem_purge('ret_short', 0);
\set VERBOSITY terse
\set SHOW_CONTEXT errors
-- the longest retention is 100 years: beyond, and for an interval whose
-- fields cancel out in the comparison but take no timestamp back, 22023
SELECT pg_temp.err($$SELECT idem_set_retention('ret_huge', '10000 years')$$);
SELECT pg_temp.err($$SELECT idem_set_retention('ret_huge', '100 years 1 second')$$);
SELECT pg_temp.err($$SELECT idem_set_retention('ret_huge', '-333333 years 120029880 days')$$);
SELECT ns FROM idem.namespaces WHERE ns = 'ret_huge';
SELECT idem_set_retention('ret_huge', '100 years');
SELECT ns, retention FROM idem.namespaces WHERE ns = 'ret_huge';
-- 100 years are 1,200 months or 36,525 days (an interval compares a month
-- as 30 days: 36,001 days are not more than 100 years)
SELECT idem_set_retention('ret_days', '36001 days'), idem_set_retention('ret_days', '36525 days'),
       idem_set_retention('ret_days', '1200 mons');
SELECT pg_temp.err($$SELECT idem_set_retention('ret_days', '36526 days')$$);
SELECT pg_temp.err($$SELECT idem_set_retention('ret_days', '1201 mons')$$);
-- and any mix of months and days that adds up to no more, a month counting
-- as 30.4375 days (an interval's comparison, at 30 days, took 1 month and
-- 36,000 days for more than 1,200 months)
SELECT idem_set_retention('ret_days', '1 mon 36000 days'), idem_set_retention('ret_days', '1199 mons 30 days'),
       idem_set_retention('ret_days', '99 years 365 days 6 hours');
SELECT pg_temp.err($$SELECT idem_set_retention('ret_days', '1 mon 36495 days')$$);
SELECT pg_temp.err($$SELECT idem_set_retention('ret_days', '99 years 365 days 6 hours 1 second')$$);
SELECT ns, retention FROM idem.namespaces WHERE ns = 'ret_days';
DELETE FROM idem.namespaces WHERE ns = 'ret_days';
-- a retention stored before the bound (by 0.1.0, or by hand) that no
-- timestamp can be taken back by leaves purge working: nothing in its
-- namespace is that old, and every other namespace is purged as before
INSERT INTO idem.namespaces VALUES ('ret_stored', '10000 years'), ('ret_stored2', '-333333 years 120029880 days');
SELECT idem_claim('h1', 'ret_stored'), idem_claim('h1', 'ret_stored2'), idem_claim('h1', 'ret_huge'),
       idem_claim('h1', 'ret_default');
SELECT pg_temp.age_claims('ret_stored', 'h1', '1000 years') AS stored_aged,
       pg_temp.age_claims('ret_stored2', 'h1', '1000 years') AS stored2_aged,
       pg_temp.age_claims('ret_huge', 'h1', '101 years') AS huge_aged,
       pg_temp.age_claims('ret_default', 'h1', '8 days') AS default_aged;
SELECT idem_purge('ret_stored') AS stored, idem_purge('ret_stored2') AS stored2;
SELECT idem_purge() AS every_namespace;
SELECT ns, msg_id FROM idem.claims WHERE msg_id = 'h1' ORDER BY ns;
DELETE FROM idem.namespaces WHERE ns IN ('ret_stored', 'ret_stored2', 'ret_huge');
DELETE FROM idem.claims WHERE ns IN ('ret_stored', 'ret_stored2');
-- a retention with fields of both signs (0.1.0 took them) is a span that
-- depends on the date (one month less 33 days is 2 to 5 days back): the
-- purge keeps its claims, with a warning, even one older than any span it
-- can mean
INSERT INTO idem.namespaces VALUES ('ret_mixed', '-1 mon +33 days');
SELECT idem_claim('m1', 'ret_mixed'), pg_temp.age_claims('ret_mixed', 'm1', '6 days') AS mixed_aged;
SELECT idem_purge('ret_mixed') AS mixed, idem_purge() AS every_namespace;
SELECT ns, msg_id FROM idem.claims WHERE ns = 'ret_mixed';
DELETE FROM idem.namespaces WHERE ns = 'ret_mixed';
DELETE FROM idem.claims WHERE ns = 'ret_mixed';
-- the smallest retention there is
SELECT idem_set_retention('ret_tiny', '1 microsecond');
SELECT idem_claim('t1', 'ret_tiny');
SELECT pg_temp.age_claims('ret_tiny', 't1', '1 second');
SELECT idem_purge('ret_tiny');

--
-- privileges: purge and settings are for administrators; claims are for
-- everyone
--
CREATE ROLE idem_test_app;
SET ROLE idem_test_app;
SELECT pg_temp.err($$SELECT idem_purge()$$);
SELECT pg_temp.err($$SELECT idem_purge('ret_short', 10)$$);
SELECT pg_temp.err($$SELECT idem_set_retention('ret_short', '1 year')$$);
SELECT pg_temp.err($$SELECT * FROM idem.claims$$);
SELECT pg_temp.err($$SELECT * FROM idem.namespaces$$);
SELECT pg_temp.err($$DELETE FROM idem.claims$$);
SELECT pg_temp.err($$SELECT idem.retention_of('ret_short')$$);
SELECT idem_claim('app1', 'ret_app'), idem_claim('app1', 'ret_app');
SELECT idem_try_claim('app2', 'ret_app'), idem_claim_batch(ARRAY['app2', 'app3'], 'ret_app');
SELECT idem_claim_info('app1', 'ret_app') IS NOT NULL AS info;
-- releasing makes a message be processed again: an administration function
SELECT pg_temp.err($$SELECT idem_release('app3', 'ret_app')$$);
RESET ROLE;
SELECT idem_release('app3', 'ret_app') AS released;
SELECT pg_temp.left_in('ret_app');
SELECT ns, retention FROM idem.namespaces WHERE ns = 'ret_short';
-- an administrator may hand purge to a role: it then runs as the owner
GRANT EXECUTE ON FUNCTION idem_purge(text, int) TO idem_test_app;
SELECT pg_temp.age_claims('ret_app', 'app1', '8 days');
SET ROLE idem_test_app;
SELECT idem_purge('ret_app');
SELECT pg_temp.err($$SELECT idem_set_retention('ret_app', '1 day')$$);
RESET ROLE;
SELECT pg_temp.left_in('ret_app');
REVOKE EXECUTE ON FUNCTION idem_purge(text, int) FROM idem_test_app;
SET ROLE idem_test_app;
SELECT pg_temp.err($$SELECT idem_purge('ret_app')$$);
RESET ROLE;
DROP ROLE idem_test_app;
