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
\endif

SELECT pg_stat_reset();
