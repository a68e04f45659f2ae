-- A guard names its columns in its trigger's arguments, which pg_dump
-- keeps with the table.  DDL that would leave a guard that cannot work is
-- refused with 2BP01 by the extension's event trigger: renaming or dropping
-- the state or version column, changing the version column's type,
-- dropping its NOT NULL, putting it in a key.  Everything else works as
-- without the guard, and so does dropping the table.  The version column
-- is never part of a key (55000): the guard writes it on every UPDATE.
\set VERBOSITY terse

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

SELECT idem_allow('go', 'new', 'paid');
CREATE TABLE go (id integer PRIMARY KEY, st text NOT NULL,
                 v integer NOT NULL DEFAULT 0, note text, extra integer,
                 code integer NOT NULL DEFAULT 0);
INSERT INTO go VALUES (1, 'new');
SELECT idem_guard('go', 'go', 'st', 'v');

-- the guarded columns stay as they are
SELECT err($$ALTER TABLE go RENAME COLUMN st TO state$$);
SELECT err($$ALTER TABLE go RENAME COLUMN v TO ver$$);
SELECT err($$ALTER TABLE go DROP COLUMN st$$);
SELECT err($$ALTER TABLE go DROP COLUMN v$$);
SELECT err($$ALTER TABLE go DROP COLUMN v, DROP COLUMN st$$);
SELECT err($$ALTER TABLE go ALTER COLUMN v TYPE numeric$$);
SELECT err($$ALTER TABLE go ALTER COLUMN v DROP NOT NULL$$);
-- the version column does not join a key
SELECT err($$ALTER TABLE go ADD UNIQUE (v)$$);
SELECT err($$ALTER TABLE go ADD UNIQUE (code, v)$$);
SELECT err($$ALTER TABLE go DROP CONSTRAINT go_pkey, ADD PRIMARY KEY (id, v)$$);
SELECT err($$CREATE UNIQUE INDEX ON go (v)$$);
SELECT err($$CREATE UNIQUE INDEX ON go ((v + 1))$$);
SELECT err($$CREATE UNIQUE INDEX ON go (code) WHERE v > 0$$);
CREATE TABLE go_parent (id integer, v integer, PRIMARY KEY (id, v));
INSERT INTO go_parent VALUES (1, 0);
SELECT err($$ALTER TABLE go ADD FOREIGN KEY (id, v) REFERENCES go_parent$$);
-- the guard is as it was, and still works
SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'go'::regclass;
SELECT err($$UPDATE go SET st = 'shipped'$$);
-- a NOT NULL dropped where the event trigger does not fire (here with
-- session_replication_role = replica) fails the guard where it fires
BEGIN;
SET LOCAL session_replication_role = replica;
ALTER TABLE go ALTER COLUMN v DROP NOT NULL;
SET LOCAL session_replication_role = origin;
SELECT err($$UPDATE go SET note = 'x'$$);
SELECT err($$SELECT idem_transition('go', '1', 'paid')$$);
ROLLBACK;
SELECT idem_transition('go', '1', 'paid', 0);

-- other changes of the table work as without the guard
ALTER TABLE go RENAME COLUMN note TO remark;
ALTER TABLE go DROP COLUMN extra;
ALTER TABLE go ALTER COLUMN remark TYPE varchar(20);
ALTER TABLE go ALTER COLUMN st TYPE varchar(20);
ALTER TABLE go ADD COLUMN added integer;
ALTER TABLE go ADD UNIQUE (code);
CREATE INDEX ON go (v);
CREATE UNIQUE INDEX ON go (code, added);
ALTER TABLE go RENAME TO go2;
ALTER TABLE go2 RENAME TO go;
UPDATE go SET remark = 'x' RETURNING id, st, v, remark;

-- changing a guarded column: unguard, change, guard again, in one
-- transaction
BEGIN;
SELECT idem_unguard('go');
ALTER TABLE go RENAME COLUMN st TO state;
ALTER TABLE go ALTER COLUMN v TYPE bigint;
SELECT idem_guard('go', 'go', 'state', 'v');
COMMIT;
SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'go'::regclass;
SELECT err($$UPDATE go SET state = 'new'$$);

-- idem_guard refuses a version column in a key, whichever
CREATE TABLE keyed (id integer PRIMARY KEY, st text NOT NULL,
                    u integer NOT NULL UNIQUE, x integer NOT NULL,
                    e integer NOT NULL, p integer NOT NULL,
                    f integer NOT NULL REFERENCES keyed (u), free integer NOT NULL);
