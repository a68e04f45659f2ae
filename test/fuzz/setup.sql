-- State that the fuzzers (sqlsmith and test/fuzz/idem_fuzz.pl) start from,
-- in a database where idem is installed.  Run with psql as a superuser.
--
-- One block per capability, run only when its functions exist: a new
-- capability adds a block that makes some state of its own (rows in its
-- tables, a guarded table) and puts values worth passing to its functions
-- into fuzz.pool, under the name of the argument that takes them (or
-- "type:<type>" for any argument of that type).

\set ON_ERROR_STOP 1
SET client_min_messages = warning;

CREATE SCHEMA fuzz;

-- values for arguments of a given name, by row number
CREATE TABLE fuzz.pool (
    n   serial PRIMARY KEY,
    arg text NOT NULL,
    v   text
);

-- Stored values to pass as arguments: what comes out of a table has a short
-- varlena header, and long values come compressed or out of line.
CREATE TABLE fuzz.vals (id int PRIMARY KEY, v text, a text[]);
INSERT INTO fuzz.vals VALUES
    (1, 'k1', '{k1,k2,k1}'),
    (2, '', '{}'),
    (3, NULL, NULL),
    (4, repeat('x', 512), ARRAY[repeat('x', 512)]),
    (5, repeat('x', 513), ARRAY['k1', repeat('x', 513)]),
    (6, repeat('ab', 50000), ARRAY[repeat('ab', 200)]),
    (7, (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 200) g),
        ARRAY(SELECT md5(g::text) FROM generate_series(1, 500) g)),
    (8, repeat('é', 256), ARRAY[repeat('é', 257)]),
    (9, repeat('x', 63), '{k1,NULL}'),
    (10, repeat('x', 64), '{{k1,k2},{k3,k4}}'),
    (11, 'default', '[3:4]={k3,k4}'),
    (12, 'k' || chr(233), ARRAY(SELECT 'k' || g FROM generate_series(0, 24) g));

-- A table whose trigger claims each message inserted into it and drops the
-- duplicates.
CREATE TABLE fuzz.events (id bigserial PRIMARY KEY, msg_id text, ns text);
CREATE FUNCTION fuzz.events_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT idem_claim(NEW.msg_id, coalesce(NEW.ns, 'default')) THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER events_claim BEFORE INSERT ON fuzz.events
    FOR EACH ROW EXECUTE FUNCTION fuzz.events_claim();

INSERT INTO fuzz.pool (arg, v) VALUES
    ('type:regclass', 'fuzz.events'),
    ('type:regclass', 'idem.claims'),
    ('type:regclass', 'fuzz.vals');

-- ==== consumer dedup ====
SELECT to_regproc('idem_claim') IS NOT NULL AS has_claims \gset
\if :has_claims
-- claims in a few namespaces, some of them older than their retention
SELECT count(*) FROM (
    SELECT idem_claim('k' || g, ns)
      FROM generate_series(0, 24) g, unnest(ARRAY['default', 'a', 'b']) ns) s;
SELECT idem_set_retention('a', '1 hour'), idem_set_retention('b', '1 second');
UPDATE idem.claims SET claimed_at = claimed_at - interval '2 hours'
 WHERE ns IN ('a', 'b') AND msg_id LIKE 'k1%';
INSERT INTO fuzz.events (msg_id, ns) VALUES ('e1', 'a'), ('e1', 'a'), ('e2', 'b');
INSERT INTO fuzz.pool (arg, v)
    SELECT 'msg_id', msg_id FROM idem.claims WHERE ns = 'a' ORDER BY msg_id LIMIT 5;
INSERT INTO fuzz.pool (arg, v) VALUES
    ('ns', 'default'), ('ns', 'a'), ('ns', 'b'), ('ns', 'never-used');
\endif

-- ==== single-use tokens ====
SELECT to_regproc('idem_token_issue') IS NOT NULL AS has_tokens \gset
\if :has_tokens
-- valid tokens of three scopes
INSERT INTO fuzz.pool (arg, v)
    SELECT 'token', idem_token_issue(s, '1 hour')
      FROM unnest(ARRAY['', 'a', 'b']) s, generate_series(1, 3);
-- consumed ones
INSERT INTO fuzz.pool (arg, v)
    SELECT 'token', t
      FROM (SELECT idem_token_issue('a', '1 hour') AS t
              FROM generate_series(1, 3)) s
     WHERE idem_token_consume(t, 'a');
-- expired ones
INSERT INTO fuzz.pool (arg, v)
    SELECT 'token', idem_token_issue('b', '1 second') FROM generate_series(1, 3);
