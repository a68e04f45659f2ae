-- state-transition guard: bad input, privileges and misuse, with SQLSTATEs
\set VERBOSITY terse

-- err(sql): run sql; 'ok', or the SQLSTATE and the message
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

SELECT idem_allow('order', 'new', 'paid'), idem_allow('order', 'paid', 'shipped');
CREATE TABLE orders (id integer PRIMARY KEY, status text NOT NULL,
                     version integer NOT NULL DEFAULT 0, amount numeric,
                     loose_version integer);
INSERT INTO orders VALUES (1, 'new');

-- idem_allow, idem_disallow
SELECT err($$SELECT idem_allow(NULL, 'a', 'b')$$);
SELECT err($$SELECT idem_allow('m', NULL, 'b')$$);
SELECT err($$SELECT idem_allow('m', 'a', NULL)$$);
SELECT err($$SELECT idem_disallow(NULL, 'a', 'b')$$);
SELECT err($$SELECT idem_disallow('m', NULL, 'b')$$);
SELECT err($$SELECT idem_disallow('m', 'a', NULL)$$);
SELECT err($$SELECT idem_allow('', 'a', 'b')$$);
SELECT err($$SELECT idem_allow(repeat('m', 64), 'a', 'b')$$);
SELECT idem_allow(repeat('m', 63), 'a', 'b');
SELECT idem_disallow(repeat('m', 63), 'a', 'b');
-- the table itself refuses what idem_allow would
SELECT err($$INSERT INTO idem.transitions VALUES ('', 'a', 'b')$$);
SELECT err($$INSERT INTO idem.transitions VALUES ('m', NULL, 'b')$$);

-- idem_guard
SELECT err($$SELECT idem_guard(NULL, 'order', 'status')$$);
SELECT err($$SELECT idem_guard('orders', NULL, 'status')$$);
SELECT err($$SELECT idem_guard('orders', 'order', NULL)$$);
SELECT err($$SELECT idem_guard('orders', '', 'status')$$);
SELECT err($$SELECT idem_guard('orders', repeat('m', 64), 'status')$$);
SELECT err($$SELECT idem_guard('no_such_table', 'order', 'status')$$);
SELECT err($$SELECT idem_guard(0, 'order', 'status')$$);
SELECT err($$SELECT idem_guard('orders', 'order', 'no_such_column')$$);
SELECT err($$SELECT idem_guard('orders', 'order', 'ctid')$$);
SELECT err($$SELECT idem_guard('orders', 'order', 'status', 'no_such_column')$$);
SELECT err($$SELECT idem_guard('orders', 'order', 'status', 'amount')$$);
SELECT err($$SELECT idem_guard('orders', 'order', 'status', 'status')$$);
SELECT err($$SELECT idem_guard('orders', 'order', 'status', 'loose_version')$$);
SELECT err($$SELECT idem_guard('orders', 'no_such_machine', 'status')$$);
CREATE VIEW orders_view AS SELECT * FROM orders;
SELECT err($$SELECT idem_guard('orders_view', 'order', 'status')$$);
CREATE TABLE parted (id integer PRIMARY KEY, status text) PARTITION BY RANGE (id);
SELECT err($$SELECT idem_guard('parted', 'order', 'status')$$);
CREATE SEQUENCE seq;
SELECT err($$SELECT idem_guard('seq', 'order', 'last_value')$$);
-- a trigger of that name that is not the guard is left alone
CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END; $$;
CREATE TRIGGER idem_guard BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION noop();
SELECT err($$SELECT idem_guard('orders', 'order', 'status')$$);
SELECT idem_unguard('orders');
SELECT tgname FROM pg_trigger WHERE tgrelid = 'orders'::regclass;
DROP TRIGGER idem_guard ON orders;
-- nothing was guarded by the failed calls
SELECT count(*) FROM pg_trigger WHERE tgfoid = 'idem_guard_trigger'::regproc;

-- idem_unguard
SELECT err($$SELECT idem_unguard(NULL)$$);
SELECT err($$SELECT idem_unguard(0)$$);
SELECT idem_unguard('orders');

