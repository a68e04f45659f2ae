-- A partitioned table guarded at the parent: the guard is cloned to every
-- partition, present and future; every UPDATE of a row, in any partition and
-- across partitions, is checked; idem_transition finds the row through the
-- parent by its (composite) primary key, as UPDATE parent ... WHERE pk = ...
-- would, and answers as on a plain table.
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

-- the guards of every relation of the trees of rels (its partitions, and
-- the children of an inheritance parent): a relation without one has a row
-- with nulls
CREATE FUNCTION guards(VARIADIC rels regclass[]) RETURNS TABLE (tbl regclass, cloned boolean, def text)
LANGUAGE sql AS $$
    SELECT r.relid, t.tgparentid <> 0,
           regexp_replace(pg_get_triggerdef(t.oid), ' ON [^ ]+ ', ' ON _ ')
      FROM (SELECT u AS relid FROM unnest(rels) u
            UNION
            SELECT p.relid FROM unnest(rels) u, pg_partition_tree(u) p
            UNION
            SELECT i.inhrelid::regclass FROM unnest(rels) u JOIN pg_inherits i ON i.inhparent = u) r
      LEFT JOIN pg_trigger t ON t.tgrelid = r.relid AND t.tgfoid = 'idem_guard_trigger'::regproc
     ORDER BY r.relid::text
$$;

SELECT idem_allow('pay', 'new', 'paid');
SELECT idem_allow('pay', 'paid', 'shipped');
SELECT idem_allow('pay', 'new', 'cancelled');

-- list partitioning, a composite primary key (the partition key is part of it)
CREATE TABLE pt_orders (
    region  text NOT NULL,
    id      integer NOT NULL,
    status  text NOT NULL,
    version bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (region, id)
) PARTITION BY LIST (region);
CREATE TABLE orders_eu PARTITION OF pt_orders FOR VALUES IN ('eu');
CREATE TABLE orders_us PARTITION OF pt_orders FOR VALUES IN ('us');
SELECT idem_guard('pt_orders', 'pay', 'status', 'version');
SELECT * FROM guards('pt_orders');
-- again with the same definition: nothing to do
SELECT idem_guard('pt_orders', 'pay', 'status', 'version');
SELECT err($$SELECT idem_guard('pt_orders', 'pay', 'status')$$);

-- a partition made after guarding gets the guard, and so does one attached
CREATE TABLE orders_asia PARTITION OF pt_orders FOR VALUES IN ('asia');
-- laid out otherwise than its parent: the guard finds its columns by name
CREATE TABLE orders_sa (version bigint NOT NULL DEFAULT 0, gone integer,
                        status text NOT NULL, id integer NOT NULL,
                        region text NOT NULL);
ALTER TABLE orders_sa DROP COLUMN gone;
ALTER TABLE orders_sa ADD PRIMARY KEY (region, id);
ALTER TABLE pt_orders ATTACH PARTITION orders_sa FOR VALUES IN ('sa');
SELECT * FROM guards('pt_orders');

INSERT INTO pt_orders (region, id, status)
SELECT r, i, 'new' FROM unnest(ARRAY['eu', 'us', 'asia', 'sa']) r, generate_series(1, 3) i;

-- illegal moves are refused in every partition, through the parent and
-- through the partition
SELECT r, err(format($$UPDATE pt_orders SET status = 'shipped' WHERE region = %L AND id = 1$$, r))
  FROM unnest(ARRAY['eu', 'us', 'asia', 'sa']) r;
SELECT r, err(format($$UPDATE %I SET status = 'shipped' WHERE id = 1$$, 'orders_' || r))
  FROM unnest(ARRAY['eu', 'us', 'asia', 'sa']) r;
-- legal ones pass, and bump the version
UPDATE pt_orders SET status = 'paid' WHERE id = 1;
SELECT tableoid::regclass, * FROM pt_orders WHERE id = 1 ORDER BY region;
SELECT err($$UPDATE pt_orders SET status = 'paid', version = 7 WHERE region = 'eu' AND id = 2$$);