UPDATE idem.tokens SET expires_at = now() - interval '1 minute'
 WHERE scope = 'b' AND expires_at < now() + interval '1 minute';
-- the same tokens with the hint (last 8 characters) of another one, or
-- with hints pointing nowhere: found through the primary key instead
INSERT INTO fuzz.pool (arg, v)
    SELECT 'token', left(a.v, 43) || right(b.v, 8)
      FROM (SELECT v, row_number() OVER () AS n FROM fuzz.pool WHERE arg = 'token') a
      JOIN (SELECT v, row_number() OVER () AS n FROM fuzz.pool WHERE arg = 'token') b
        ON b.n = a.n % 12 + 1;
INSERT INTO fuzz.pool (arg, v)
    SELECT 'token', left(v, 43) || h
      FROM (SELECT v FROM fuzz.pool WHERE arg = 'token' LIMIT 3) s,
           unnest(ARRAY['AAAAAAAA', '________', 'AAAAAAAB']) h;
INSERT INTO fuzz.pool (arg, v) VALUES
    ('token', 'not-a-token'), ('scope', ''), ('scope', 'a'), ('scope', 'b'),
    ('type:regclass', 'idem.tokens');
\endif

-- ==== state-transition guard ====
SELECT to_regproc('idem_guard') IS NOT NULL AS has_guard \gset
\if :has_guard
-- orders: a text state with a version; levels: an integer state without
SELECT idem_allow('order', f, t)
  FROM (VALUES ('new', 'paid'), ('paid', 'shipped'), ('shipped', 'delivered'),
               ('new', 'cancelled'), ('paid', 'cancelled')) v(f, t);
SELECT idem_allow('level', '1', '2'), idem_allow('level', '2', '3'),
       idem_allow('level', '3', '1');
CREATE TABLE fuzz.orders (
    id      integer PRIMARY KEY,
    status  text NOT NULL,
    version bigint NOT NULL DEFAULT 0,
    note    text
);
INSERT INTO fuzz.orders
    SELECT g, (ARRAY['new', 'paid', 'shipped', 'delivered', 'cancelled', 'odd'])[1 + g % 6], g % 3
      FROM generate_series(1, 30) g;
SELECT idem_guard('fuzz.orders', 'order', 'status', 'version');
CREATE TABLE fuzz.levels (k text PRIMARY KEY, level integer NOT NULL);
INSERT INTO fuzz.levels SELECT 'k' || g, 1 + g % 3 FROM generate_series(0, 24) g;
SELECT idem_guard('fuzz.levels', 'level', 'level');
INSERT INTO fuzz.pool (arg, v) VALUES
    ('type:regclass', 'fuzz.orders'), ('type:regclass', 'fuzz.levels'),
    ('tbl', 'fuzz.orders'), ('tbl', 'fuzz.levels'),
    ('machine', 'order'), ('machine', 'level'),
    ('state_column', 'status'), ('state_column', 'level'),
    ('version_column', 'version'),
    ('from_state', 'new'), ('from_state', 'paid'), ('from_state', '1'),
    ('to_state', 'new'), ('to_state', 'paid'), ('to_state', 'shipped'),
    ('to_state', 'delivered'), ('to_state', 'cancelled'), ('to_state', '2'),
    ('to_state', '3'), ('key', '1'), ('key', '2'), ('key', '7'), ('key', 'k1'),
    ('expected_version', '0'), ('expected_version', '1');
