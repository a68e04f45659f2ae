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
-- a deferrable primary key may hold duplicates until commit: said so
CREATE TABLE deferkey (id integer PRIMARY KEY DEFERRABLE, status text NOT NULL);
SELECT idem_guard('deferkey', 'order', 'status');
INSERT INTO deferkey VALUES (1, 'new');
SELECT err($$SELECT idem_transition('deferkey', '1', 'paid')$$);
-- two guards on one table: refused when the second is made...
SELECT err($$CREATE TRIGGER other_guard BEFORE UPDATE ON orders FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status')$$);
-- ...and, made where the event trigger does not fire (here with
-- session_replication_role = replica), where they are used
SET session_replication_role = replica;
CREATE TRIGGER other_guard BEFORE UPDATE ON orders FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status');
RESET session_replication_role;
SELECT err($$SELECT idem_transition('orders', '1', 'shipped')$$);
SELECT err($$SELECT idem_guard('orders', 'order', 'status', 'version')$$);
DROP TRIGGER other_guard ON orders;

-- the trigger function is only a BEFORE UPDATE FOR EACH ROW trigger with the
-- guard's arguments.  Any other trigger that executes it is refused when
-- made (its own error), and, made where the event trigger does not fire,
-- wherever it fires or is used: it never does nothing in silence.
SELECT err($$SELECT idem_guard_trigger()$$);
CREATE TABLE handmade (id integer PRIMARY KEY, status text NOT NULL,
                       version integer NOT NULL DEFAULT 0);
INSERT INTO handmade VALUES (1, 'new');
CREATE FUNCTION handmade(def text) RETURNS TABLE (step text, outcome text)
LANGUAGE plpgsql AS $f$
DECLARE
    steps text[] := ARRAY['create', 'insert', 'update', 'delete', 'transition'];
    outcomes text[];
BEGIN
    BEGIN
        outcomes := ARRAY[err('CREATE TRIGGER hand ' || def)];
        IF outcomes[1] = 'ok' THEN
            EXECUTE 'DROP TRIGGER hand ON handmade';
        END IF;
        PERFORM set_config('session_replication_role', 'replica', true);
        EXECUTE 'CREATE TRIGGER hand ' || def;
        PERFORM set_config('session_replication_role', 'origin', true);
        outcomes := outcomes ||
            err($$INSERT INTO handmade VALUES (2, 'new')$$) ||
            err($$UPDATE handmade SET status = 'shipped' WHERE id = 1$$) ||
            err($$DELETE FROM handmade WHERE id = 1$$) ||
            err($$SELECT idem_transition('handmade', '1', 'shipped')$$);
        RAISE EXCEPTION 'undo' USING ERRCODE = 'IDEM0';
    EXCEPTION WHEN SQLSTATE 'IDEM0' THEN
        NULL;
    END;
    RETURN QUERY SELECT * FROM unnest(steps, outcomes);
END;
$f$;
SELECT * FROM handmade($$BEFORE INSERT ON handmade FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status')$$);
SELECT * FROM handmade($$BEFORE INSERT OR UPDATE ON handmade FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status')$$);
SELECT * FROM handmade($$AFTER UPDATE ON handmade FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status')$$);
SELECT * FROM handmade($$BEFORE UPDATE ON handmade FOR EACH STATEMENT
    EXECUTE FUNCTION idem_guard_trigger('order', 'status')$$);
SELECT * FROM handmade($$BEFORE DELETE ON handmade FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status')$$);
SELECT * FROM handmade($$BEFORE UPDATE OF version ON handmade FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status')$$);
SELECT * FROM handmade($$BEFORE UPDATE ON handmade FOR EACH ROW
    WHEN (old.version > 0) EXECUTE FUNCTION idem_guard_trigger('order', 'status')$$);
SELECT * FROM handmade($$BEFORE UPDATE ON handmade FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order')$$);
SELECT * FROM handmade($$BEFORE UPDATE ON handmade FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'version', 'x')$$);
SELECT * FROM handmade($$BEFORE UPDATE ON handmade FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'nope')$$);
-- a machine idem_guard refuses: empty, or over 63 bytes (a name cut
-- there would end inside a character)
SELECT * FROM handmade($$BEFORE UPDATE ON handmade FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('', 'status')$$);
SELECT * FROM handmade(format($$BEFORE UPDATE ON handmade FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger(%L, 'status')$$, repeat(U&'\00E9', 40)));
SELECT * FROM handmade($$BEFORE UPDATE ON handmade FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'status')$$);
SELECT * FROM handmade($$BEFORE UPDATE ON handmade FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'id')$$);
-- a trigger made by hand as the guard is, under any name, is the guard
SELECT * FROM handmade($$BEFORE UPDATE ON handmade FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'version')$$);
CREATE TRIGGER my_guard BEFORE UPDATE ON handmade FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'version');
SELECT idem_guard('handmade', 'order', 'status', 'version');
SELECT err($$SELECT idem_guard('handmade', 'order', 'status')$$);
SELECT idem_transition('handmade', '1', 'paid');
SELECT tgname FROM pg_trigger WHERE tgrelid = 'handmade'::regclass;
SELECT idem_unguard('handmade');
SELECT tgname FROM pg_trigger WHERE tgrelid = 'handmade'::regclass;
-- idem's own tables are never guarded
SELECT err($$SELECT idem_guard('idem.claims', 'order', 'ns')$$);
SELECT err($$CREATE TRIGGER g BEFORE UPDATE ON idem.transitions FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'to_state')$$);
SET session_replication_role = replica;
CREATE TRIGGER g BEFORE UPDATE ON idem.transitions FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'to_state');
RESET session_replication_role;
SELECT err($$UPDATE idem.transitions SET to_state = 'x' WHERE false$$);
SELECT err($$UPDATE idem.transitions SET to_state = to_state WHERE from_state = 'new'$$);
DROP TRIGGER g ON idem.transitions;

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
-- idem_guard runs as its caller: guarding takes the TRIGGER privilege, and
-- so does guarding again with the same definition (which does nothing);
-- another definition is refused whoever asks, and unguarding takes the
-- ownership
SELECT idem_guard('admin_owned', 'order', 'status');
SELECT idem_guard('admin_owned', 'order', 'status');
SELECT idem_unguard('admin_owned');
SELECT err($$SELECT idem_guard('nokey', 'order', 'status')$$);
SELECT err($$SELECT idem_unguard('nokey')$$);
SELECT idem_guard('granted', 'order', 'status');
SELECT idem_guard('granted', 'order', 'status');
SELECT err($$SELECT idem_guard('granted', 'order', 'status', 'id')$$);
SELECT err($$SELECT idem_guard('granted', 'order', 'id')$$);
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
DROP TABLE nokey, twokey, uniquekey, deferkey, parted, admin_owned, granted, secret, handmade;
DROP FUNCTION handmade(text);
DROP SEQUENCE seq;
DROP FUNCTION noop();
DROP OWNED BY regress_idem_guard_clerk, regress_idem_guard_admin;
DROP ROLE regress_idem_guard_clerk;
DROP ROLE regress_idem_guard_admin;
DELETE FROM idem.transitions;
DROP FUNCTION err(text);