-- an UPDATE that moves a row to another partition is checked too, and
-- keeps the version going up
SELECT err($$UPDATE pt_orders SET region = 'sa', id = 11, status = 'new' WHERE region = 'eu' AND id = 1$$);
SELECT err($$UPDATE pt_orders SET region = 'sa', id = 12, status = 'cancelled' WHERE region = 'eu' AND id = 1$$);
UPDATE pt_orders SET region = 'sa', id = 13, status = 'shipped' WHERE region = 'eu' AND id = 1;
UPDATE pt_orders SET region = 'asia', id = 14 WHERE region = 'us' AND id = 2;
SELECT tableoid::regclass, * FROM pt_orders WHERE id > 10 ORDER BY region, id;

-- idem_transition through the parent, by the values of the primary key in
-- its order: every outcome
SELECT idem_transition('pt_orders', ARRAY['us', '1'], 'shipped');           -- applied
SELECT idem_transition('pt_orders', ARRAY['us', '1'], 'shipped');           -- already
SELECT idem_transition('pt_orders', ARRAY['us', '1'], 'paid');              -- stale
SELECT idem_transition('pt_orders', ARRAY['us', '1'], 'cancelled');         -- illegal
SELECT idem_transition('pt_orders', ARRAY['us', '9'], 'paid');              -- not_found
SELECT idem_transition('pt_orders', ARRAY['zz', '1'], 'paid');              -- not_found (no partition)
SELECT idem_transition('pt_orders', ARRAY['sa', '2'], 'paid', 0);           -- applied
SELECT idem_transition('pt_orders', ARRAY['sa', '2'], 'paid', 0);           -- already
SELECT idem_transition('pt_orders', ARRAY['sa', '2'], 'shipped', 0);        -- stale
SELECT idem_transition('pt_orders', ARRAY['sa', '2'], 'cancelled', 1);      -- illegal
SELECT idem_transition('pt_orders', ARRAY['sa', '2'], 'shipped', 1);        -- applied
SELECT tableoid::regclass, * FROM pt_orders WHERE (region, id) IN (('us', 1), ('sa', 2)) ORDER BY region;
-- on the partition itself, too
SELECT idem_transition('orders_asia', ARRAY['asia', '3'], 'paid', 0);
SELECT idem_transition('orders_asia', ARRAY['eu', '3'], 'paid', 0);

-- bad keys
SELECT err($$SELECT idem_transition('pt_orders', ARRAY['us'], 'paid')$$);
SELECT err($$SELECT idem_transition('pt_orders', ARRAY['us', '1', 'x'], 'paid')$$);
SELECT err($$SELECT idem_transition('pt_orders', ARRAY[]::text[], 'paid')$$);
SELECT err($$SELECT idem_transition('pt_orders', ARRAY['us', NULL], 'paid')$$);
SELECT err($$SELECT idem_transition('pt_orders', NULL::text[], 'paid')$$);
SELECT err($$SELECT idem_transition('pt_orders', ARRAY[['us', '1']], 'paid')$$);
SELECT err($$SELECT idem_transition('pt_orders', ARRAY['us', 'one'], 'paid')$$);
SELECT err($$SELECT idem_transition('pt_orders', 'us', 'paid')$$);
SELECT err($$SELECT idem_transition(NULL, ARRAY['us', '1'], 'paid')$$);
SELECT err($$SELECT idem_transition('pt_orders', ARRAY['us', '1'], NULL)$$);
-- the pt_single-value form and a one-value array are the same on a one-column key
CREATE TABLE pt_single (id integer PRIMARY KEY, status text NOT NULL) PARTITION BY RANGE (id);
CREATE TABLE single_low PARTITION OF pt_single FOR VALUES FROM (MINVALUE) TO (100);
SELECT idem_guard('pt_single', 'pay', 'status');
INSERT INTO pt_single VALUES (1, 'new'), (2, 'new');
SELECT idem_transition('pt_single', '1', 'paid'), idem_transition('pt_single', ARRAY['2'], 'paid');
SELECT err($$SELECT idem_transition('pt_single', ARRAY['1', '2'], 'paid')$$);