CREATE UNIQUE INDEX ON keyed ((e * 2));
CREATE UNIQUE INDEX ON keyed (x) WHERE p > 0;
SELECT err($$SELECT idem_guard('keyed', 'go', 'st', 'id')$$);
SELECT err($$SELECT idem_guard('keyed', 'go', 'st', 'u')$$);
SELECT err($$SELECT idem_guard('keyed', 'go', 'st', 'e')$$);
SELECT err($$SELECT idem_guard('keyed', 'go', 'st', 'p')$$);
SELECT err($$SELECT idem_guard('keyed', 'go', 'st', 'f')$$);
SELECT idem_guard('keyed', 'go', 'st', 'free');

-- partitions and inheritance children, changed with their parent, are
-- checked too
CREATE TABLE parted (id integer, st text NOT NULL, v integer NOT NULL,
                     note text, PRIMARY KEY (id)) PARTITION BY RANGE (id);
CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100);
SELECT idem_guard('parted_1', 'go', 'st', 'v');
SELECT err($$ALTER TABLE parted RENAME COLUMN st TO state$$);
SELECT err($$ALTER TABLE parted DROP COLUMN v$$);
ALTER TABLE parted RENAME COLUMN note TO remark;
CREATE TABLE inh_parent (id integer PRIMARY KEY, st text NOT NULL,
                         v integer NOT NULL);
CREATE TABLE inh_child (PRIMARY KEY (id)) INHERITS (inh_parent);
SELECT idem_guard('inh_child', 'go', 'st', 'v');
SELECT err($$ALTER TABLE inh_parent RENAME COLUMN v TO version$$);

-- dropping a guarded table, or its schema, works
DROP TABLE go;
DROP TABLE keyed, parted, inh_parent CASCADE;
CREATE SCHEMA guarded;
CREATE TABLE guarded.t (id integer PRIMARY KEY, st text NOT NULL);
SELECT idem_guard('guarded.t', 'go', 'st');
DROP SCHEMA guarded CASCADE;
DROP TABLE go_parent;

-- a new partition with a key on the version column is refused, as the same
-- key added with ALTER TABLE is
CREATE TABLE pk4 (id int PRIMARY KEY, st text NOT NULL, v int NOT NULL DEFAULT 0)
    PARTITION BY RANGE (id);
SELECT idem_guard('pk4', 'go', 'st', 'v');
SELECT err($$CREATE TABLE pk4_2 PARTITION OF pk4 (UNIQUE (v)) FOR VALUES FROM (100) TO (200)$$);
SELECT err($$CREATE TABLE pk4_3 PARTITION OF pk4 FOR VALUES FROM (200) TO (300)$$);
SELECT relname FROM pg_class WHERE relname LIKE 'pk4%' AND relkind IN ('r', 'p') ORDER BY 1;
DROP TABLE pk4;

-- idem_transition refuses a table whose UPDATE a DO INSTEAD rule rewrites
CREATE TABLE ru (id int PRIMARY KEY, st text NOT NULL, v int NOT NULL DEFAULT 0);
SELECT idem_guard('ru', 'go', 'st', 'v');
INSERT INTO ru VALUES (1, 'new'), (2, 'new');
CREATE RULE ru_nothing AS ON UPDATE TO ru DO INSTEAD NOTHING;
SELECT err($$SELECT idem_transition('ru', '1', 'paid')$$);
DROP RULE ru_nothing ON ru;
CREATE RULE ru_some AS ON UPDATE TO ru WHERE old.id > 10 DO INSTEAD NOTHING;
SELECT err($$SELECT idem_transition('ru', '1', 'paid')$$);
-- a disabled rule, or one that does also, does not stand in the way
ALTER TABLE ru DISABLE RULE ru_some;
SELECT idem_transition('ru', '1', 'paid');
CREATE TABLE ru_log (id int);
CREATE RULE ru_also AS ON UPDATE TO ru DO ALSO INSERT INTO ru_log VALUES (new.id);
SELECT idem_transition('ru', '2', 'paid');
SELECT * FROM ru;
SELECT * FROM ru_log;
DROP TABLE ru, ru_log;

-- a drop that takes a guarded column with it (the column's type, domain or
-- collation dropped with CASCADE) is refused as well; other columns go
CREATE TYPE dt_state AS ENUM ('new', 'paid');
CREATE DOMAIN dt_dom AS text CHECK (VALUE <> '');
CREATE TYPE dt_note AS ENUM ('a', 'b');
CREATE COLLATION dt_coll (provider = libc, locale = 'C');
CREATE TABLE dt (id integer PRIMARY KEY, st dt_state NOT NULL, v integer NOT NULL DEFAULT 0,
                 note dt_note);
