-- single-use tokens: outcomes, states, scopes, rollback and bad input
\set VERBOSITY terse

-- SQLSTATE of a statement, 'ok' when it succeeds
CREATE FUNCTION token_sqlstate(q text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END;
$$;

-- a token is 51 characters of unpadded base64url: 32 random bytes (the
-- secret), then 6 bytes (the hint: where its row is, hidden by a key)
SELECT idem_token_issue() AS t \gset
SELECT length(:'t') AS len,
       :'t' ~ '^[A-Za-z0-9_-]{51}$' AS url_safe,
       length(decode(translate(left(:'t', 43), '-_', '+/') || '=', 'base64')) AS random_bytes,
       length(decode(translate(right(:'t', 8), '-_', '+/'), 'base64')) AS hint_bytes;

-- every outcome of one token of the default scope
SELECT idem_token_status(:'t');
SELECT idem_token_consume(:'t');
SELECT idem_token_status(:'t');
SELECT idem_token_consume(:'t');
SELECT idem_token_consume(:'t', '');
SELECT idem_token_status(:'t');

-- scope isolation: a token is valid only in the scope it was issued for
SELECT idem_token_issue('user:42') AS u \gset
SELECT idem_token_status(:'u'), idem_token_status(:'u', 'user:43'),
       idem_token_status(:'u', 'USER:42');
SELECT idem_token_consume(:'u');
SELECT idem_token_consume(:'u', 'user:43');
SELECT idem_token_status(:'u', 'user:42');
SELECT idem_token_consume(:'u', 'user:42');
SELECT idem_token_consume(:'u', 'user:42');
SELECT idem_token_status(:'u', 'user:42'), idem_token_status(:'u', 'user:43');
-- a token of the default scope is unknown elsewhere
SELECT idem_token_issue() AS d \gset
SELECT idem_token_consume(:'d', 'user:42'), idem_token_status(:'d', 'user:42'),
       idem_token_status(:'d');
-- scopes of up to 63 bytes
SELECT idem_token_issue(repeat('s', 63)) AS long_scope \gset
SELECT idem_token_consume(:'long_scope', repeat('s', 63)),
       idem_token_status(:'long_scope', repeat('s', 63));

-- well-formed but never issued: unknown
SELECT idem_token_consume(repeat('A', 51)), idem_token_status(repeat('A', 51));

-- malformed tokens are answers, not errors: the transaction goes on
BEGIN;
SELECT idem_token_consume(''), idem_token_status('');
SELECT idem_token_consume('x'), idem_token_status('x');
SELECT idem_token_consume(:'t' || 'A'), idem_token_status(:'t' || 'A');
SELECT idem_token_consume(left(:'t', 50)), idem_token_status(left(:'t', 50));
SELECT idem_token_consume(left(:'t', 43)), idem_token_status(left(:'t', 43));
SELECT idem_token_consume(repeat('+', 51)), idem_token_status(repeat('/', 51));
SELECT idem_token_consume(repeat('=', 51)), idem_token_status(repeat('.', 51));
SELECT idem_token_consume(left(:'t', 49) || 'é'), idem_token_status(left(:'t', 49) || 'é');
SELECT idem_token_consume(left(:'t', 43) || '=======A'), idem_token_status(left(:'t', 43) || '.......A');
SELECT idem_token_consume(repeat('A', 1000000)), idem_token_status(repeat('A', 1000000));
SELECT 'still in the transaction' AS went_on;
COMMIT;

-- the time is the transaction's start: a token expires at now() + ttl
BEGIN;
SELECT idem_token_issue('ttl', '10 minutes') AS ttl_token \gset
SELECT expires_at = now() + interval '10 minutes' AS expires_at_now_plus_ttl,
       consumed_at IS NULL AS not_consumed
  FROM idem.tokens
 WHERE scope = 'ttl' AND digest = sha256(convert_to(left(:'ttl_token', 43), 'UTF8'));
SELECT idem_token_consume(:'ttl_token', 'ttl');
SELECT consumed_at = now() AS consumed_at_now
  FROM idem.tokens
 WHERE scope = 'ttl' AND digest = sha256(convert_to(left(:'ttl_token', 43), 'UTF8'));
COMMIT;
-- the default ttl is 30 minutes
BEGIN;
SELECT idem_token_issue('ttl') AS ttl_default \gset
SELECT expires_at = now() + interval '30 minutes' AS default_ttl
  FROM idem.tokens
 WHERE scope = 'ttl' AND digest = sha256(convert_to(left(:'ttl_default', 43), 'UTF8'));
COMMIT;

-- expiry: a token of two seconds is expired after a pause
SELECT idem_token_issue('exp', '2 seconds') AS e1 \gset
SELECT idem_token_issue('exp', '2 seconds') AS e2 \gset
SELECT idem_token_consume(:'e2', 'exp');
SELECT idem_token_status(:'e1', 'exp'), idem_token_status(:'e2', 'exp');
SELECT pg_sleep(2.1);
SELECT idem_token_status(:'e1', 'exp'), idem_token_status(:'e2', 'exp');
SELECT idem_token_consume(:'e1', 'exp');
SELECT idem_token_status(:'e1', 'exp');

-- a rolled-back transaction gives the token back
SELECT idem_token_issue('rb') AS r \gset
BEGIN;
SELECT idem_token_consume(:'r', 'rb');
SELECT idem_token_status(:'r', 'rb');
SELECT idem_token_consume(:'r', 'rb');
ROLLBACK;
SELECT idem_token_status(:'r', 'rb');

-- ... and so does a rolled-back savepoint
BEGIN;
SAVEPOINT sp;
SELECT idem_token_consume(:'r', 'rb');
ROLLBACK TO SAVEPOINT sp;
SELECT idem_token_status(:'r', 'rb');
SELECT idem_token_consume(:'r', 'rb');
COMMIT;
SELECT idem_token_status(:'r', 'rb');
SELECT idem_token_consume(:'r', 'rb');

-- a released savepoint keeps the consumption
SELECT idem_token_issue('rb') AS r2 \gset
BEGIN;
SAVEPOINT sp;
SELECT idem_token_consume(:'r2', 'rb');
RELEASE SAVEPOINT sp;
ROLLBACK;
SELECT idem_token_status(:'r2', 'rb');
BEGIN;
SAVEPOINT sp;
SELECT idem_token_consume(:'r2', 'rb');
RELEASE SAVEPOINT sp;
COMMIT;
SELECT idem_token_status(:'r2', 'rb'), idem_token_consume(:'r2', 'rb');

-- a token issued by a rolled-back transaction was never issued
BEGIN;
SELECT idem_token_issue('rb') AS r3 \gset
SELECT idem_token_status(:'r3', 'rb');
ROLLBACK;
SELECT idem_token_status(:'r3', 'rb'), idem_token_consume(:'r3', 'rb');

-- one statement: issued and consumed, consumed twice
SELECT idem_token_consume(idem_token_issue('stmt'), 'stmt');
SELECT idem_token_issue('stmt') AS s \gset
SELECT idem_token_consume(:'s', 'stmt') AS first,
       idem_token_consume(:'s', 'stmt') AS second,
       idem_token_status(:'s', 'stmt') AS status;

-- many tokens, all distinct, each consumed exactly once
CREATE TEMP TABLE many AS
    SELECT idem_token_issue('many') AS t FROM generate_series(1, 2000);
SELECT count(*) AS issued, count(DISTINCT t) AS distinct_tokens,
       count(*) FILTER (WHERE t ~ '^[A-Za-z0-9_-]{51}$') AS url_safe
  FROM many;
SELECT count(*) FILTER (WHERE idem_token_consume(t, 'many')) AS consumed
  FROM many;
SELECT count(*) FILTER (WHERE idem_token_consume(t, 'many')) AS consumed_again
  FROM many;
SELECT idem_token_status(t, 'many') AS status, count(*) FROM many GROUP BY 1;

-- bad input: clear errors with their SQLSTATEs
SELECT idem_token_issue(NULL);
SELECT idem_token_issue('', NULL);
SELECT idem_token_issue('', '0');
SELECT idem_token_issue('', '1 year 1 second');
SELECT idem_token_issue(repeat('s', 64));
SELECT idem_token_consume(NULL);
SELECT idem_token_consume(:'t', NULL);
SELECT idem_token_status(NULL, '');
SELECT q, token_sqlstate(q) FROM (VALUES
    ('SELECT idem_token_issue(NULL)'),
    ('SELECT idem_token_issue(NULL, ''1 hour'')'),
    ('SELECT idem_token_issue('''', NULL)'),
    ('SELECT idem_token_issue('''', ''0'')'),
    ('SELECT idem_token_issue('''', ''-1 second'')'),
    ('SELECT idem_token_issue('''', ''1 day -48 hours'')'),
    ('SELECT idem_token_issue('''', ''1 month -32 days'')'),
    ('SELECT idem_token_issue('''', ''1 month -1 day'')'),
    ('SELECT idem_token_issue('''', ''-100000 years'')'),
    ('SELECT idem_token_issue('''', ''1 microsecond'')'),
    ('SELECT idem_token_issue('''', ''1 year'')'),
    ('SELECT idem_token_issue('''', ''1 year 1 second'')'),
    ('SELECT idem_token_issue('''', ''13 months'')'),
    ('SELECT idem_token_issue('''', ''367 days'')'),
    ('SELECT idem_token_issue('''', ''100000 years'')'),
    ('SELECT idem_token_issue('''', ''2147483647 days'')'),
    ('SELECT idem_token_issue('''', ''-876600 hours 36526 days'')'),
    ('SELECT idem_token_issue('''', ''36526 months -1111730 days'')'),
    ('SELECT idem_token_issue('''', ''2001 years'')'),
    ('SELECT idem_token_issue(repeat(''s'', 63))'),
    ('SELECT idem_token_issue(repeat(''s'', 64))'),
    ('SELECT idem_token_issue(repeat(''é'', 32))'),
    ('SELECT idem_token_consume(NULL)'),
    ('SELECT idem_token_consume(NULL, ''x'')'),
    ('SELECT idem_token_consume(''x'', NULL)'),
    ('SELECT idem_token_consume(''x'', repeat(''s'', 64))'),
    ('SELECT idem_token_status(NULL)'),
    ('SELECT idem_token_status(''x'', NULL)'),
    ('SELECT idem_token_status(''x'', repeat(''s'', 64))'),
    ('SELECT idem_token_purge(NULL)'),
    ('SELECT idem_token_purge(0)'),
    ('SELECT idem_token_purge(-1)')) AS v(q);

-- a ttl whose fields nearly cancel is judged by its sum (1 day here); beyond
-- 2,000 years in a field, fields of both signs are refused as such
BEGIN;
SET LOCAL TIME ZONE 'UTC';  -- no daylight saving time between the two dates
SELECT idem_token_issue('far', '-876600 hours 36526 days') AS far_token \gset
SELECT expires_at - now() AS ttl FROM idem.tokens
 WHERE scope = 'far' AND digest = sha256(convert_to(left(:'far_token', 43), 'UTF8'));
COMMIT;
SELECT idem_token_issue('', '36526 months -1111730 days');

-- writes are refused where an INSERT would be; status is a read
BEGIN READ ONLY;
SELECT token_sqlstate(format('SELECT idem_token_consume(%L)', :'d')) AS consume,
       token_sqlstate('SELECT idem_token_issue()') AS issue,
       token_sqlstate(format('SELECT idem_token_status(%L)', :'d')) AS status;
SELECT idem_token_status(:'d');
ROLLBACK;
SELECT idem_token_status(:'d');

-- privileges: anyone may use tokens; nobody but the owner reads them or
-- purges them
CREATE ROLE regress_token_user;
SET ROLE regress_token_user;
SELECT idem_token_issue('role') AS p \gset
SELECT idem_token_status(:'p', 'role'), idem_token_consume(:'p', 'role'),
       idem_token_consume(:'p', 'role');
SELECT token_sqlstate('SELECT count(*) FROM idem.tokens') AS read_table,
       token_sqlstate('SELECT idem_token_purge()') AS purge;
RESET ROLE;
DROP ROLE regress_token_user;
SELECT p.proname, p.prosecdef, p.proconfig,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute
  FROM pg_proc p
 WHERE p.proname LIKE 'idem\_token\_%'
 ORDER BY p.proname;

DROP FUNCTION token_sqlstate(text);