-- plain SQL on the guarded tables, which the guard's trigger checks; in
-- rolled-back transactions, changes of the tables' columns under it
INSERT INTO fuzz.pool (arg, v) VALUES
    ('statement', 'UPDATE fuzz.orders SET status = {to_state:text} WHERE id = {id:integer};'),
    ('statement', 'UPDATE fuzz.orders SET status = {to_state:text}, version = version + 1 WHERE id = {id:integer} AND version = {expected_version:bigint};'),
    ('statement', 'UPDATE fuzz.orders SET note = {note:text} WHERE id % 7 = {id:integer} % 7;'),
    ('statement', 'UPDATE fuzz.orders SET version = {expected_version:bigint} WHERE id = {id:integer};'),
    ('statement', 'UPDATE fuzz.orders SET status = {to_state:text} WHERE status = {from_state:text};'),
    ('statement', 'INSERT INTO fuzz.orders VALUES ({id:integer}, {to_state:text}, 0) ON CONFLICT (id) DO UPDATE SET status = excluded.status;'),
    ('statement', 'DELETE FROM fuzz.orders WHERE id = {id:integer};'),
    ('statement', 'UPDATE fuzz.levels SET level = {level:integer} WHERE k = {key:text};'),
    ('statement', 'UPDATE fuzz.levels SET level = level % 3 + 1 WHERE k < {key:text};'),
    ('statement', 'BEGIN; ALTER TABLE fuzz.orders RENAME COLUMN status TO st; UPDATE fuzz.orders SET st = {to_state:text} WHERE id = {id:integer}; SELECT idem_transition(''fuzz.orders'', {key:text}, {to_state:text}); ROLLBACK;'),
    ('statement', 'BEGIN; ALTER TABLE fuzz.orders DROP COLUMN note; UPDATE fuzz.orders SET status = {to_state:text} WHERE id = {id:integer}; SELECT idem_transition(''fuzz.orders'', {key:text}, {to_state:text}); ROLLBACK;'),
    ('statement', 'BEGIN; ALTER TABLE fuzz.orders ALTER COLUMN version TYPE integer; UPDATE fuzz.orders SET status = {to_state:text} WHERE id = {id:integer}; ROLLBACK;'),
    ('statement', 'BEGIN; ALTER TABLE fuzz.orders DROP COLUMN version; SELECT idem_transition(''fuzz.orders'', {key:text}, {to_state:text}); ROLLBACK;'),
    ('statement', 'BEGIN; ALTER TABLE fuzz.levels ALTER COLUMN level TYPE text; UPDATE fuzz.levels SET level = {to_state:text} WHERE k = {key:text}; ROLLBACK;'),
    ('statement', 'BEGIN; DROP TABLE fuzz.orders; ROLLBACK;'),
    ('statement', 'BEGIN; SELECT idem_unguard(''fuzz.orders''); UPDATE fuzz.orders SET status = {to_state:text} WHERE id = {id:integer}; ROLLBACK;'),
    -- the random calls unguard the tables now and then: guard them again
    ('statement', 'SELECT idem_guard(''fuzz.orders'', ''order'', ''status'', ''version'');'),
    ('statement', 'SELECT idem_guard(''fuzz.orders'', ''order'', ''status'', ''version'');'),
    ('statement', 'SELECT idem_guard(''fuzz.levels'', ''level'', ''level'');'),
    ('statement', 'SELECT idem_guard(''fuzz.levels'', ''level'', ''level'');');

-- shipments: a composite primary key; parcels: partitioned by list on the
-- first column of its key, guarded at the parent (the guard is cloned to
-- each partition), whose new rows must start as 'new'
SELECT idem_allow('ship', f, t)
  FROM (VALUES ('new', 'packed'), ('packed', 'sent'), ('sent', 'received'),
               ('new', 'lost'), ('sent', 'lost'), ('lost', 'sent')) v(f, t);
CREATE TABLE fuzz.shipments (
    region  text,
    no      integer,
    status  text NOT NULL,
    version integer NOT NULL DEFAULT 0,
    PRIMARY KEY (region, no)
);
INSERT INTO fuzz.shipments
    SELECT r, g, (ARRAY['new', 'packed', 'sent', 'received', 'lost'])[1 + g % 5], g % 2
      FROM unnest(ARRAY['eu', 'us', 'asia']) r, generate_series(1, 8) g;
SELECT idem_guard('fuzz.shipments', 'ship', 'status', 'version');
CREATE TABLE fuzz.parcels (
    region  text NOT NULL,
    id      integer NOT NULL,
    status  text NOT NULL,
    PRIMARY KEY (region, id)
) PARTITION BY LIST (region);
CREATE TABLE fuzz.parcels_eu PARTITION OF fuzz.parcels FOR VALUES IN ('eu');
CREATE TABLE fuzz.parcels_us PARTITION OF fuzz.parcels FOR VALUES IN ('us');
CREATE TABLE fuzz.parcels_other PARTITION OF fuzz.parcels DEFAULT;
INSERT INTO fuzz.parcels
    SELECT r, g, (ARRAY['new', 'packed', 'sent', 'lost'])[1 + g % 4]
      FROM unnest(ARRAY['eu', 'us', 'asia']) r, generate_series(1, 8) g;
