-- search_path: objects planted ahead of pg_catalog in the caller's
-- search_path are never used by idem
--
-- A role owns a schema "hostile" holding functions, an aggregate, operators
-- and tables named like those idem's own SQL uses (COALESCE, NULLIF and
-- the like are syntax, not functions: they cannot be planted).  Each
-- planted routine logs its call (with the role it ran as), raises a warning
-- and returns a wrong answer, so a hijack shows three ways: a warning, a
-- row in hostile.calls and a wrong result.  The caller's own resolution of
-- the names idem_claim and so on is the caller's business, not tested here.
\set VERBOSITY terse

CREATE ROLE regress_idem_hostile;
CREATE ROLE regress_idem_sp_app;
CREATE SCHEMA hostile AUTHORIZATION regress_idem_hostile;
GRANT USAGE ON SCHEMA hostile TO PUBLIC;

-- one statement: 'ok', or its SQLSTATE and message; written with qualified
-- operators, since it runs under the hostile search_path
CREATE FUNCTION pg_temp.outcome(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE OPERATOR(pg_catalog.||) ': '
           OPERATOR(pg_catalog.||) SQLERRM;
END;
$$;

SET ROLE regress_idem_hostile;
CREATE TABLE hostile.calls (what text, run_as name);
GRANT INSERT ON hostile.calls TO PUBLIC;
CREATE FUNCTION hostile.called(what text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    INSERT INTO hostile.calls VALUES (what, current_user);
    RAISE WARNING 'hostile % called', what;
END;
$$;

-- functions
CREATE FUNCTION hostile.now() RETURNS timestamptz
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    PERFORM hostile.called('now()');
    RETURN now() + interval '100 years';
END;
$$;
CREATE FUNCTION hostile.format(text, interval) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN PERFORM hostile.called('format(text, interval)'); RETURN 'hijacked'; END;
$$;
CREATE FUNCTION hostile.format(text, integer) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN PERFORM hostile.called('format(text, integer)'); RETURN 'hijacked'; END;
$$;
CREATE FUNCTION hostile.format(text, text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN PERFORM hostile.called('format(text, text)'); RETURN 'hijacked'; END;
$$;
CREATE FUNCTION hostile.min_step(text, text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN PERFORM hostile.called('min(text)'); RETURN NULL; END;
$$;
CREATE AGGREGATE hostile.min(text) (SFUNC = hostile.min_step, STYPE = text);

-- operators: each (name, left type, right type) gets a function that logs
-- and answers wrongly (true for comparisons, an absurd value otherwise)
DO $$
DECLARE
    o record;
BEGIN
    FOR o IN SELECT * FROM (VALUES
        ('=',  'text',        'text',        'boolean',     'true'),
        ('<',  'text',        'text',        'boolean',     'true'),
        ('>',  'text',        'text',        'boolean',     'true'),
        ('=',  'tid',         'tid',         'boolean',     'true'),
        ('<',  'timestamptz', 'timestamptz', 'boolean',     'true'),
        ('<=', 'timestamptz', 'timestamptz', 'boolean',     'true'),
        ('-',  'timestamptz', 'interval',    'timestamptz', '''infinity'''),
        ('+',  'timestamptz', 'interval',    'timestamptz', '''-infinity'''),
        ('<=', 'interval',    'interval',    'boolean',     'true'),
        ('>',  'interval',    'interval',    'boolean',     'false'),
        ('<=', 'integer',     'integer',     'boolean',     'true'),
        ('<=', 'bigint',      'integer',     'boolean',     'true'),
        ('<=', 'bigint',      'bigint',      'boolean',     'true'),
        ('+',  'bigint',      'bigint',      'bigint',      '-1000'),
        ('-',  'bigint',      'bigint',      'bigint',      '-1000'),
        ('=',  'integer',     'integer',     'boolean',     'true'),
        ('=',  'bytea',       'bytea',       'boolean',     'true')
      ) v(op, l, r, res, answer)
    LOOP
        EXECUTE format(
            'CREATE FUNCTION hostile.%I(%s, %s) RETURNS %s '
            'LANGUAGE plpgsql SET search_path = pg_catalog AS %L',
            'op_' || md5(o.op || o.l || o.r), o.l, o.r, o.res,
            format('BEGIN PERFORM hostile.called(%L); RETURN %s; END;',
                   format('operator %s (%s, %s)', o.op, o.l, o.r), o.answer));
        EXECUTE format(
            'CREATE OPERATOR hostile.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = hostile.%I)',
            o.op, o.l, o.r, 'op_' || md5(o.op || o.l || o.r));
    END LOOP;
END;
$$;

-- tables named like idem's, with rows that would change its answers
CREATE TABLE hostile.claims (ns text, msg_id text, claimed_at timestamptz);
INSERT INTO hostile.claims VALUES ('sp', 'sp-new', '2000-01-01');
CREATE TABLE hostile.namespaces (ns text, retention interval);
INSERT INTO hostile.namespaces VALUES ('sp', '1 second'), ('sp2', '1 second');
CREATE TABLE hostile.tokens (scope text, digest bytea, expires_at timestamptz,
                             consumed_at timestamptz);
CREATE TABLE hostile.transitions (machine text, from_state text, to_state text);
INSERT INTO hostile.transitions VALUES ('sp', 'new', 'shipped'), ('sp', 'paid', 'new');
GRANT SELECT, INSERT, UPDATE, DELETE ON hostile.claims, hostile.namespaces,
    hostile.tokens, hostile.transitions TO PUBLIC;
RESET ROLE;
-- and in the caller's temporary schema, which comes last in the
-- search_path of idem's SECURITY DEFINER functions
CREATE TEMP TABLE claims (ns text, msg_id text, claimed_at timestamptz);
INSERT INTO claims VALUES ('sp', 'sp-new', '2000-01-01');
CREATE TEMP TABLE namespaces (ns text, retention interval);
INSERT INTO namespaces VALUES ('sp', '1 second'), ('sp2', '1 second');
CREATE TEMP TABLE transitions (machine text, from_state text, to_state text);
INSERT INTO transitions VALUES ('sp', 'new', 'shipped'), ('sp', 'paid', 'new');
GRANT ALL ON claims, namespaces, transitions TO PUBLIC;

-- claims older than their retention, to purge, made while the search_path
-- is still the default
SELECT idem_set_retention('sp', '1 day');
INSERT INTO idem.claims VALUES
    ('sp',  'sp-aged-1',  now() - interval '2 days'),
    ('sp',  'sp-aged-2',  now() - interval '3 days'),
    ('sp2', 'sp2-recent', now() - interval '3 days');
-- ==== single-use tokens ====
-- an expired token, to purge
INSERT INTO idem.tokens VALUES ('sp', '\x00', now() - interval '1 hour', NULL);
-- ==== state-transition guard ====
-- a machine, and tables keyed by integer and by text, guarded below
SELECT idem_allow('sp', 'new', 'paid'), idem_allow('sp', 'paid', 'shipped');
CREATE TABLE sp_orders (id integer PRIMARY KEY, state text NOT NULL,
                        version bigint NOT NULL DEFAULT 0);
INSERT INTO sp_orders (id, state) VALUES (1, 'new'), (2, 'new'), (3, 'new'), (4, 'new');
CREATE TABLE sp_docs (code text PRIMARY KEY, state text NOT NULL);
INSERT INTO sp_docs VALUES ('a', 'new'), ('b', 'new');
GRANT SELECT, UPDATE ON sp_orders, sp_docs TO regress_idem_sp_app;

-- the plants work: called from the hostile search_path, they answer
SET search_path = hostile, pg_catalog, public;
SELECT now() IS NOT NULL AS now_called;
SELECT 'b'::text < 'a'::text AS "b < a";
SELECT min(x) FROM (VALUES ('a'::text)) v(x);
SELECT format('%s', interval '1 day');
SELECT count(*) FROM claims;
RESET search_path;
SELECT what, run_as FROM hostile.calls ORDER BY what;
TRUNCATE hostile.calls;

--
-- Every function of idem, called from the hostile search_path
--
GRANT EXECUTE ON FUNCTION
    idem_release(text, text),
    idem_purge(text, integer), idem_set_retention(text, interval),
    idem_token_purge(integer),
    idem_allow(text, text, text), idem_disallow(text, text, text)
  TO regress_idem_sp_app;
SET search_path = hostile, pg_catalog, public;
SHOW search_path;

-- as the superuser
SELECT idem_claim('sp-1', 'sp'), idem_claim('sp-1', 'sp'), idem_claim('sp-new', 'sp');
SELECT idem_try_claim('sp-2', 'sp'), idem_try_claim('sp-2', 'sp');
SELECT idem_claim_batch(ARRAY['sp-1', 'sp-3', 'sp-3'], 'sp');
SELECT idem_claim_info('sp-1', 'sp') IS NOT NULL AS claimed,
       idem_claim_info('sp-9', 'sp') IS NULL AS unclaimed;
SELECT idem_release('sp-3', 'sp'), idem_release('sp-3', 'sp');
SELECT idem_set_retention('sp', '1 day');
SELECT idem_purge('sp', 1), idem_purge('sp'), idem_purge('sp'), idem_purge('sp2');
SELECT idem_claim_info('sp-aged-1', 'sp') IS NULL AS purged,
       idem_claim_info('sp-1', 'sp') IS NOT NULL AS kept,
       idem_claim_info('sp2-recent', 'sp2') IS NOT NULL AS kept_by_default_retention;
-- ==== single-use tokens ====
SELECT idem_token_issue('sp', '1 hour') AS token \gset
SELECT idem_token_status(:'token', 'sp'), idem_token_consume(:'token', 'sp'),
       idem_token_consume(:'token', 'sp'), idem_token_status(:'token', 'sp');
SELECT idem_token_purge() >= 1 AS purged_some;
SELECT idem_token_status(:'token', 'sp') AS consumed_token_kept;
-- ==== state-transition guard ====
SELECT idem_allow('sp', 'shipped', 'returned'), idem_disallow('sp', 'shipped', 'returned'),
       idem_disallow('sp', 'shipped', 'returned');
SELECT idem_guard('sp_orders', 'sp', 'state', 'version');
SELECT idem_guard('sp_docs', 'sp', 'state');
SELECT idem_transition('sp_orders', '1', 'paid');
SELECT idem_transition('sp_orders', '1', 'paid');
SELECT idem_transition('sp_orders', '1', 'new');
SELECT idem_transition('sp_orders', '2', 'shipped');
SELECT idem_transition('sp_orders', '9', 'paid');
SELECT idem_transition('sp_orders', '2', 'paid', 0);
SELECT idem_transition('sp_orders', '2', 'shipped', 0);
SELECT idem_transition('sp_docs', 'a', 'paid');
SELECT idem_transition('sp_docs', 'z', 'paid');
SELECT pg_temp.outcome('UPDATE sp_orders SET state = ''new'' WHERE id OPERATOR(pg_catalog.=) 1');
SELECT idem_unguard('sp_docs'), idem_unguard('sp_docs');
-- errors whose messages idem formats
SELECT stmt, pg_temp.outcome(stmt) FROM (VALUES
    (1, 'SELECT idem_set_retention(''sp'', ''-1 day'')'),
    (2, 'SELECT idem_set_retention(''sp'', NULL)'),
    (3, 'SELECT idem_purge(''sp'', 0)'),
    (4, 'SELECT idem_purge(''sp'', NULL)'),
    (5, 'SELECT idem_purge('''')'),
    (6, 'SELECT idem_claim('''', ''sp'')'),
    -- ==== single-use tokens ====
    (7, 'SELECT idem_token_purge(0)'),
    (8, 'SELECT idem_token_issue(''sp'', ''-1 hour'')'),
    -- ==== state-transition guard ====
    (9, 'SELECT idem_allow('''', ''new'', ''paid'')'),
    (10, 'SELECT idem_allow(repeat(''m'', 64), ''new'', ''paid'')'),
    (11, 'SELECT idem_disallow(''sp'', NULL, ''paid'')'),
    (12, 'SELECT idem_guard(''sp_docs'', ''no-such-machine'', ''state'')'),
    (13, 'SELECT idem_transition(''sp_docs'', ''a'', ''shipped'')')
  ) v(n, stmt) ORDER BY n;

-- as an application role, which may call the SECURITY DEFINER functions
RESET search_path;
INSERT INTO idem.claims VALUES ('sp', 'sp-aged-3', now() - interval '2 days');
-- ==== single-use tokens ====
INSERT INTO idem.tokens VALUES ('sp', '\x01', now() - interval '1 hour', NULL);
-- ==== state-transition guard ====
SET search_path = hostile, pg_catalog, public;
SET ROLE regress_idem_sp_app;
SHOW search_path;
SELECT idem_claim('sp-4', 'sp'), idem_claim('sp-4', 'sp');
SELECT idem_try_claim('sp-5', 'sp'), idem_try_claim('sp-5', 'sp');
SELECT idem_claim_batch(ARRAY['sp-4', 'sp-6'], 'sp');
SELECT idem_claim_info('sp-4', 'sp') IS NOT NULL AS claimed,
       idem_claim_info('sp-9', 'sp') IS NULL AS unclaimed;
SELECT idem_release('sp-6', 'sp'), idem_release('sp-6', 'sp');
SELECT idem_set_retention('sp', '1 day');
SELECT idem_purge('sp'), idem_purge('sp2');
SELECT idem_claim_info('sp-aged-3', 'sp') IS NULL AS purged,
       idem_claim_info('sp-4', 'sp') IS NOT NULL AS kept;
-- ==== single-use tokens ====
SELECT idem_token_issue('sp', '1 hour') AS token \gset
SELECT idem_token_status(:'token', 'sp'), idem_token_consume(:'token', 'sp'),
       idem_token_consume(:'token', 'sp'), idem_token_status(:'token', 'sp');
SELECT idem_token_purge() >= 1 AS purged_some;
SELECT idem_token_status(:'token', 'sp') AS consumed_token_kept;
-- ==== state-transition guard ====
SELECT idem_allow('sp', 'shipped', 'returned'), idem_disallow('sp', 'shipped', 'returned');
SELECT idem_transition('sp_orders', '3', 'paid');
SELECT idem_transition('sp_orders', '3', 'paid');
SELECT idem_transition('sp_orders', '4', 'shipped');
SELECT idem_transition('sp_orders', '9', 'paid');
SELECT pg_temp.outcome('UPDATE sp_orders SET state = ''new'' WHERE id OPERATOR(pg_catalog.=) 3');
SELECT stmt, pg_temp.outcome(stmt) FROM (VALUES
    (1, 'SELECT idem_set_retention(''sp'', ''-1 day'')'),
    (2, 'SELECT idem_purge(''sp'', 0)'),
    -- ==== single-use tokens ====
    (3, 'SELECT idem_token_purge(0)'),
    -- ==== state-transition guard ====
    (4, 'SELECT idem_allow('''', ''new'', ''paid'')'),
    (5, 'SELECT idem_allow(repeat(''m'', 64), ''new'', ''paid'')')
  ) v(n, stmt) ORDER BY n;
RESET ROLE;
RESET search_path;

-- nothing planted was called, and idem's tables hold what they should
SELECT count(*) AS hostile_calls FROM hostile.calls;
SELECT msg_id FROM idem.claims WHERE ns IN ('sp', 'sp2') ORDER BY ns, msg_id;
SELECT ns, retention FROM idem.namespaces WHERE ns IN ('sp', 'sp2') ORDER BY ns;
SELECT count(*) AS hostile_rows_untouched FROM hostile.claims WHERE msg_id = 'sp-new';
-- ==== single-use tokens ====
SELECT count(*) FILTER (WHERE consumed_at IS NULL) AS unconsumed,
       count(*) FILTER (WHERE expires_at < now()) AS expired,
       count(*) AS tokens
  FROM idem.tokens WHERE scope = 'sp';
-- ==== state-transition guard ====
SELECT from_state, to_state FROM idem.transitions WHERE machine = 'sp'
 ORDER BY from_state, to_state;
SELECT id, state, version FROM sp_orders ORDER BY id;
SELECT code, state FROM sp_docs ORDER BY code;

--
-- Every SECURITY DEFINER function of idem fixes its search_path
--
SELECT p.oid::regprocedure AS function, l.lanname, p.proconfig
  FROM pg_depend d
  JOIN pg_proc p ON p.oid = d.objid
  JOIN pg_language l ON l.oid = p.prolang
 WHERE d.classid = 'pg_proc'::regclass
   AND d.refclassid = 'pg_extension'::regclass
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
   AND d.deptype = 'e'
   AND p.prosecdef
 ORDER BY p.oid::regprocedure::text;
-- and so does every function of idem written in SQL: no row
SELECT p.oid::regprocedure AS function, l.lanname, p.prosecdef, p.proconfig
  FROM pg_depend d
  JOIN pg_proc p ON p.oid = d.objid
  JOIN pg_language l ON l.oid = p.prolang
 WHERE d.classid = 'pg_proc'::regclass
   AND d.refclassid = 'pg_extension'::regclass
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
   AND d.deptype = 'e'
   AND (l.lanname <> 'c' OR p.prosecdef)
   AND p.proconfig IS DISTINCT FROM ARRAY['search_path=pg_catalog, pg_temp']
 ORDER BY p.oid::regprocedure::text;

-- clean up
DELETE FROM idem.claims WHERE ns IN ('sp', 'sp2');
DELETE FROM idem.namespaces WHERE ns IN ('sp', 'sp2');
DELETE FROM idem.tokens WHERE scope = 'sp';
DROP TABLE sp_orders, sp_docs;
DELETE FROM idem.transitions WHERE machine = 'sp';
DROP SCHEMA hostile CASCADE;
DROP OWNED BY regress_idem_hostile, regress_idem_sp_app;
DROP ROLE regress_idem_hostile, regress_idem_sp_app;