-- a partition of a guarded table: guarding it with the same definition does
-- nothing (it is guarded already); with another, or unguarding it, is refused
SELECT idem_guard('orders_eu', 'pay', 'status', 'version');
SELECT err($$SELECT idem_guard('orders_eu', 'pay', 'status')$$);
SELECT err($$SELECT idem_unguard('orders_eu')$$);
-- a partitioned table one of whose partitions has a guard of its own
CREATE TABLE pt_mixed (id integer PRIMARY KEY, status text NOT NULL) PARTITION BY LIST (id);
CREATE TABLE mixed_1 PARTITION OF pt_mixed FOR VALUES IN (1);
SELECT idem_guard('mixed_1', 'pay', 'status');
SELECT err($$SELECT idem_guard('pt_mixed', 'pay', 'status')$$);
-- and a guarded table attached to a guarded partitioned table
SELECT idem_unguard('mixed_1');
SELECT idem_guard('pt_mixed', 'pay', 'status');
CREATE TABLE mixed_2 (id integer PRIMARY KEY, status text NOT NULL);
SELECT idem_guard('mixed_2', 'pay', 'status');
SELECT err($$ALTER TABLE pt_mixed ATTACH PARTITION mixed_2 FOR VALUES IN (2)$$);

-- range partitioning, by date, with the version column
CREATE TABLE pt_payments (
    day     date NOT NULL,
    id      bigint NOT NULL,
    status  text NOT NULL,
    version integer NOT NULL DEFAULT 0,
    PRIMARY KEY (id, day)
) PARTITION BY RANGE (day);
CREATE TABLE payments_jan PARTITION OF pt_payments FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
CREATE TABLE payments_feb PARTITION OF pt_payments FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');
SELECT idem_guard('pt_payments', 'pay', 'status', 'version');
INSERT INTO pt_payments VALUES ('2026-01-10', 1, 'new'), ('2026-02-10', 2, 'new');
-- the key's values in the key's order: id, then day
SELECT idem_transition('pt_payments', ARRAY['1', '2026-01-10'], 'paid', 0);
SELECT err($$SELECT idem_transition('pt_payments', ARRAY['2026-02-10', '2'], 'paid', 0)$$);
SELECT idem_transition('pt_payments', ARRAY['2', '2026-02-10'], 'paid', 0);
-- a row moved to another month by an UPDATE is checked as any
SELECT err($$UPDATE pt_payments SET day = '2026-02-11', status = 'new' WHERE id = 1$$);
UPDATE pt_payments SET day = '2026-02-11', status = 'shipped' WHERE id = 1;
SELECT tableoid::regclass, * FROM pt_payments ORDER BY id;

