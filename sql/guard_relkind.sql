-- idem_transition takes a relation from its caller: anything but an ordinary
-- or partitioned table is refused with 42809, as an UPDATE of it would be,
-- before any access method is used on it (a partitioned table, which has
-- none, is read through the partition that holds the row).  The guard trigger can be put on a table by
-- hand, without idem_guard, by any role that owns one: a temporary
-- partitioned table with the guard on it once crashed the server.
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

SELECT idem_allow('rk', 'new', 'paid');

-- a role with no grant at all, on a temporary table of its own
CREATE ROLE regress_idem_relkind;
SET ROLE regress_idem_relkind;
CREATE TEMP TABLE tpt (id int PRIMARY KEY, status text NOT NULL) PARTITION BY LIST (id);
CREATE TEMP TABLE tpt1 PARTITION OF tpt FOR VALUES IN (1);
INSERT INTO tpt VALUES (1, 'new');
CREATE TRIGGER idem_guard BEFORE UPDATE ON tpt FOR EACH ROW
  EXECUTE FUNCTION idem_guard_trigger('rk', 'status');
SELECT idem_transition('tpt', '1', 'paid');
-- the server is still there
SELECT 1 AS still_here;
-- the partition got the trigger, and its rows move
SELECT idem_transition('tpt1', '1', 'paid');
SELECT * FROM tpt;
DROP TABLE tpt;
RESET ROLE;
DROP ROLE regress_idem_relkind;

-- the same as the owner, with each kind of relation that can carry a trigger
-- or be named
CREATE TABLE pt (id int PRIMARY KEY, status text NOT NULL) PARTITION BY LIST (id);
CREATE TABLE pt1 PARTITION OF pt FOR VALUES IN (1, 2);
INSERT INTO pt VALUES (1, 'new'), (2, 'new');
CREATE TRIGGER idem_guard BEFORE UPDATE ON pt FOR EACH ROW
  EXECUTE FUNCTION idem_guard_trigger('rk', 'status');
SELECT err($$SELECT idem_transition('pt', '1', 'paid')$$);
SELECT err($$SELECT idem_transition('pt', '1', 'paid', 0)$$);
SELECT idem_transition('pt1', '1', 'paid');
-- an UPDATE through the parent is guarded on the partition
SELECT err($$UPDATE pt SET status = 'shipped' WHERE id = 2$$);
UPDATE pt SET status = 'paid' WHERE id = 2;
SELECT * FROM pt ORDER BY id;

CREATE TABLE base (id int PRIMARY KEY, status text NOT NULL);
INSERT INTO base VALUES (1, 'new');
CREATE VIEW v AS SELECT * FROM base;
SELECT err($$SELECT idem_transition('v', '1', 'paid')$$);
CREATE MATERIALIZED VIEW mv AS SELECT * FROM base;
SELECT err($$SELECT idem_transition('mv', '1', 'paid')$$);
CREATE SEQUENCE sq;
SELECT err($$SELECT idem_transition('sq', '1', 'paid')$$);
CREATE INDEX base_status ON base (status);
SELECT err($$SELECT idem_transition('base_status', '1', 'paid')$$);
-- a role without privileges is told what the relation is before it is told
-- it may not update it, as by UPDATE
CREATE ROLE regress_idem_relkind2;
SET ROLE regress_idem_relkind2;
SELECT err($$SELECT idem_transition('base_status', '1', 'paid')$$);
SELECT err($$SELECT idem_transition('sq', '1', 'paid')$$);
SELECT err($$UPDATE base_status SET status = 'paid'$$);
SELECT err($$SELECT idem_transition('base', '1', 'paid')$$);
RESET ROLE;
DROP ROLE regress_idem_relkind2;
CREATE TYPE comp AS (id int, status text);
SELECT err($$SELECT idem_transition('comp', '1', 'paid')$$);
CREATE FOREIGN DATA WRAPPER regress_idem_fdw;
CREATE SERVER regress_idem_server FOREIGN DATA WRAPPER regress_idem_fdw;
CREATE FOREIGN TABLE ft (id int NOT NULL, status text NOT NULL) SERVER regress_idem_server;
CREATE TRIGGER idem_guard BEFORE UPDATE ON ft FOR EACH ROW
  EXECUTE FUNCTION idem_guard_trigger('rk', 'status');
SELECT err($$SELECT idem_transition('ft', '1', 'paid')$$);
SELECT 1 AS still_here;

-- a partition is an ordinary table: a move that would take the row out of
-- it breaks its partition constraint, on the direct path (where the guard
-- alone applies the move without a lock first) as through SPI, as an UPDATE
-- of the partition does
CREATE TABLE st_direct (id int NOT NULL, status text NOT NULL)
    PARTITION BY LIST (status);
CREATE TABLE st_direct_new PARTITION OF st_direct FOR VALUES IN ('new');
ALTER TABLE st_direct_new ADD PRIMARY KEY (id);
CREATE TABLE st_spi (LIKE st_direct) PARTITION BY LIST (status);
CREATE TABLE st_spi_new PARTITION OF st_spi FOR VALUES IN ('new');
ALTER TABLE st_spi_new ADD PRIMARY KEY (id);
CREATE FUNCTION nothing() RETURNS trigger LANGUAGE plpgsql AS
    $$ BEGIN RETURN NULL; END; $$;
CREATE TRIGGER after_statement AFTER UPDATE ON st_spi_new
    FOR EACH STATEMENT EXECUTE FUNCTION nothing();
INSERT INTO st_direct VALUES (1, 'new');
INSERT INTO st_spi VALUES (1, 'new');
SELECT idem_guard('st_direct_new', 'rk', 'status'), idem_guard('st_spi_new', 'rk', 'status');
SET client_min_messages = debug1;
SELECT err($$SELECT idem_transition('st_direct_new', '1', 'paid')$$);
SELECT err($$SELECT idem_transition('st_spi_new', '1', 'paid')$$);
RESET client_min_messages;
SELECT err($$UPDATE ONLY st_direct_new SET status = 'paid' WHERE id = 1$$);
SELECT * FROM st_direct_new UNION ALL SELECT * FROM st_spi_new;
DROP TABLE st_direct, st_spi;
DROP FUNCTION nothing();

DROP FOREIGN TABLE ft;
DROP SERVER regress_idem_server;
DROP FOREIGN DATA WRAPPER regress_idem_fdw;
DROP TYPE comp;
DROP SEQUENCE sq;
DROP MATERIALIZED VIEW mv;
DROP VIEW v;
DROP TABLE base, pt;
DROP FUNCTION err(text);
DELETE FROM idem.transitions;