SELECT idem_guard('fuzz.parcels', 'ship', 'status');
SELECT idem_allow_initial('ship', 'new');
-- guards that do not work, made where the check of guard DDL does not fire
-- (it is an event trigger): what idem._guard_problem explains, and what
-- every write of these tables is refused for
CREATE TABLE fuzz.guard_args (id integer PRIMARY KEY, status text NOT NULL);
CREATE TABLE fuzz.guard_version (id integer PRIMARY KEY, status text NOT NULL, version bigint);
CREATE TABLE fuzz.guard_generated (
    id     integer PRIMARY KEY,
    status text GENERATED ALWAYS AS ('new') STORED
);
INSERT INTO fuzz.guard_args SELECT g, 'new' FROM generate_series(1, 3) g;
INSERT INTO fuzz.guard_version SELECT g, 'new', NULL FROM generate_series(1, 3) g;
INSERT INTO fuzz.guard_generated SELECT g FROM generate_series(1, 3) g;
SET session_replication_role = replica;
CREATE TRIGGER guard_args BEFORE INSERT OR UPDATE ON fuzz.guard_args
    FOR EACH ROW EXECUTE FUNCTION idem_guard_trigger('order');
CREATE TRIGGER guard_version BEFORE INSERT OR UPDATE ON fuzz.guard_version
    FOR EACH ROW EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'version');
CREATE TRIGGER guard_generated BEFORE INSERT OR UPDATE ON fuzz.guard_generated
    FOR EACH ROW EXECUTE FUNCTION idem_guard_trigger('order', 'status');
RESET session_replication_role;
-- a trigger of another function that looks like a guard (when, arguments),
-- whose last argument names a column of the primary key
CREATE FUNCTION fuzz.events_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN NEW;
END
$$;
CREATE TRIGGER events_touch BEFORE INSERT OR UPDATE ON fuzz.events
    FOR EACH ROW EXECUTE FUNCTION fuzz.events_touch('order', 'ns', 'id');
INSERT INTO fuzz.pool (arg, v) VALUES
    ('type:regclass', 'fuzz.shipments'), ('type:regclass', 'fuzz.parcels'),
    ('type:regclass', 'fuzz.parcels_eu'), ('type:regclass', 'fuzz.guard_args'),
    ('tbl', 'fuzz.shipments'), ('tbl', 'fuzz.parcels'), ('tbl', 'fuzz.parcels_us'),
    ('tbl', 'fuzz.guard_version'), ('tbl', 'fuzz.guard_generated'),
    ('statement', 'UPDATE fuzz.shipments SET status = {to_state:text} WHERE region = {region:text} AND no = {id:integer};'),
    ('statement', 'UPDATE fuzz.parcels SET region = {region:text}, status = {to_state:text} WHERE id = {id:integer};'),
    ('statement', 'INSERT INTO fuzz.parcels VALUES ({region:text}, {id:integer}, {to_state:text}) ON CONFLICT DO NOTHING;'),
    ('statement', 'UPDATE fuzz.guard_version SET status = {to_state:text} WHERE id = {id:integer};'),
    ('region', 'eu'), ('region', 'us'), ('region', 'asia'),
    ('machine', 'ship'), ('state', 'new'), ('state', 'sent'),
    ('to_state', 'packed'), ('to_state', 'sent'), ('to_state', 'received'),
    ('to_state', 'lost'),
    -- keys of the text[] form of idem_transition, by primary key: of orders
    -- and levels (one column), of shipments and parcels (two), and some of
    -- a wrong length, order or type
    ('key:text[]', '{1}'), ('key:text[]', '{7}'), ('key:text[]', '{k1}'),
    ('key:text[]', '{k2}'), ('key:text[]', '{eu,1}'), ('key:text[]', '{us,3}'),
    ('key:text[]', '{asia,8}'), ('key:text[]', '{eu,99}'),
    ('key:text[]', '{nowhere,1}'), ('key:text[]', '{eu}'),
    ('key:text[]', '{1,eu}'), ('key:text[]', '{eu,1,1}'),
    ('key:text[]', '{eu,x}'), ('key:text[]', '{"eu ",2}');
\endif

-- ==== request idempotency keys ====
SELECT to_regproc('idem_request_begin') IS NOT NULL AS has_requests \gset
\if :has_requests
SELECT idem_request_set_retention('a', '1 hour'),
       idem_request_set_retention('b', '1 second');
-- begun by this session, which ends: resumed by the next attempt; some with
-- a checkpoint, some finished (replayed), some released (begun anew)
SELECT count(*) FROM (
    SELECT idem_request_begin('r' || g, 'fp' || (g % 3), ns)
      FROM generate_series(1, 9) g, unnest(ARRAY['default', 'a', 'b']) ns) s;
SELECT count(*) FROM (
    SELECT idem_request_checkpoint('r' || g, 'step' || g, jsonb_build_object('g', g), ns)
      FROM generate_series(1, 6) g, unnest(ARRAY['default', 'a', 'b']) ns) s;
