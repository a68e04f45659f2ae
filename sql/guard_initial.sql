-- Initial states: when a machine has any, a new row of a table it guards
-- (INSERT, COPY) must start in one of them; a machine without any lets a
-- row start anywhere, as before.  State names are limited to 63 bytes, and
-- idem_machines lists every machine.
\set VERBOSITY terse

CREATE FUNCTION err(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text;
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    RETURN st || ': ' || msg;
END;
$$;

SELECT idem_allow('order', 'new', 'paid');
SELECT idem_allow('order', 'paid', 'shipped');
SELECT idem_allow('order', 'new', 'cancelled');

CREATE TABLE ini_orders (id integer PRIMARY KEY, status text, version bigint NOT NULL DEFAULT 0);
SELECT idem_guard('ini_orders', 'order', 'status', 'version');

-- no initial state: a row starts anywhere
INSERT INTO ini_orders VALUES (1, 'shipped', 0), (2, NULL, 0), (3, 'elsewhere', 5);
SELECT * FROM idem_machines WHERE machine IN ('order', 'other') ORDER BY machine;

SELECT idem_allow_initial('order', 'new');
SELECT idem_allow_initial('order', 'new');
SELECT idem_allow_initial('order', 'cancelled');
SELECT * FROM idem_machines WHERE machine IN ('order', 'other') ORDER BY machine;
-- INSERT: only the initial states, and the version starts where the row says
SELECT err($$INSERT INTO ini_orders VALUES (10, 'paid')$$);
SELECT err($$INSERT INTO ini_orders VALUES (11, NULL)$$);
SELECT err($$INSERT INTO ini_orders VALUES (12, 'new'), (13, 'shipped')$$);
INSERT INTO ini_orders VALUES (14, 'new', 0), (15, 'cancelled', 3);
INSERT INTO ini_orders SELECT 16, 'new', 42;
SELECT * FROM ini_orders WHERE id > 9 ORDER BY id;
-- INSERT ... ON CONFLICT: the row proposed is checked as an INSERT
SELECT err($$INSERT INTO ini_orders VALUES (14, 'paid') ON CONFLICT (id) DO UPDATE SET status = excluded.status$$);
INSERT INTO ini_orders VALUES (14, 'new') ON CONFLICT (id) DO UPDATE SET status = 'paid';
SELECT * FROM ini_orders WHERE id = 14;
-- COPY
COPY ini_orders FROM stdin;
20	new	0
21	cancelled	7
\.
SELECT err($$COPY ini_orders FROM PROGRAM 'printf "22\tnew\t0\n23\tshipped\t0\n"'$$);
SELECT * FROM ini_orders WHERE id >= 20 ORDER BY id;
-- the rows that started elsewhere before still move by the machine
SELECT err($$UPDATE ini_orders SET status = 'new' WHERE id = 1$$);
SELECT idem_transition('ini_orders', '16', 'paid', 42);
SELECT * FROM ini_orders WHERE id = 16;

-- another machine is not concerned
SELECT idem_allow('other', 'a', 'b');
CREATE TABLE ini_things (id integer PRIMARY KEY, status text NOT NULL);
SELECT idem_guard('ini_things', 'other', 'status');
INSERT INTO ini_things VALUES (1, 'b');

-- a session that read the machines sees the change at its next statement
SELECT idem_disallow_initial('order', 'cancelled');
SELECT err($$INSERT INTO ini_orders VALUES (30, 'cancelled')$$);
SELECT idem_disallow_initial('order', 'cancelled');
SELECT idem_disallow_initial('order', 'new');
INSERT INTO ini_orders VALUES (31, 'shipped');
SELECT * FROM idem_machines WHERE machine IN ('order', 'other') ORDER BY machine;
SELECT idem_allow_initial('order', 'new');

-- a guard made before 0.2.0 (BEFORE UPDATE only) checks no INSERT, and
-- still guards every UPDATE
CREATE TABLE ini_legacy (id integer PRIMARY KEY, status text NOT NULL);
CREATE TRIGGER idem_guard BEFORE UPDATE ON ini_legacy FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status');
INSERT INTO ini_legacy VALUES (1, 'paid');
SELECT err($$UPDATE ini_legacy SET status = 'new'$$);
SELECT idem_transition('ini_legacy', '1', 'shipped');
-- idem_guard takes it as the same guard
SELECT idem_guard('ini_legacy', 'order', 'status');
-- a trigger for INSERT alone, or for DELETE too, is no guard
CREATE TABLE ini_badguard (id integer PRIMARY KEY, status text NOT NULL);
SELECT err($$CREATE TRIGGER g BEFORE INSERT ON ini_badguard FOR EACH ROW EXECUTE FUNCTION idem_guard_trigger('order', 'status')$$);
SELECT err($$CREATE TRIGGER g BEFORE INSERT OR UPDATE OR DELETE ON ini_badguard FOR EACH ROW EXECUTE FUNCTION idem_guard_trigger('order', 'status')$$);

-- a partitioned table: rows moved by an UPDATE to another partition are not
-- new rows, whatever partition they land in; new ones are checked in every
-- partition
CREATE TABLE ini_porders (id integer, status text NOT NULL, version integer NOT NULL DEFAULT 0,
                      PRIMARY KEY (id, status)) PARTITION BY LIST (status);
CREATE TABLE porders_new PARTITION OF ini_porders FOR VALUES IN ('new');
-- laid out otherwise than its parent
CREATE TABLE porders_paid (version integer NOT NULL DEFAULT 0, gone integer,
                           status text NOT NULL, id integer NOT NULL);
ALTER TABLE porders_paid DROP COLUMN gone;
ALTER TABLE ini_porders ATTACH PARTITION porders_paid FOR VALUES IN ('paid');
CREATE TABLE porders_rest PARTITION OF ini_porders DEFAULT;
SELECT idem_guard('ini_porders', 'order', 'status', 'version');
INSERT INTO ini_porders VALUES (1, 'new'), (2, 'new'), (3, 'new');
SELECT err($$INSERT INTO ini_porders VALUES (4, 'paid')$$);
SELECT err($$INSERT INTO porders_rest VALUES (4, 'shipped')$$);
UPDATE ini_porders SET status = 'paid' WHERE id = 1;
SELECT idem_transition('ini_porders', ARRAY['2', 'new'], 'cancelled', 0);
UPDATE ini_porders SET status = 'shipped' WHERE id = 1;
SELECT err($$UPDATE ini_porders SET status = 'shipped' WHERE id = 3$$);
SELECT tableoid::regclass, * FROM ini_porders ORDER BY id;
-- an UPDATE that does not move its row lets no INSERT after it through
BEGIN;
UPDATE ini_porders SET version = version + 1 WHERE id = 1;
SELECT err($$INSERT INTO ini_porders VALUES (9, 'shipped', 3)$$);
ROLLBACK;
-- a BEFORE trigger that writes while the row moves
CREATE TABLE ini_audit (n serial, what text);
CREATE FUNCTION audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ini_audit (what) VALUES (TG_OP || ' ' || TG_TABLE_NAME);
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END;
$$;
CREATE TRIGGER ini_audit BEFORE DELETE ON porders_new FOR EACH ROW EXECUTE FUNCTION audit_row();
INSERT INTO ini_porders VALUES (5, 'new');
UPDATE ini_porders SET status = 'paid' WHERE id = 5;
SELECT tableoid::regclass, * FROM ini_porders WHERE id = 5;
SELECT what FROM ini_audit ORDER BY n;
-- only a row that leaves its partition is a move: an UPDATE that keeps it in
-- its partition lets neither a DELETE and INSERT of it, nor the same row in
-- another table, pass for one
CREATE TABLE ini_porders2 (LIKE ini_porders INCLUDING ALL) PARTITION BY LIST (status);
CREATE TABLE porders2_rest PARTITION OF ini_porders2 DEFAULT;
SELECT idem_guard('ini_porders2', 'order', 'status', 'version');
BEGIN;
UPDATE ini_porders SET version = version + 1 WHERE id = 1;
CREATE TEMP TABLE ini_keep AS SELECT * FROM ini_porders WHERE id = 1;
DELETE FROM ini_porders WHERE id = 1;
SELECT err($$INSERT INTO ini_porders SELECT * FROM ini_keep$$);
ROLLBACK;
BEGIN;
UPDATE ini_porders SET version = version + 1 WHERE id = 1;
SELECT err($$INSERT INTO ini_porders2 SELECT * FROM ini_porders WHERE id = 1$$);
ROLLBACK;
-- nor does a move let the same row into another table after it
BEGIN;
UPDATE ini_porders SET status = 'paid' WHERE id = 5;
SELECT err($$INSERT INTO ini_porders2 SELECT * FROM ini_porders WHERE id = 5$$);
ROLLBACK;
SELECT tableoid::regclass, * FROM ini_porders ORDER BY id;
SELECT count(*) FROM ini_porders2;

-- names: states and machines of at most 63 bytes
SELECT err(format($$SELECT idem_allow('order', %L, 'paid')$$, repeat('s', 64)));
SELECT err(format($$SELECT idem_allow('order', 'new', %L)$$, repeat('s', 64)));
SELECT err(format($$SELECT idem_disallow('order', 'new', %L)$$, repeat('s', 64)));
SELECT idem_allow('order', 'new', repeat('s', 63));
SELECT idem_disallow('order', 'new', repeat('s', 63));
SELECT err(format($$SELECT idem_allow_initial('order', %L)$$, repeat('s', 64)));
SELECT err(format($$SELECT idem_allow_initial(%L, 'new')$$, repeat('m', 64)));
SELECT err($$SELECT idem_allow_initial('', 'new')$$);
SELECT err($$SELECT idem_allow_initial(NULL, 'new')$$);
SELECT err($$SELECT idem_allow_initial('order', NULL)$$);
SELECT err($$SELECT idem_disallow_initial('order', NULL)$$);
-- idem.transitions keeps a longer state written by hand (0.1.0 took them): the
-- guard works with it, by its whole name (its first 63 bytes are another
-- state, which the machine does not reach from new)
BEGIN;
SELECT err(format($$INSERT INTO idem.transitions VALUES ('order', 'new', %L)$$, repeat('s', 64)));
SELECT count(*) FROM idem_machines WHERE machine = 'order';
SELECT status FROM ini_orders WHERE id = 20;
SELECT err(format($$UPDATE ini_orders SET status = %L WHERE id = 20$$, repeat('s', 63)));
SELECT err(format($$UPDATE ini_orders SET status = %L WHERE id = 20$$, repeat('s', 64)));
SELECT octet_length(status), version FROM ini_orders WHERE id = 20;
ROLLBACK;
SELECT err(format($$INSERT INTO idem.initial_states VALUES ('order', %L)$$, repeat('s', 64)));

-- administration is for those granted it; the view for pg_monitor
CREATE ROLE regress_idem_initial;
SET ROLE regress_idem_initial;
SELECT err($$SELECT idem_allow_initial('order', 'paid')$$);
SELECT err($$SELECT idem_disallow_initial('order', 'new')$$);
SELECT err($$SELECT * FROM idem_machines$$);
SELECT err($$INSERT INTO idem.initial_states VALUES ('order', 'paid')$$);
RESET ROLE;
GRANT pg_monitor TO regress_idem_initial;
SET ROLE regress_idem_initial;
SELECT machine, initial_states FROM idem_machines WHERE machine IN ('order', 'other') ORDER BY machine;
RESET ROLE;
DROP ROLE regress_idem_initial;

DROP TABLE ini_orders, ini_things, ini_legacy, ini_badguard, ini_porders, ini_porders2, ini_audit;
DROP FUNCTION audit_row();
DROP FUNCTION err(text);
DELETE FROM idem.initial_states;
DELETE FROM idem.transitions;
