-- single-use tokens at the exact moment of their expiry: consumption,
-- status and purge all take a token whose expires_at equals now() as
-- expired.  Tokens are moved in time by setting their expires_at, as only a
-- test may do; every step runs in one transaction, where now() stands still.
-- The scopes of this file start with "tx_"; it leaves no row behind.
\set VERBOSITY terse

-- the row of a token, for moving its expiry
CREATE FUNCTION pg_temp.set_expiry(tok text, sc text, at timestamptz) RETURNS bigint
LANGUAGE sql AS $$
    WITH u AS (UPDATE idem.tokens SET expires_at = at
                WHERE scope = sc AND digest = sha256(convert_to(left(tok, 43), 'UTF8'))
            RETURNING 1)
    SELECT count(*) FROM u;
$$;
CREATE FUNCTION pg_temp.rows_of(sc text) RETURNS bigint
LANGUAGE sql AS $$ SELECT count(*) FROM idem.tokens WHERE scope = sc $$;

--
-- consumption and status at the boundary: expired at expires_at = now(),
-- still valid one microsecond before
--
BEGIN;
SELECT idem_token_issue('tx_edge', '1 hour') AS at_now \gset
SELECT idem_token_issue('tx_edge', '1 hour') AS just_after \gset
SELECT idem_token_issue('tx_edge', '1 hour') AS just_before \gset
SELECT pg_temp.set_expiry(:'at_now', 'tx_edge', now()) AS moved,
       pg_temp.set_expiry(:'just_after', 'tx_edge', now() + interval '1 microsecond') AS moved,
       pg_temp.set_expiry(:'just_before', 'tx_edge', now() - interval '1 microsecond') AS moved;
SELECT idem_token_status(:'at_now', 'tx_edge') AS at_now,
       idem_token_status(:'just_after', 'tx_edge') AS just_after,
       idem_token_status(:'just_before', 'tx_edge') AS just_before;
SELECT idem_token_consume(:'at_now', 'tx_edge') AS at_now,
       idem_token_consume(:'just_after', 'tx_edge') AS just_after,
       idem_token_consume(:'just_before', 'tx_edge') AS just_before;
-- nothing was written for the expired ones
SELECT count(*) FILTER (WHERE consumed_at IS NOT NULL) AS consumed,
       count(*) FILTER (WHERE consumed_at IS NULL) AS not_consumed
  FROM idem.tokens WHERE scope = 'tx_edge';
SELECT idem_token_status(:'at_now', 'tx_edge') AS at_now,
       idem_token_status(:'just_after', 'tx_edge') AS just_after,
       idem_token_status(:'just_before', 'tx_edge') AS just_before;
COMMIT;

-- a consumed token whose expiry comes is expired, not consumed: the state
-- that no longer matters is not reported
BEGIN;
SELECT pg_temp.set_expiry(:'just_after', 'tx_edge', now()) AS moved;
SELECT idem_token_status(:'just_after', 'tx_edge') AS consumed_then_expired,
       idem_token_consume(:'just_after', 'tx_edge') AS consume;
ROLLBACK;

--
-- purge at the boundary: a token that expires at now() goes, one that
-- expires one microsecond later stays
--
BEGIN;
-- whatever expired before, in any scope, goes first: the purges below then
-- see only this file's rows
SELECT idem_token_purge(1000000) >= 0 AS cleared;
SELECT idem_token_issue('tx_purge', '1 hour') AS p_now \gset
SELECT idem_token_issue('tx_purge', '1 hour') AS p_after \gset
SELECT idem_token_issue('tx_purge', '1 hour') AS p_consumed \gset
SELECT idem_token_consume(:'p_consumed', 'tx_purge') AS consumed;
SELECT pg_temp.set_expiry(:'p_now', 'tx_purge', now()) AS moved,
       pg_temp.set_expiry(:'p_after', 'tx_purge', now() + interval '1 microsecond') AS moved,
       pg_temp.set_expiry(:'p_consumed', 'tx_purge', now()) AS moved;
SELECT idem_token_purge() AS purged;
SELECT idem_token_status(:'p_now', 'tx_purge') AS p_now,
       idem_token_status(:'p_after', 'tx_purge') AS p_after,
       idem_token_status(:'p_consumed', 'tx_purge') AS p_consumed;
SELECT idem_token_purge() AS purged_again;
COMMIT;
SELECT pg_temp.rows_of('tx_purge') AS rows_left;
DELETE FROM idem.tokens WHERE scope IN ('tx_edge', 'tx_purge');

--
-- max_rows: exactly that many rows go, the ones that expired first
--
BEGIN;
SELECT idem_token_purge(1000000) >= 0 AS cleared;
SELECT idem_token_issue('tx_max', '1 hour') AS m1 \gset
SELECT idem_token_issue('tx_max', '1 hour') AS m2 \gset
SELECT idem_token_issue('tx_max', '1 hour') AS m3 \gset
SELECT idem_token_issue('tx_max', '1 hour') AS m4 \gset
SELECT idem_token_issue('tx_max', '1 hour') AS m5 \gset
-- issued in one order, expired in another
SELECT pg_temp.set_expiry(:'m1', 'tx_max', now() - interval '1 hour') AS moved,
       pg_temp.set_expiry(:'m2', 'tx_max', now() - interval '3 hours') AS moved,
       pg_temp.set_expiry(:'m3', 'tx_max', now() - interval '2 hours') AS moved,
       pg_temp.set_expiry(:'m4', 'tx_max', now()) AS moved;
SELECT idem_token_purge(1) AS purged;
SELECT idem_token_status(:'m2', 'tx_max') AS m2;
SELECT idem_token_purge(2) AS purged;
SELECT idem_token_status(:'m1', 'tx_max') AS m1, idem_token_status(:'m3', 'tx_max') AS m3,
       idem_token_status(:'m4', 'tx_max') AS m4;
SELECT idem_token_purge(2) AS purged;
SELECT idem_token_purge(2) AS purged;
SELECT idem_token_status(:'m1', 'tx_max') AS m1, idem_token_status(:'m2', 'tx_max') AS m2,
       idem_token_status(:'m3', 'tx_max') AS m3, idem_token_status(:'m4', 'tx_max') AS m4,
       idem_token_status(:'m5', 'tx_max') AS m5;
COMMIT;
SELECT pg_temp.rows_of('tx_max') AS rows_left;
DELETE FROM idem.tokens WHERE scope = 'tx_max';

--
-- the longest ttl: exactly one calendar year, to the microsecond
--
BEGIN;
SELECT idem_token_issue('tx_year', '1 year') AS y \gset
SELECT expires_at = now() + interval '1 year' AS one_year
  FROM idem.tokens WHERE scope = 'tx_year';
SELECT idem_token_status(:'y', 'tx_year');
ROLLBACK;
SELECT idem_token_issue('tx_year', '12 months') IS NOT NULL AS twelve_months,
       idem_token_issue('tx_year', '1 year -1 microsecond') IS NOT NULL AS just_under;
SELECT idem_token_issue('tx_year', '1 year 1 microsecond');
SELECT idem_token_issue('tx_year', '12 months 1 microsecond');
SELECT idem_token_issue('tx_year', '11 months 1 day') IS NOT NULL AS under_a_year;
DELETE FROM idem.tokens WHERE scope = 'tx_year';