-- idem_transition
SELECT err($$SELECT idem_transition(NULL, '1', 'paid')$$);
SELECT err($$SELECT idem_transition('orders', NULL, 'paid')$$);
SELECT err($$SELECT idem_transition('orders', '1', NULL)$$);
SELECT err($$SELECT idem_transition('no_such_table', '1', 'paid')$$);
SELECT err($$SELECT idem_transition(0, '1', 'paid')$$);
SELECT err($$SELECT idem_transition('orders', '1', 'paid')$$);
SELECT err($$SELECT idem_transition('orders_view', '1', 'paid')$$);
SELECT idem_guard('orders', 'order', 'status', 'version');
SELECT err($$SELECT idem_transition('orders', 'one', 'paid')$$);
SELECT err($$SELECT idem_transition('orders', '', 'paid')$$);
-- a NULL expected_version is no expected version
SELECT idem_transition('orders', '1', 'paid', NULL);
-- the key is the single-column primary key
CREATE TABLE nokey (id integer, status text NOT NULL);
INSERT INTO nokey VALUES (1, 'new');
SELECT idem_guard('nokey', 'order', 'status');
SELECT err($$SELECT idem_transition('nokey', '1', 'paid')$$);
-- (the guard works without a key; the error names no key then)
SELECT err($$UPDATE nokey SET status = 'shipped'$$);
CREATE TABLE twokey (a integer, b integer, status text NOT NULL, PRIMARY KEY (a, b));
SELECT idem_guard('twokey', 'order', 'status');
SELECT err($$SELECT idem_transition('twokey', '1', 'paid')$$);
-- a unique key is not the primary key
CREATE TABLE uniquekey (id integer UNIQUE NOT NULL, status text NOT NULL);
SELECT idem_guard('uniquekey', 'order', 'status');
SELECT err($$SELECT idem_transition('uniquekey', '1', 'paid')$$);
-- two guards on one table
CREATE TRIGGER other_guard BEFORE UPDATE ON orders FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status');
SELECT err($$SELECT idem_transition('orders', '1', 'shipped')$$);
DROP TRIGGER other_guard ON orders;

-- the trigger function is only a BEFORE ROW trigger for UPDATE (or INSERT)
SELECT err($$SELECT idem_guard_trigger()$$);
CREATE TRIGGER after_guard AFTER UPDATE ON nokey FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status');
SELECT err($$UPDATE nokey SET status = 'new'$$);
DROP TRIGGER after_guard ON nokey;
CREATE TRIGGER delete_guard BEFORE DELETE ON nokey FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status');
SELECT err($$DELETE FROM nokey$$);
DROP TRIGGER delete_guard ON nokey;
CREATE TRIGGER insert_guard BEFORE INSERT ON nokey FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status');
INSERT INTO nokey VALUES (2, 'anything') RETURNING *;
DROP TRIGGER insert_guard ON nokey;
CREATE TRIGGER bad_args BEFORE UPDATE ON uniquekey FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order');
INSERT INTO uniquekey VALUES (1, 'new');
SELECT err($$UPDATE uniquekey SET status = 'paid'$$);
DROP TRIGGER bad_args ON uniquekey;
CREATE TRIGGER bad_type BEFORE UPDATE ON uniquekey FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'status');
SELECT err($$UPDATE uniquekey SET status = 'paid'$$);
DROP TRIGGER bad_type ON uniquekey;

-- a read-only transaction
BEGIN READ ONLY;
SELECT err($$SELECT idem_transition('orders', '1', 'shipped')$$);
SELECT err($$SELECT idem_guard('orders', 'order', 'status')$$);
SELECT err($$SELECT idem_unguard('orders')$$);
SELECT err($$SELECT idem_allow('order', 'a', 'b')$$);
COMMIT;