-- a partition detached loses the guard (the clone goes with the parent's):
-- it is a table of its own again
ALTER TABLE pt_payments DETACH PARTITION payments_jan;
SELECT * FROM guards('pt_payments', 'payments_jan');
INSERT INTO payments_jan VALUES ('2026-01-20', 3, 'new');
UPDATE payments_jan SET status = 'shipped' WHERE id = 3;
SELECT * FROM payments_jan;
-- and one attached again gets it back
DELETE FROM payments_jan;
ALTER TABLE pt_payments ATTACH PARTITION payments_jan FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
SELECT * FROM guards('pt_payments');
INSERT INTO pt_payments VALUES ('2026-01-21', 4, 'new');
SELECT err($$UPDATE pt_payments SET status = 'shipped' WHERE id = 4$$);

-- the same requests on a plain table with a composite key (the direct path),
-- on one whose statement trigger sends them through SPI, through the parent
-- of a partitioned one (the direct path, in the partition that holds the
-- row), and through the parent of one whose statement trigger sends them
-- through SPI: the same outcomes, the same rows
CREATE TABLE cmp_direct (region text, id integer, status text NOT NULL,
                         version bigint NOT NULL DEFAULT 0, PRIMARY KEY (region, id));
CREATE TABLE cmp_spi (LIKE cmp_direct INCLUDING ALL);
CREATE FUNCTION nothing() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END; $$;
CREATE TRIGGER stmt AFTER UPDATE ON cmp_spi FOR EACH STATEMENT EXECUTE FUNCTION nothing();
CREATE TABLE cmp_part (LIKE cmp_direct INCLUDING ALL) PARTITION BY LIST (region);
CREATE TABLE cmp_part_a PARTITION OF cmp_part FOR VALUES IN ('a');
CREATE TABLE cmp_part_b PARTITION OF cmp_part FOR VALUES IN ('b');
CREATE TABLE cmp_part_spi (LIKE cmp_direct INCLUDING ALL) PARTITION BY LIST (region);
CREATE TABLE cmp_part_spi_a PARTITION OF cmp_part_spi FOR VALUES IN ('a');
CREATE TABLE cmp_part_spi_b PARTITION OF cmp_part_spi FOR VALUES IN ('b');
CREATE TRIGGER stmt AFTER UPDATE ON cmp_part_spi FOR EACH STATEMENT EXECUTE FUNCTION nothing();
SELECT idem_guard(t, 'pay', 'status', 'version')
  FROM unnest(ARRAY['cmp_direct', 'cmp_spi', 'cmp_part', 'cmp_part_spi']::regclass[]) t;
INSERT INTO cmp_direct SELECT r, i, 'new' FROM unnest(ARRAY['a', 'b']) r, generate_series(1, 3) i;
INSERT INTO cmp_spi SELECT * FROM cmp_direct;
INSERT INTO cmp_part SELECT * FROM cmp_direct;
INSERT INTO cmp_part_spi SELECT * FROM cmp_direct;
SET client_min_messages = debug1;
SELECT idem_transition('cmp_direct', ARRAY['a', '1'], 'paid');
SELECT idem_transition('cmp_spi', ARRAY['a', '1'], 'paid');
SELECT idem_transition('cmp_part', ARRAY['a', '1'], 'paid');
SELECT idem_transition('cmp_part_spi', ARRAY['a', '1'], 'paid');
SELECT idem_transition('cmp_part', ARRAY['c', '1'], 'paid');
RESET client_min_messages;
CREATE TABLE requests (n serial, region text, id text, to_state text, expected bigint);
INSERT INTO requests (region, id, to_state, expected) VALUES
    ('a', '1', 'shipped', NULL), ('a', '1', 'shipped', NULL), ('a', '1', 'paid', NULL),
    ('a', '2', 'paid', 0), ('a', '2', 'paid', 0), ('a', '2', 'shipped', 0),
    ('a', '2', 'cancelled', 1), ('a', '2', 'shipped', 1), ('a', '2', 'shipped', 1),
    ('b', '1', 'cancelled', NULL), ('b', '1', 'paid', NULL), ('b', '9', 'paid', NULL),
    ('c', '1', 'paid', NULL), ('b', '2', 'new', 0), ('b', '2', 'new', NULL),
    ('b', '3', 'paid', 5), ('b', '3', 'paid', -1);
CREATE TABLE answers AS
SELECT t, r.n, idem_transition(t, ARRAY[r.region, r.id], r.to_state, r.expected)::text AS outcome
  FROM unnest(ARRAY['cmp_direct', 'cmp_spi', 'cmp_part', 'cmp_part_spi']) t, requests r
 ORDER BY t, r.n;
SELECT n, outcome FROM answers WHERE t = 'cmp_direct' ORDER BY n;
-- no answer differs
SELECT a.n, a.t, a.outcome, b.outcome
  FROM answers a JOIN answers b ON a.n = b.n AND b.t = 'cmp_direct'
 WHERE a.outcome IS DISTINCT FROM b.outcome;
-- no row differs
(SELECT * FROM cmp_spi EXCEPT SELECT * FROM cmp_direct)
UNION ALL (SELECT * FROM cmp_part EXCEPT SELECT * FROM cmp_direct)
UNION ALL (SELECT * FROM cmp_part_spi EXCEPT SELECT * FROM cmp_direct)
UNION ALL (SELECT * FROM cmp_direct EXCEPT SELECT * FROM cmp_part)
UNION ALL (SELECT * FROM cmp_direct EXCEPT SELECT * FROM cmp_part_spi);
SELECT * FROM cmp_direct ORDER BY region, id;

-- unguarding the partitioned table unguards every partition
SELECT idem_unguard('pt_orders');
SELECT * FROM guards('pt_orders');
UPDATE pt_orders SET status = 'new' WHERE region = 'us' AND id = 1;
SELECT idem_unguard('pt_orders');
SELECT err($$SELECT idem_transition('pt_orders', ARRAY['us', '1'], 'paid')$$);

-- A move that did not happen leaves nothing a later INSERT can pass for:
-- one that failed in a subtransaction rolled back...
SELECT idem_allow('pm', 'new', 'paid'), idem_allow_initial('pm', 'new');
CREATE TABLE pm (id int, region text, state text NOT NULL, v int NOT NULL DEFAULT 0,
    PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE pm_eu PARTITION OF pm FOR VALUES IN ('eu');
CREATE TABLE pm_us PARTITION OF pm FOR VALUES IN ('us');
SELECT idem_guard('pm', 'pm', 'state', 'v');
INSERT INTO pm VALUES (1, 'eu', 'new');
BEGIN;
SAVEPOINT s;
UPDATE pm_eu SET region = 'us', state = 'paid' WHERE id = 1;   -- not through the root: fails
ROLLBACK TO SAVEPOINT s;
SELECT err($$INSERT INTO pm VALUES (1, 'us', 'paid', 1)$$);
COMMIT;
-- ...and one that a BEFORE DELETE trigger of the partition skipped
CREATE FUNCTION nothing_deleted() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$;
CREATE TRIGGER keep BEFORE DELETE ON pm_eu FOR EACH ROW EXECUTE FUNCTION nothing_deleted();
BEGIN;
UPDATE pm SET region = 'us', state = 'paid' WHERE id = 1;      -- UPDATE 0: the move is skipped
SELECT err($$INSERT INTO pm VALUES (1, 'us', 'paid', 1)$$);
ROLLBACK;
DROP TRIGGER keep ON pm_eu;
-- a move that happens is still a move
UPDATE pm SET region = 'us', state = 'paid' WHERE id = 1;
SELECT * FROM pm ORDER BY id;

-- a stored generated column that depends on a changed column does not hide
-- the move (PostgreSQL computes it again after the guard)
SELECT idem_allow('pg', 'new', 'paid'), idem_allow_initial('pg', 'new');
CREATE TABLE pgen (id int, region text, state text NOT NULL, v int NOT NULL DEFAULT 0,
    label text GENERATED ALWAYS AS (region || ':' || state) STORED,
    PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE pgen_eu PARTITION OF pgen FOR VALUES IN ('eu');
CREATE TABLE pgen_us PARTITION OF pgen FOR VALUES IN ('us');
SELECT idem_guard('pgen', 'pg', 'state', 'v');
INSERT INTO pgen (id, region, state) VALUES (1, 'eu', 'new'), (2, 'eu', 'new');
UPDATE pgen SET state = 'paid' WHERE id = 1;
UPDATE pgen SET region = 'us' WHERE id = 1;
-- and a transition that moves the row, the state in the partition key
CREATE TABLE pgs (id int, state text NOT NULL, v int NOT NULL DEFAULT 0,
    label text GENERATED ALWAYS AS ('#' || state) STORED,
    PRIMARY KEY (id, state)) PARTITION BY LIST (state);
CREATE TABLE pgs_new PARTITION OF pgs FOR VALUES IN ('new');
CREATE TABLE pgs_paid PARTITION OF pgs FOR VALUES IN ('paid');
SELECT idem_guard('pgs', 'pg', 'state', 'v');
INSERT INTO pgs (id, state) VALUES (1, 'new');
SELECT idem_transition('pgs', ARRAY['1', 'new'], 'paid');
SELECT tableoid::regclass, * FROM pgen ORDER BY id;
SELECT tableoid::regclass, * FROM pgs ORDER BY id;
DROP TABLE pm, pgen, pgs;
DROP FUNCTION nothing_deleted();

-- Inheritance children are not partitions: a guard on an inheritance parent
-- guards the parent's own rows.  An UPDATE of the parent reaches a child's
-- rows unguarded, and idem_transition on the parent does what UPDATE ONLY
-- would: not_found for a child's key, on either path.  A child guarded on
-- its own is checked by its own guard, also through its parent, and keeps
-- it when the parent is unguarded.
CREATE TABLE inh_orders (id integer PRIMARY KEY, status text NOT NULL,
                         version bigint NOT NULL DEFAULT 0);
CREATE TABLE inh_orders_old (PRIMARY KEY (id)) INHERITS (inh_orders);
SELECT idem_guard('inh_orders', 'pay', 'status', 'version');
SELECT * FROM guards('inh_orders');
INSERT INTO inh_orders VALUES (1, 'new'), (4, 'new');
INSERT INTO inh_orders_old VALUES (2, 'new'), (3, 'new');
SELECT err($$UPDATE inh_orders SET status = 'shipped' WHERE id = 1$$);
UPDATE inh_orders SET status = 'shipped' WHERE id = 2;   -- the child's row: unguarded
SET client_min_messages = debug1;
SELECT idem_transition('inh_orders', '3', 'paid');
SELECT idem_transition('inh_orders', '1', 'paid', 0);
RESET client_min_messages;
-- the SPI path (a statement-level trigger on the parent)
CREATE TRIGGER stmt AFTER UPDATE ON inh_orders FOR EACH STATEMENT EXECUTE FUNCTION nothing();
SET client_min_messages = debug1;
SELECT idem_transition('inh_orders', '3', 'paid');
SELECT idem_transition('inh_orders', '4', 'paid', 0);
RESET client_min_messages;
SELECT tableoid::regclass, * FROM inh_orders ORDER BY id;
-- the child guarded on its own
SELECT idem_guard('inh_orders_old', 'pay', 'status', 'version');
SELECT * FROM guards('inh_orders');
SELECT err($$UPDATE inh_orders SET status = 'shipped' WHERE id = 3$$);
UPDATE inh_orders SET status = 'paid' WHERE id = 3;
SELECT idem_transition('inh_orders', '3', 'shipped', 1);
SELECT idem_transition('inh_orders_old', '3', 'shipped', 1);
SELECT idem_unguard('inh_orders');
SELECT * FROM guards('inh_orders');
SELECT err($$UPDATE inh_orders SET status = 'new' WHERE id = 3$$);
SELECT tableoid::regclass, * FROM inh_orders ORDER BY id;
DROP TABLE inh_orders CASCADE;

DROP TABLE pt_orders, pt_single, pt_mixed, mixed_2, pt_payments, cmp_direct, cmp_spi, cmp_part,
    cmp_part_spi, requests, answers;
DROP FUNCTION nothing();
DROP FUNCTION guards(regclass[]);
DROP FUNCTION err(text);
DELETE FROM idem.transitions;
