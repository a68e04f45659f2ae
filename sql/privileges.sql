-- privileges: what a role may do with idem, with no grant and with the one
-- grant of a stricter setup
--
-- idem's user functions keep PostgreSQL's default EXECUTE for PUBLIC; its
-- administration functions (idem_release among them: it makes a message be
-- processed again) and its internal functions are revoked from PUBLIC, but
-- the four of the outbox's ids, which compute and read nothing and which the
-- CHECK constraint of idem.outbox runs as its writer; the schema idem and its
-- tables are reachable by no one but their owner.  An application role
-- therefore needs no grant at all (idem_transition also needs UPDATE and
-- SELECT on the table it moves a row of, as a plain UPDATE would).
--
-- A DBA who runs
--
--   REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC;
--
-- gives an application role idem's user functions with this one statement:
--
--   GRANT EXECUTE ON FUNCTION idem_claim(text, text), idem_try_claim(text, text), idem_claim_batch(text[], text),
--       idem_claim_info(text, text), idem_token_issue(text, interval),
--       idem_token_consume(text, text), idem_token_status(text, text),
--       idem_request_begin(text, text, text, interval), idem_request_checkpoint(text, text, jsonb, text),
--       idem_request_finish(text, int, jsonb, text, boolean), idem_request_fingerprint(jsonb),
--       idem_transition(regclass, text, text, bigint), idem_transition(regclass, text[], text, bigint),
--       idem_outbox_send(text, text, jsonb, jsonb, text),
--       idem_offset_advance(text, text, int, bigint), idem_offset_get(text, text, int),
--       idem_seq_accept(text, bigint, int) TO app;
--
-- (the README's, run below as it is written)
--
-- and an administration role the rest with:
--
--   GRANT EXECUTE ON FUNCTION
--       idem_release(text, text),
--       idem_purge(text, integer), idem_set_retention(text, interval),
--       idem_token_purge(integer),
--       idem_request_purge(integer), idem_request_set_retention(text, interval),
--       idem_allow(text, text, text), idem_disallow(text, text, text),
--       idem_guard(regclass, text, name, name), idem_unguard(regclass),
--       idem_guard_trigger(),
--       idem_offset_reset(text, text, integer, bigint)
--     TO admin;
--
-- (idem_guard_trigger() is needed by whoever creates a guard, since
-- idem_guard creates the trigger as its caller; a guard fires for every
-- role whatever its privileges on the trigger function.)  The SECURITY
-- DEFINER administration functions do their work as the extension's owner:
-- neither role needs any privilege on idem's tables.
\set VERBOSITY terse

CREATE ROLE regress_idem_app;
CREATE ROLE regress_idem_admin;
-- holds USAGE on the schema idem, to show that the tables are closed too
CREATE ROLE regress_idem_usage;
GRANT USAGE ON SCHEMA idem TO regress_idem_usage;

-- one statement run as the current role: 'ok', or its SQLSTATE and message
CREATE FUNCTION pg_temp.outcome(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;

-- every function of idem: may PUBLIC run it, does it run as its owner
CREATE TEMP VIEW idem_functions AS
SELECT p.oid::regprocedure AS function,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute,
       p.prosecdef AS security_definer,
       p.pronamespace::regnamespace AS schema,
       p.prorettype = 'trigger'::regtype AS is_trigger
  FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
 WHERE d.classid = 'pg_proc'::regclass
   AND d.refclassid = 'pg_extension'::regclass
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
   AND d.deptype = 'e';
GRANT SELECT ON idem_functions TO PUBLIC;
SELECT function, public_execute, security_definer
  FROM idem_functions ORDER BY function::text;

-- PUBLIC reaches nothing in the schema idem
SELECT has_schema_privilege('public', 'idem', 'USAGE') AS usage,
       has_schema_privilege('public', 'idem', 'CREATE') AS "create";
SELECT c.oid::regclass AS relation, c.relkind,
       has_table_privilege('public', c.oid,
           'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER') AS any_privilege
  FROM pg_class c
 WHERE c.relnamespace = 'idem'::regnamespace AND c.relkind IN ('r', 'v', 'm', 'S', 'p', 'f')
 ORDER BY c.relname;

-- ==== state-transition guard ====
-- guarded tables: one the application may update, one it may not touch
SELECT idem_allow('priv', 'new', 'paid'), idem_allow('priv', 'paid', 'shipped');
CREATE TABLE priv_orders (id integer PRIMARY KEY, state text NOT NULL,
                          version bigint NOT NULL DEFAULT 0);
INSERT INTO priv_orders (id, state) VALUES (1, 'new'), (2, 'new'), (3, 'new');
SELECT idem_guard('priv_orders', 'priv', 'state', 'version');
GRANT SELECT, UPDATE ON priv_orders TO regress_idem_app;
CREATE TABLE priv_secret (LIKE priv_orders INCLUDING ALL);
INSERT INTO priv_secret (id, state) VALUES (1, 'new');
SELECT idem_guard('priv_secret', 'priv', 'state', 'version');
-- a table whose owner lets the administration role guard it
CREATE TABLE priv_admin (LIKE priv_orders INCLUDING ALL);
CREATE TABLE priv_admin_strict (LIKE priv_orders INCLUDING ALL);
GRANT TRIGGER ON priv_admin, priv_admin_strict TO regress_idem_admin;

-- what a role without grants must not do, run below as each role
CREATE TEMP TABLE forbidden (n serial, stmt text);
GRANT SELECT ON forbidden TO PUBLIC;
INSERT INTO forbidden (stmt) VALUES
    ('SELECT * FROM idem.claims'),
    ('SELECT count(*) FROM idem.claims'),
    ('INSERT INTO idem.claims VALUES (''priv'', ''forged'', now())'),
    ('UPDATE idem.claims SET claimed_at = now() WHERE ns = ''priv'''),
    ('DELETE FROM idem.claims WHERE ns = ''priv'''),
    ('TRUNCATE idem.claims'),
    ('LOCK TABLE idem.claims IN ACCESS SHARE MODE'),
    ('SELECT * FROM idem.namespaces'),
    ('INSERT INTO idem.namespaces VALUES (''priv'', ''1 day'')'),
    ('UPDATE idem.namespaces SET retention = ''1 day'''),
    ('DELETE FROM idem.namespaces'),
    ('SELECT idem.retention_of(''priv'')'),
    ('CREATE TABLE idem.planted (x int)'),
    ('SELECT idem_release(''p-1'', ''priv'')'),
    ('SELECT idem_purge()'),
    ('SELECT idem_purge(''priv'', 10)'),
    ('SELECT idem_set_retention(''priv'', ''1 day'')');
-- ==== single-use tokens ====
INSERT INTO forbidden (stmt) VALUES
    ('SELECT * FROM idem.tokens'),
    ('UPDATE idem.tokens SET consumed_at = NULL'),
    ('DELETE FROM idem.tokens'),
    ('SELECT idem_token_purge()');
-- ==== request idempotency keys ====
INSERT INTO forbidden (stmt) VALUES
    ('SELECT * FROM idem.requests'),
    ('UPDATE idem.requests SET owner_pid = NULL'),
    ('SELECT * FROM idem.request_retention'),
    ('SELECT idem_request_purge()'),
    ('SELECT idem_request_set_retention(''priv'', ''1 hour'')');
-- ==== state-transition guard ====
INSERT INTO forbidden (stmt) VALUES
    ('SELECT * FROM idem.transitions'),
    ('INSERT INTO idem.transitions VALUES (''priv'', ''shipped'', ''new'')'),
    ('DELETE FROM idem.transitions'),
    ('SELECT idem_allow(''priv'', ''shipped'', ''new'')'),
    ('SELECT idem_disallow(''priv'', ''new'', ''paid'')'),
    ('SELECT idem_guard(''priv_orders'', ''priv'', ''state'')'),
    ('SELECT idem_unguard(''priv_orders'')'),
    ('ALTER TABLE priv_orders DISABLE TRIGGER idem_guard'),
    ('DROP TRIGGER idem_guard ON priv_orders'),
    ('UPDATE priv_orders SET state = ''shipped'' WHERE id = 3'),
    ('SELECT idem_transition(''priv_secret'', ''1'', ''paid'')'),
    ('UPDATE priv_secret SET state = ''paid'' WHERE id = 1');

--
-- The application role, without any grant
--
SET ROLE regress_idem_app;
SELECT idem_claim('p-1', 'priv'), idem_claim('p-1', 'priv');
SELECT idem_try_claim('p-2', 'priv'), idem_try_claim('p-2', 'priv');
SELECT idem_claim_batch(ARRAY['p-1', 'p-3', 'p-3'], 'priv');
SELECT idem_claim_info('p-1', 'priv') IS NOT NULL AS claimed,
       idem_claim_info('p-9', 'priv') IS NULL AS unclaimed;
-- ==== single-use tokens ====
SELECT idem_token_issue('priv') AS token \gset
SELECT idem_token_status(:'token', 'priv'), idem_token_consume(:'token', 'priv'),
       idem_token_consume(:'token', 'priv'), idem_token_status(:'token', 'priv');
-- ==== request idempotency keys ====
SELECT status FROM idem_request_begin('req-1', idem_request_fingerprint('{"a": 1}'), 'priv');
SELECT idem_request_checkpoint('req-1', 'step', NULL, 'priv'), idem_request_finish('req-1', 201, '{}', 'priv');
SELECT status, response_code FROM idem_request_begin('req-1', idem_request_fingerprint('{"a": 1}'), 'priv');
-- ==== state-transition guard ====
SELECT idem_transition('priv_orders', '1', 'paid');
SELECT idem_transition('priv_orders', '1', 'paid');
SELECT idem_transition('priv_orders', '1', 'new');
SELECT idem_transition('priv_orders', '2', 'shipped');
SELECT idem_transition('priv_orders', '9', 'paid');
SELECT idem_transition('priv_orders', '2', 'paid', 5);
UPDATE priv_orders SET state = 'shipped' WHERE id = 1 RETURNING id, state, version;
-- what it must not do
SELECT stmt, pg_temp.outcome(stmt) FROM forbidden ORDER BY n;
RESET ROLE;

-- the same statements with USAGE on the schema: the tables are closed too
SET ROLE regress_idem_usage;
SELECT stmt, pg_temp.outcome(stmt) FROM forbidden ORDER BY n;
RESET ROLE;

--
-- The administration role, with the administration grant
--
GRANT EXECUTE ON FUNCTION
    idem_release(text, text),
    idem_purge(text, integer), idem_set_retention(text, interval),
    idem_token_purge(integer),
    idem_request_purge(integer), idem_request_set_retention(text, interval),
    idem_allow(text, text, text), idem_disallow(text, text, text),
    idem_guard(regclass, text, name, name), idem_unguard(regclass),
    idem_guard_trigger()
  TO regress_idem_admin;
INSERT INTO idem.claims VALUES ('priv', 'aged', now() - interval '2 days');
-- two tokens and two finished requests expired long ago: the oldest of
-- their tables, so that a purge of two rows takes them whatever else expired
INSERT INTO idem.tokens
SELECT 'priv-aged', sha256(convert_to('aged-' || i, 'UTF8')), timestamptz '2000-01-01' + i * interval '1 day', NULL
  FROM generate_series(1, 2) i;
INSERT INTO idem.requests (ns, key, fingerprint, response_code, attempts, created_at, finished_at, expires_at)
SELECT 'priv-aged', 'aged-' || i, 'fp', 200, 1, timestamptz '2000-01-01', timestamptz '2000-01-01',
       timestamptz '2000-01-01' + i * interval '1 day'
  FROM generate_series(1, 2) i;
SET ROLE regress_idem_admin;
SELECT idem_release('p-1', 'priv'), idem_release('p-1', 'priv');
SELECT idem_set_retention('priv', '1 day');
SELECT idem_purge('priv');
SELECT idem_claim_info('aged', 'priv') IS NULL AS purged,
       idem_claim_info('p-2', 'priv') IS NOT NULL AS kept;
-- ==== single-use tokens ====
SELECT idem_token_purge(2) AS tokens_purged;
-- ==== request idempotency keys ====
SELECT idem_request_set_retention('priv', '1 hour'), idem_request_purge(2) AS requests_purged;
-- ==== state-transition guard ====
SELECT idem_allow('priv', 'shipped', 'returned'),
       idem_disallow('priv', 'shipped', 'returned');
SELECT idem_guard('priv_admin', 'priv', 'state', 'version');
SELECT pg_temp.outcome('SELECT idem_unguard(''priv_admin'')');
-- still no access to idem's tables
SELECT pg_temp.outcome('SELECT * FROM idem.claims'),
       pg_temp.outcome('SELECT * FROM idem.namespaces');
RESET ROLE;
SELECT ns, retention FROM idem.namespaces WHERE ns = 'priv';
SELECT (SELECT count(*) FROM idem.tokens WHERE scope = 'priv-aged') AS aged_tokens_left,
       (SELECT count(*) FROM idem.requests WHERE ns = 'priv-aged') AS aged_requests_left;
SELECT count(*) AS guarded FROM pg_trigger
 WHERE tgrelid = 'priv_admin'::regclass AND tgname = 'idem_guard';

--
-- The stricter setup: no function of the schema public for PUBLIC
--
CREATE TEMP TABLE public_execute AS
SELECT p.oid::regprocedure AS function
  FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace
   AND has_function_privilege('public', p.oid, 'EXECUTE');
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC;

-- the application role can do nothing any more
SET ROLE regress_idem_app;
SELECT stmt, pg_temp.outcome(stmt) FROM (VALUES
    (1, 'SELECT idem_claim(''s-1'', ''priv'')'),
    (2, 'SELECT idem_try_claim(''s-1'', ''priv'')'),
    (3, 'SELECT idem_claim_batch(ARRAY[''s-1''], ''priv'')'),
    (4, 'SELECT idem_claim_info(''p-2'', ''priv'')'),
    (5, 'SELECT idem_release(''p-2'', ''priv'')'),
    -- ==== single-use tokens ====
    (6, 'SELECT idem_token_issue(''priv'')'),
    (7, 'SELECT idem_token_consume(repeat(''A'', 43), ''priv'')'),
    (8, 'SELECT idem_token_status(repeat(''A'', 43), ''priv'')'),
    -- ==== request idempotency keys ====
    (9, 'SELECT idem_request_begin(''s-req'', ''fp'', ''priv'')'),
    -- ==== state-transition guard ====
    (10, 'SELECT idem_transition(''priv_orders'', ''2'', ''paid'')'),
    -- ==== outbox and streams ====
    (11, 'SELECT idem_outbox_send(''priv'', ''k'', ''{}'')'),
    (12, 'SELECT idem_offset_advance(''priv'', ''s'', 0, 1)')
  ) v(n, stmt) ORDER BY n;
RESET ROLE;

-- the one grant, the README's
GRANT EXECUTE ON FUNCTION idem_claim(text, text), idem_try_claim(text, text), idem_claim_batch(text[], text),
    idem_claim_info(text, text), idem_token_issue(text, interval),
    idem_token_consume(text, text), idem_token_status(text, text),
    idem_request_begin(text, text, text, interval), idem_request_checkpoint(text, text, jsonb, text),
    idem_request_finish(text, int, jsonb, text, boolean), idem_request_fingerprint(jsonb),
    idem_transition(regclass, text, text, bigint), idem_transition(regclass, text[], text, bigint),
    idem_outbox_send(text, text, jsonb, jsonb, text),
    idem_offset_advance(text, text, int, bigint), idem_offset_get(text, text, int),
    idem_seq_accept(text, bigint, int) TO regress_idem_app;

-- it covers every function of idem in the schema public that PUBLIC may
-- run by default but a trigger's, and nothing that PUBLIC may not: no row
SELECT f.function, f.security_definer,
       e.function IS NOT NULL AS public_by_default,
       has_function_privilege('regress_idem_app', f.function, 'EXECUTE') AS app_execute
  FROM idem_functions f LEFT JOIN public_execute e ON e.function = f.function
 WHERE f.schema = 'public'::regnamespace
   AND (e.function IS NOT NULL AND NOT f.is_trigger) <>
       has_function_privilege('regress_idem_app', f.function, 'EXECUTE')
 ORDER BY f.function::text;

SET ROLE regress_idem_app;
SELECT idem_claim('s-1', 'priv'), idem_claim('s-1', 'priv');
SELECT idem_try_claim('s-2', 'priv'), idem_try_claim('s-2', 'priv');
SELECT idem_claim_batch(ARRAY['s-1', 's-3'], 'priv');
SELECT idem_claim_info('s-1', 'priv') IS NOT NULL AS claimed,
       idem_claim_info('s-9', 'priv') IS NULL AS unclaimed;
-- idem_release is an administration function: not in the grant
SELECT pg_temp.outcome('SELECT idem_release(''s-1'', ''priv'')');
-- ==== single-use tokens ====
SELECT idem_token_issue('priv') AS token \gset
SELECT idem_token_consume(:'token', 'priv'), idem_token_consume(:'token', 'priv'),
       idem_token_status(:'token', 'priv');
-- ==== request idempotency keys ====
SELECT status FROM idem_request_begin('s-req', idem_request_fingerprint('{"a": 1}'), 'priv');
SELECT idem_request_finish('s-req', 200, '{}', 'priv');
SELECT status, response_code FROM idem_request_begin('s-req', idem_request_fingerprint('{"a": 1}'), 'priv');
-- ==== outbox and streams ====
BEGIN;
SELECT idem_outbox_send('priv', 'k', '{}') IS NOT NULL AS sent;
ROLLBACK;
SELECT idem_offset_advance('priv', 's', 0, 1) AS advanced, idem_offset_get('priv', 's', 0) AS stored,
       idem_seq_accept('priv', 1) AS accepted;
-- ==== state-transition guard ====
SELECT idem_transition('priv_orders', '2', 'paid');
SELECT idem_transition('priv_orders', '2', 'paid');
-- the guard fires without EXECUTE on its trigger function
UPDATE priv_orders SET state = 'shipped' WHERE id = 2 RETURNING id, state, version;
SELECT pg_temp.outcome('UPDATE priv_orders SET state = ''new'' WHERE id = 2');
-- what it must not do
SELECT stmt, pg_temp.outcome(stmt) FROM forbidden ORDER BY n;
RESET ROLE;

-- ==== state-transition guard ====
-- creating a guard needs EXECUTE on the trigger function
REVOKE EXECUTE ON FUNCTION idem_guard_trigger() FROM regress_idem_admin;
SET ROLE regress_idem_admin;
SELECT pg_temp.outcome('SELECT idem_guard(''priv_admin_strict'', ''priv'', ''state'')');
RESET ROLE;
GRANT EXECUTE ON FUNCTION idem_guard_trigger() TO regress_idem_admin;
SET ROLE regress_idem_admin;
SELECT pg_temp.outcome('SELECT idem_guard(''priv_admin_strict'', ''priv'', ''state'')');
RESET ROLE;

-- back to the default: PUBLIC runs again what it ran before
SELECT format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', function)
  FROM public_execute ORDER BY function::text \gexec
SELECT p.oid::regprocedure AS differs
  FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace
   AND has_function_privilege('public', p.oid, 'EXECUTE') <>
       (p.oid IN (SELECT function FROM public_execute));

-- what was written is what the roles were allowed to write
SELECT id, state, version FROM priv_orders ORDER BY id;
SELECT id, state, version FROM priv_secret ORDER BY id;

-- idem_distribute(): not for PUBLIC, and without Citus a clear refusal
SET ROLE regress_idem_app;
SELECT pg_temp.outcome('SELECT idem_distribute()');
RESET ROLE;
SELECT pg_temp.outcome('SELECT idem_distribute()');

-- clean up
DELETE FROM idem.claims WHERE ns = 'priv';
DELETE FROM idem.namespaces WHERE ns = 'priv';
DELETE FROM idem.tokens WHERE scope = 'priv';
DELETE FROM idem.requests WHERE ns = 'priv';
DELETE FROM idem.offsets WHERE consumer = 'priv';
DELETE FROM idem.producer_seqs WHERE producer = 'priv';
DROP TABLE priv_orders, priv_secret, priv_admin, priv_admin_strict;
DELETE FROM idem.transitions WHERE machine = 'priv';
DROP OWNED BY regress_idem_app, regress_idem_admin, regress_idem_usage;
DROP ROLE regress_idem_app, regress_idem_admin, regress_idem_usage;