CREATE TABLE dd (id integer PRIMARY KEY, st dt_dom NOT NULL);
CREATE TABLE dc (id integer PRIMARY KEY, st text COLLATE dt_coll NOT NULL);
INSERT INTO dt VALUES (1, 'new');
INSERT INTO dd VALUES (1, 'new');
INSERT INTO dc VALUES (1, 'new');
SELECT idem_allow('dt', 'new', 'paid');
SELECT idem_guard('dt', 'dt', 'st', 'v');
SELECT idem_guard('dd', 'dt', 'st');
SELECT idem_guard('dc', 'dt', 'st');
SELECT err($$DROP TYPE dt_state CASCADE$$);
SELECT err($$DROP DOMAIN dt_dom CASCADE$$);
SELECT err($$DROP COLLATION dt_coll CASCADE$$);
SELECT err($$DROP TYPE dt_note CASCADE$$);
-- the hint of such a drop is not that of ALTER TABLE ... DROP COLUMN
CREATE FUNCTION hint(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    h text;
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN dependent_objects_still_exist THEN
    GET STACKED DIAGNOSTICS h = PG_EXCEPTION_HINT;
    RETURN h;
END;
$$;
SELECT hint($$DROP TYPE dt_state CASCADE$$);
SELECT hint($$ALTER TABLE dt DROP COLUMN st$$);
DROP FUNCTION hint(text);
SELECT idem_transition('dt', '1', 'paid');
SELECT idem_transition('dd', '1', 'paid');
SELECT idem_transition('dc', '1', 'paid');
SELECT * FROM dt;
-- and with the guard gone first, the drop goes through
SELECT idem_unguard('dt');
DROP TYPE dt_state CASCADE;
SELECT * FROM dt;
DROP TABLE dt, dd, dc;
DROP DOMAIN dt_dom;
DROP COLLATION dt_coll;

-- a table of a composite type (CREATE TABLE ... OF): ALTER TYPE ... CASCADE
-- renames or retypes its columns as ALTER TABLE would
SELECT idem_allow('gt', 'new', 'paid');
CREATE TYPE gt_row AS (id integer, st text, v bigint);
CREATE TABLE gt OF gt_row (PRIMARY KEY (id), st WITH OPTIONS NOT NULL, v WITH OPTIONS NOT NULL DEFAULT 0);
SELECT idem_guard('gt', 'gt', 'st', 'v');
INSERT INTO gt VALUES (1, 'new');
SELECT err('ALTER TYPE gt_row RENAME ATTRIBUTE st TO state CASCADE') AS rename_state;
SELECT err('ALTER TYPE gt_row ALTER ATTRIBUTE v TYPE numeric CASCADE') AS retype_version;
SELECT err('ALTER TYPE gt_row RENAME ATTRIBUTE v TO version CASCADE') AS rename_version;
-- an attribute the guard does not name, and a type of no guarded table
ALTER TYPE gt_row ADD ATTRIBUTE note text CASCADE;
CREATE TYPE gt_other AS (a integer);
ALTER TYPE gt_other RENAME ATTRIBUTE a TO b;
SELECT idem_transition('gt', '1', 'paid');
SELECT id, st, v, note FROM gt;
DROP TABLE gt;
DROP TYPE gt_row, gt_other;

-- the event trigger belongs to the extension
SELECT e.evtname, e.evtevent, e.evttags, e.evtfoid::regprocedure,
       d.deptype
  FROM pg_event_trigger e
  JOIN pg_depend d ON d.classid = 'pg_event_trigger'::regclass AND d.objid = e.oid
 WHERE d.refclassid = 'pg_extension'::regclass
 ORDER BY e.evtname;

-- DROP EXTENSION fails while a table is guarded: its trigger depends on
-- idem_guard_trigger (in a transaction rolled back, should it not fail)
SELECT idem_allow('gx', 'new', 'paid');
CREATE TABLE gx (id integer PRIMARY KEY, st text NOT NULL);
SELECT idem_guard('gx', 'gx', 'st');
BEGIN;
SELECT left(err('DROP EXTENSION idem'), 80) AS drop_extension;
ROLLBACK;
SELECT idem_unguard('gx');
DROP TABLE gx;

DELETE FROM idem.transitions;
DROP FUNCTION err(text);