------------------------------------------------------------------------
-- privileges
------------------------------------------------------------------------
CREATE ROLE regress_idem_guard_clerk;
CREATE ROLE regress_idem_guard_admin;
GRANT SELECT, UPDATE ON orders TO regress_idem_guard_clerk;
GRANT EXECUTE ON FUNCTION idem_allow(text, text, text), idem_disallow(text, text, text),
    idem_guard(regclass, text, name, name), idem_unguard(regclass)
    TO regress_idem_guard_admin;
GRANT SELECT ON nokey TO regress_idem_guard_admin;
CREATE TABLE admin_owned (id integer PRIMARY KEY, status text NOT NULL);
ALTER TABLE admin_owned OWNER TO regress_idem_guard_admin;
CREATE TABLE granted (id integer PRIMARY KEY, status text NOT NULL);
GRANT TRIGGER ON granted TO regress_idem_guard_admin;
CREATE TABLE secret (id integer PRIMARY KEY, status text NOT NULL);
INSERT INTO secret VALUES (1, 'new');
SELECT idem_guard('secret', 'order', 'status');

SET ROLE regress_idem_guard_clerk;
-- the administration functions are not for everyone
SELECT err($$SELECT idem_allow('order', 'paid', 'new')$$);
SELECT err($$SELECT idem_disallow('order', 'new', 'paid')$$);
SELECT err($$SELECT idem_guard('orders', 'order', 'status')$$);
SELECT err($$SELECT idem_unguard('orders')$$);
SELECT err($$SELECT * FROM idem.transitions$$);
-- a clerk who may update the table moves its rows, under the guard
SELECT idem_transition('orders', '1', 'shipped');
SELECT err($$UPDATE orders SET status = 'new' WHERE id = 1$$);
UPDATE orders SET amount = 10 WHERE id = 1 RETURNING id, status, version, amount;
-- but not those of a table they may not update
SELECT err($$SELECT idem_transition('secret', '1', 'paid')$$);
SELECT err($$UPDATE secret SET status = 'paid'$$);
RESET ROLE;
REVOKE UPDATE ON orders FROM regress_idem_guard_clerk;
SET ROLE regress_idem_guard_clerk;
SELECT err($$SELECT idem_transition('orders', '1', 'shipped')$$);
RESET ROLE;

SET ROLE regress_idem_guard_admin;
SELECT idem_allow('order', 'shipped', 'returned');
SELECT idem_disallow('order', 'shipped', 'returned');
-- idem_guard runs as its caller: guarding takes the TRIGGER privilege,
-- guarding again and unguarding the ownership
SELECT idem_guard('admin_owned', 'order', 'status');
SELECT idem_guard('admin_owned', 'order', 'status');
SELECT idem_unguard('admin_owned');
SELECT err($$SELECT idem_guard('nokey', 'order', 'status')$$);
SELECT err($$SELECT idem_unguard('nokey')$$);
SELECT idem_guard('granted', 'order', 'status');
SELECT err($$SELECT idem_guard('granted', 'order', 'status')$$);
SELECT err($$SELECT idem_unguard('granted')$$);
RESET ROLE;

-- the administration functions run with a safe search_path
SELECT p.proname, p.prosecdef, p.proconfig
  FROM pg_proc p
 WHERE p.proname IN ('idem_allow', 'idem_disallow', 'idem_guard', 'idem_unguard',
                     'idem_transition', 'idem_guard_trigger')
 ORDER BY p.proname;
SELECT p.proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_may
  FROM pg_proc p
 WHERE p.proname IN ('idem_allow', 'idem_disallow', 'idem_guard', 'idem_unguard',
                     'idem_transition', 'idem_guard_trigger')
 ORDER BY p.proname;

DROP TABLE orders CASCADE;
DROP TABLE nokey, twokey, uniquekey, parted, admin_owned, granted, secret;
DROP SEQUENCE seq;
DROP FUNCTION noop();
DROP OWNED BY regress_idem_guard_clerk, regress_idem_guard_admin;
DROP ROLE regress_idem_guard_clerk;
DROP ROLE regress_idem_guard_admin;
DELETE FROM idem.transitions;
DROP FUNCTION err(text);