SELECT count(*) FROM (
    SELECT idem_request_finish('r' || g, 200 + g, jsonb_build_object('ok', g), ns)
      FROM generate_series(1, 3) g, unnest(ARRAY['default', 'a', 'b']) ns) s;
SELECT count(*) FROM (
    SELECT idem_request_finish('r' || g, 503, NULL, ns, false)
      FROM generate_series(4, 5) g, unnest(ARRAY['default', 'a', 'b']) ns) s;
-- finished long ago: expired, purged
UPDATE idem.requests SET expires_at = now() - interval '1 hour'
 WHERE ns = 'b' AND key = 'r1';
INSERT INTO fuzz.pool (arg, v)
    SELECT 'key', 'r' || g FROM generate_series(1, 9) g;
INSERT INTO fuzz.pool (arg, v) VALUES
    ('fingerprint', 'fp0'), ('fingerprint', 'fp1'), ('fingerprint', 'fp2'),
    ('recovery_point', 'step1'), ('recovery_point', 'charged'),
    ('response_code', '200'), ('response_code', '201'), ('response_code', '204'),
    ('response_code', '404'), ('response_code', '409'), ('response_code', '500'),
    ('response_code', '100'), ('response_code', '599'),
    ('lease', '1 second'), ('lease', '5 minutes'), ('lease', '1 day'),
    ('type:regclass', 'idem.requests');
\endif

-- ==== transactional outbox ====
SELECT to_regproc('idem_outbox_send') IS NOT NULL AS has_outbox \gset
\if :has_outbox
-- t1: dead at the first failure; t2: a few attempts with short backoffs;
-- t3: many attempts, long backoffs; t4: the defaults (no row)
SELECT idem_outbox_configure('t1', 1, '1 millisecond', '1 millisecond'),
       idem_outbox_configure('t2', 3, '1 millisecond', '50 milliseconds'),
       idem_outbox_configure('t3', 1000, '1 second', '1 day');
SELECT count(*) FROM (
    SELECT idem_outbox_send(t, 'k' || (g % 5), jsonb_build_object('n', g),
                            CASE WHEN g % 3 = 0 THEN '{"h": "v"}'::jsonb END,
                            CASE WHEN g % 2 = 0 THEN 'created' END)
      FROM unnest(ARRAY['t1', 't2', 't3', 't4']) t, generate_series(1, 20) g
     ORDER BY g, t) s;
-- heads leased by a relay that never acknowledges (their lease runs out),
-- and failed ones: retried, or dead
SELECT count(*) FROM idem_outbox_lease('setup', 4, '1 second');
SELECT count(idem_outbox_nack(id, 'failed in setup', '1 millisecond', 'setup'))
  FROM idem_outbox_lease('setup', 4, '1 hour');
SELECT count(idem_outbox_nack(id, 'refused in setup', NULL, 'setup', true))
  FROM idem_outbox_lease('setup', 2, '1 hour');
SELECT count(*) FROM idem_outbox_lease('setup', 3, '1 hour', 3);
INSERT INTO fuzz.pool (arg, v) VALUES
    ('topic', 't1'), ('topic', 't2'), ('topic', 't3'), ('topic', 't4'),
    ('topic', 'never-sent'),
    ('relay', 'r1'), ('relay', 'r2'), ('relay', 'setup'),
    ('max_messages', '1'), ('max_messages', '3'), ('max_messages', '20'),
    ('max_messages', '1000'),
    ('per_key', '1'), ('per_key', '2'), ('per_key', '10'),
    ('lease', '100 milliseconds'), ('lease', '30 seconds'),
    ('retry_after', '0'), ('retry_after', '1 millisecond'),
    ('retry_after', '1 second'),
    ('max_attempts', '1'), ('max_attempts', '2'), ('max_attempts', '5'),
    ('backoff_base', '1 millisecond'), ('backoff_base', '10 milliseconds'),
    ('backoff_base', '1 second'),
    ('backoff_max', '10 milliseconds'), ('backoff_max', '1 minute'),
    ('backoff_max', '1 day'),
    ('error', 'timeout'), ('error', 'connection refused'),
    ('type:regclass', 'idem.outbox'), ('type:regclass', 'idem.outbox_keys');
\endif

-- the triggers of every block (guards, idem's own, the tables' others), for
-- arguments that take a trigger's OID
INSERT INTO fuzz.pool (arg, v)
    SELECT 'tgoid', oid::text FROM pg_trigger ORDER BY oid;

SELECT pg_stat_reset();
