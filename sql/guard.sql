-- state-transition guard: machines, the trigger and idem_transition
\set VERBOSITY terse

-- err(sql): run sql; 'ok', or the SQLSTATE, the message and the detail
CREATE FUNCTION err(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text; det text;
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            det = PG_EXCEPTION_DETAIL;
    RETURN st || ': ' || msg || COALESCE(' | ' || NULLIF(det, ''), '');
END;
$$;
-- fields(sql): the SQLSTATE and the schema, table and column of the error
CREATE FUNCTION fields(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; sch text; tab text; col text;
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, sch = SCHEMA_NAME,
                            tab = TABLE_NAME, col = COLUMN_NAME;
    RETURN format('%s schema=%s table=%s column=%s', st, sch, tab, col);
END;
$$;

-- the machine of an order: new -> paid -> shipped -> delivered, and
-- new or paid -> cancelled
SELECT idem_allow('order', 'new', 'paid');
SELECT idem_allow('order', 'paid', 'shipped');
SELECT idem_allow('order', 'shipped', 'delivered');
SELECT idem_allow('order', 'new', 'cancelled');
SELECT idem_allow('order', 'paid', 'cancelled');
-- allowing twice is no error, and says it was already allowed
SELECT idem_allow('order', 'new', 'paid');
SELECT machine, from_state, to_state FROM idem.transitions ORDER BY 1, 2, 3;
-- the definitions are dumped with the database
SELECT e.extconfig @> ARRAY['idem.transitions'::regclass::oid] AS dumped
  FROM pg_extension e WHERE e.extname = 'idem';

------------------------------------------------------------------------
-- a text state column with a version column
------------------------------------------------------------------------
CREATE TABLE orders (
    id       integer PRIMARY KEY,
    status   text NOT NULL,
    version  bigint NOT NULL DEFAULT 0,
    note     text
);
-- INSERT is not checked: a row may start in any state and version
INSERT INTO orders VALUES (1, 'new', 0), (2, 'new', 0), (3, 'paid', 7),
                          (4, 'shipped', 2), (5, 'new', 0), (6, 'unknown', 0);
SELECT idem_guard('orders', 'order', 'status', 'version');
SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger
 WHERE tgrelid = 'orders'::regclass;
INSERT INTO orders VALUES (7, 'delivered', 41);

-- a legal direct UPDATE moves the state and bumps the version
UPDATE orders SET status = 'paid' WHERE id = 1 RETURNING id, status, version;
-- an UPDATE that leaves the state alone is not a transition; it bumps too
UPDATE orders SET note = 'gift' WHERE id = 1 RETURNING id, status, version;
UPDATE orders SET status = 'paid' WHERE id = 1 RETURNING id, status, version;
-- setting the version to old + 1 is accepted, as the hand-written
-- conditional UPDATE does
UPDATE orders SET status = 'shipped', version = version + 1
 WHERE id = 1 AND version = 3 RETURNING id, status, version;
-- a stale conditional UPDATE matches nothing
UPDATE orders SET status = 'delivered', version = version + 1
 WHERE id = 1 AND version = 3 RETURNING id, status, version;

-- the guard refuses an illegal transition, from any code path
SELECT err($$UPDATE orders SET status = 'new' WHERE id = 1$$);
SELECT err($$UPDATE orders SET status = 'delivered' WHERE id = 2$$);
SELECT fields($$UPDATE orders SET status = 'delivered' WHERE id = 2$$);
SELECT err($$UPDATE orders SET status = 'Paid' WHERE id = 2$$);
-- from a state the machine does not know, nothing is allowed
SELECT err($$UPDATE orders SET status = 'new' WHERE id = 6$$);
-- a multi-row UPDATE fails as a whole when one row breaks the machine
SELECT err($$UPDATE orders SET status = 'cancelled' WHERE id IN (2, 4)$$);
-- from a PL/pgSQL function as well
CREATE FUNCTION reopen(oid integer) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE orders SET status = 'new' WHERE id = oid;
END;
$$;
SELECT err($$SELECT reopen(4)$$);
-- and from INSERT ... ON CONFLICT DO UPDATE
SELECT err($$INSERT INTO orders VALUES (4, 'new', 0)
             ON CONFLICT (id) DO UPDATE SET status = excluded.status$$);
INSERT INTO orders VALUES (4, 'delivered', 0)
    ON CONFLICT (id) DO UPDATE SET status = excluded.status
    RETURNING id, status, version;

-- the version can only go up by one
SELECT err($$UPDATE orders SET version = 7 WHERE id = 2$$);
SELECT fields($$UPDATE orders SET version = 7 WHERE id = 2$$);
SELECT err($$UPDATE orders SET version = version + 2 WHERE id = 2$$);
SELECT err($$UPDATE orders SET version = version - 1 WHERE id = 2$$);
SELECT err($$UPDATE orders SET version = NULL WHERE id = 2$$);
-- setting it to the value it has is leaving it unchanged: it goes up
UPDATE orders SET note = 'n', version = 0 WHERE id = 5 AND version = 0
RETURNING id, status, version;
-- nothing was written by the refused updates
SELECT id, status, version, note FROM orders ORDER BY id;

------------------------------------------------------------------------
-- idem_transition: every outcome
------------------------------------------------------------------------
-- applied: moved, version + 1
SELECT idem_transition('orders', '2', 'paid');
SELECT status, version FROM orders WHERE id = 2;
-- already: in to_state (a retry)
SELECT idem_transition('orders', '2', 'paid');
SELECT status, version FROM orders WHERE id = 2;
-- stale: the row has moved beyond to_state (a late request), never
-- overwritten
SELECT idem_transition('orders', '4', 'paid');
SELECT idem_transition('orders', '4', 'new');
SELECT status, version FROM orders WHERE id = 4;
-- illegal: no transition and not reachable
SELECT idem_transition('orders', '2', 'delivered');
SELECT idem_transition('orders', '2', 'nonsense');
SELECT idem_transition('orders', '6', 'paid');
SELECT status, version FROM orders WHERE id = 2;
-- not_found
SELECT idem_transition('orders', '99', 'paid');
SELECT idem_transition('orders', '99', 'paid', 0);

-- with expected_version
SELECT id, status, version FROM orders WHERE id = 3;
-- stale: another version
SELECT idem_transition('orders', '3', 'shipped', 6);
SELECT idem_transition('orders', '3', 'shipped', 8);
-- applied: at the expected version and allowed
SELECT idem_transition('orders', '3', 'shipped', 7);
SELECT id, status, version FROM orders WHERE id = 3;
-- already: in to_state at expected_version + 1, the retry
SELECT idem_transition('orders', '3', 'shipped', 7);
-- stale, not already: in to_state but further on
SELECT idem_transition('orders', '3', 'shipped', 6);
-- stale: expected version is old and the state differs
SELECT idem_transition('orders', '3', 'cancelled', 7);
-- illegal: at the expected version but not allowed
SELECT idem_transition('orders', '3', 'new', 8);
-- already: to the state it is in, at the expected version, without a
-- transition to itself (nothing is written)
SELECT idem_transition('orders', '3', 'shipped', 8);
SELECT id, status, version FROM orders WHERE id = 3;
-- applied once the machine allows a transition to itself: a touch
SELECT idem_allow('order', 'shipped', 'shipped');
SELECT idem_transition('orders', '3', 'shipped', 8);
SELECT id, status, version FROM orders WHERE id = 3;
SELECT idem_disallow('order', 'shipped', 'shipped');
-- the state given is read by the column type: ' paid' is not 'paid'
SELECT idem_transition('orders', '5', ' paid');
-- in a transaction, the outcome commits and rolls back with it
BEGIN;
SELECT idem_transition('orders', '5', 'paid');
ROLLBACK;
SELECT status, version FROM orders WHERE id = 5;
BEGIN;
SELECT idem_transition('orders', '5', 'paid');
SELECT idem_transition('orders', '5', 'paid');
SELECT idem_transition('orders', '5', 'shipped', 1);
COMMIT;
SELECT status, version FROM orders WHERE id = 5;

-- in a cycle, a legal transition wins over "stale"
SELECT idem_allow('door', 'open', 'closed'), idem_allow('door', 'closed', 'open'),
       idem_allow('door', 'closed', 'locked'), idem_allow('door', 'locked', 'closed');
CREATE TABLE doors (name text PRIMARY KEY, state text NOT NULL);
INSERT INTO doors VALUES ('front', 'open'), ('back', 'locked');
SELECT idem_guard('doors', 'door', 'state');
SELECT idem_transition('doors', 'front', 'closed');
SELECT idem_transition('doors', 'front', 'open');
-- a late "open" for a door already locked: locked is reachable from open
SELECT idem_transition('doors', 'back', 'open');
SELECT idem_transition('doors', 'back', 'closed');
-- without a version column, every update is checked for the state only
UPDATE doors SET state = 'open' WHERE name = 'back' RETURNING *;
SELECT err($$UPDATE doors SET state = 'locked' WHERE name = 'back'$$);
-- and expected_version is refused
SELECT err($$SELECT idem_transition('doors', 'back', 'closed', 1)$$);

------------------------------------------------------------------------
-- integer and enum state columns
------------------------------------------------------------------------
SELECT idem_allow('level', '1', '2'), idem_allow('level', '2', '3');
CREATE TABLE levels (k bigint PRIMARY KEY, lvl integer, v integer NOT NULL);
INSERT INTO levels VALUES (10, 1, 0), (11, 3, 0), (12, NULL, 0);
SELECT idem_guard('levels', 'level', 'lvl', 'v');
UPDATE levels SET lvl = lvl + 1 WHERE k = 10 RETURNING *;
SELECT err($$UPDATE levels SET lvl = 1 WHERE k = 10$$);
-- the state given is read by the column type: '03' is 3
SELECT idem_transition('levels', '10', '03', 1);
SELECT idem_transition('levels', '10', '03', 1);
SELECT idem_transition('levels', '11', '2');
SELECT * FROM levels ORDER BY k;
-- NULL is not a state: neither to nor from it
SELECT err($$UPDATE levels SET lvl = NULL WHERE k = 10$$);
SELECT err($$UPDATE levels SET lvl = 1 WHERE k = 12$$);
SELECT idem_transition('levels', '12', '1');
UPDATE levels SET v = v WHERE k = 12 RETURNING *;
-- a state the column type cannot read is an error of that type
SELECT err($$SELECT idem_transition('levels', '10', 'three')$$);
SELECT err($$SELECT idem_transition('levels', 'ten', '3')$$);

CREATE TYPE ticket_state AS ENUM ('open', 'assigned', 'resolved', 'closed');
SELECT idem_allow('ticket', 'open', 'assigned'), idem_allow('ticket', 'assigned', 'resolved'),
       idem_allow('ticket', 'resolved', 'closed'), idem_allow('ticket', 'resolved', 'assigned');
CREATE TABLE tickets (code text PRIMARY KEY, state ticket_state NOT NULL,
                      rev smallint NOT NULL DEFAULT 0);
INSERT INTO tickets VALUES ('T-1', 'open', 0), ('T-2', 'resolved', 32766);
SELECT idem_guard('tickets', 'ticket', 'state', 'rev');
UPDATE tickets SET state = 'assigned' WHERE code = 'T-1' RETURNING *;
SELECT err($$UPDATE tickets SET state = 'closed' WHERE code = 'T-1'$$);
SELECT idem_transition('tickets', 'T-1', 'resolved', 1);
SELECT idem_transition('tickets', 'T-1', 'open');
SELECT err($$SELECT idem_transition('tickets', 'T-1', 'reopened')$$);
-- a smallint version that cannot go up any more
SELECT idem_transition('tickets', 'T-2', 'closed', 32766);
SELECT err($$UPDATE tickets SET code = 'T-2' WHERE code = 'T-2'$$);
SELECT * FROM tickets ORDER BY code;

------------------------------------------------------------------------
-- changes of the machine take effect at once
------------------------------------------------------------------------
SELECT err($$UPDATE orders SET status = 'new' WHERE id = 2$$);
SELECT idem_allow('order', 'paid', 'new');
UPDATE orders SET status = 'new' WHERE id = 2 RETURNING id, status, version;
SELECT idem_disallow('order', 'paid', 'new');
SELECT idem_disallow('order', 'paid', 'new');
SELECT idem_transition('orders', '2', 'paid');
SELECT err($$UPDATE orders SET status = 'new' WHERE id = 2$$);
-- an allow rolled back is forgotten
BEGIN;
SELECT idem_allow('order', 'paid', 'new');
UPDATE orders SET status = 'new' WHERE id = 2 RETURNING id, status;
ROLLBACK;
SELECT err($$UPDATE orders SET status = 'new' WHERE id = 2$$);
BEGIN;
SAVEPOINT s;
SELECT idem_allow('order', 'paid', 'new');
ROLLBACK TO SAVEPOINT s;
SELECT err($$UPDATE orders SET status = 'new' WHERE id = 2$$);
COMMIT;
-- plain SQL on the definitions works as well
INSERT INTO idem.transitions VALUES ('order', 'paid', 'new');
SELECT idem_transition('orders', '2', 'new');
DELETE FROM idem.transitions WHERE machine = 'order' AND to_state = 'new';
SELECT idem_transition('orders', '2', 'paid');
SELECT idem_transition('orders', '2', 'new');
CREATE TABLE saved_transitions AS SELECT * FROM idem.transitions;
TRUNCATE idem.transitions;
SELECT err($$UPDATE orders SET status = 'shipped' WHERE id = 2$$);
INSERT INTO idem.transitions SELECT * FROM saved_transitions;
UPDATE orders SET status = 'shipped' WHERE id = 2 RETURNING id, status, version;

------------------------------------------------------------------------
-- guarding again, unguarding
------------------------------------------------------------------------
-- guarding again with the same definition does nothing; another definition
-- is refused, not put in place of the guard: unguard first
SELECT idem_guard('orders', 'order', 'status', 'version');
SELECT err($$SELECT idem_guard('orders', 'order', 'status')$$);
SELECT err($$SELECT idem_guard('orders', 'order', 'note', 'version')$$);
SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'orders'::regclass;
BEGIN;
SELECT idem_unguard('orders');
SELECT idem_guard('orders', 'order', 'status');
SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'orders'::regclass;
UPDATE orders SET version = 100 WHERE id = 2 RETURNING id, status, version;
SELECT idem_unguard('orders');
SELECT idem_guard('orders', 'order', 'status', 'version');
COMMIT;
-- a guarded column is not renamed under its guard (see guard_ddl)
SELECT err($$ALTER TABLE orders RENAME COLUMN status TO order_status$$);
SELECT idem_transition('orders', '2', 'delivered', 100);
-- idem_transition refuses to run when the guard is disabled
ALTER TABLE orders DISABLE TRIGGER idem_guard;
SELECT err($$SELECT idem_transition('orders', '1', 'delivered')$$);
ALTER TABLE orders ENABLE TRIGGER idem_guard;
-- a guard that does not fire in this session is noticed
SET session_replication_role = replica;
SELECT err($$SELECT idem_transition('orders', '1', 'delivered')$$);
RESET session_replication_role;
SELECT status, version FROM orders WHERE id = 1;
-- another BEFORE trigger that skips the row is noticed
CREATE FUNCTION skip_row() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN RETURN NULL; END; $$;
CREATE TRIGGER a_skip BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION skip_row();
SELECT err($$SELECT idem_transition('orders', '1', 'delivered')$$);
DROP TRIGGER a_skip ON orders;
CREATE TRIGGER z_skip BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION skip_row();
SELECT err($$SELECT idem_transition('orders', '1', 'delivered')$$);
-- a request the guard does not apply is not affected by later triggers
SELECT idem_transition('orders', '1', 'shipped');
DROP TRIGGER z_skip ON orders;
-- unguarding
SELECT idem_unguard('orders');
SELECT idem_unguard('orders');
SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders'::regclass;
UPDATE orders SET status = 'new', version = 0 WHERE id = 1 RETURNING id, status, version;
SELECT err($$SELECT idem_transition('orders', '1', 'paid')$$);

------------------------------------------------------------------------
-- names are quoted everywhere
------------------------------------------------------------------------
CREATE SCHEMA "we""ird";
CREATE TABLE "we""ird"."Tab; DROP TABLE orders" (
    "key col" text PRIMARY KEY,
    "St'ate" text NOT NULL,
    "ver-sion" integer NOT NULL
);
INSERT INTO "we""ird"."Tab; DROP TABLE orders" VALUES ('a''b', 'new', 0);
SELECT idem_guard('"we""ird"."Tab; DROP TABLE orders"', 'order', 'St''ate', 'ver-sion');
SELECT idem_transition('"we""ird"."Tab; DROP TABLE orders"', 'a''b', 'paid', 0);
SELECT idem_transition('"we""ird"."Tab; DROP TABLE orders"', 'a''b', 'paid', 0);
SELECT * FROM "we""ird"."Tab; DROP TABLE orders";
SELECT err($$UPDATE "we""ird"."Tab; DROP TABLE orders" SET "St'ate" = 'new'$$);
SELECT count(*) FROM orders;
-- a machine name is a literal
SELECT idem_allow('m''); DROP TABLE orders; --', 'a', 'b');
CREATE TABLE quoted (id integer PRIMARY KEY, s text NOT NULL);
INSERT INTO quoted VALUES (1, 'a');
SELECT idem_guard('quoted', 'm''); DROP TABLE orders; --', 's');
SELECT idem_transition('quoted', '1', 'b');
SELECT count(*) FROM orders;

DROP SCHEMA "we""ird" CASCADE;
DROP TABLE orders, doors, levels, tickets, quoted, saved_transitions;
DROP TYPE ticket_state;
DROP FUNCTION reopen(integer);
DROP FUNCTION skip_row();
DELETE FROM idem.transitions;
DROP FUNCTION err(text);
DROP FUNCTION fields(text);
