-- A move the guard refuses (already, stale, illegal) writes nothing: not the
-- row, and not what the table's DO ALSO rules and the triggers that fire
-- before the guard would write.  The UPDATE idem_transition stands for
-- fails on such a move, and leaves nothing of them; they used to run, and
-- an audit table recorded moves that never happened.
SELECT idem_allow('rw', 'new', 'paid'), idem_allow('rw', 'paid', 'shipped'),
       idem_allow('rw', 'new', 'cancelled');

-- a DO ALSO rule: the UPDATE runs through SPI
CREATE TABLE rw_rule (id int PRIMARY KEY, status text NOT NULL, version int NOT NULL DEFAULT 0);
SELECT idem_guard('rw_rule', 'rw', 'status', 'version');
CREATE TABLE rw_rule_audit (id int, old_status text, new_status text);
CREATE RULE rw_rule_audit AS ON UPDATE TO rw_rule
    DO ALSO INSERT INTO rw_rule_audit VALUES (OLD.id, OLD.status, NEW.status);
INSERT INTO rw_rule VALUES (1, 'new'), (2, 'new');
SELECT idem_transition('rw_rule', '1', 'paid', 0);     -- applied
SELECT idem_transition('rw_rule', '1', 'paid', 0);     -- already
SELECT idem_transition('rw_rule', '1', 'new');         -- stale
SELECT idem_transition('rw_rule', '1', 'cancelled');   -- illegal
SELECT idem_transition('rw_rule', '2', 'shipped');     -- illegal
SELECT idem_transition('rw_rule', '3', 'paid');        -- not_found
SELECT * FROM rw_rule_audit ORDER BY id;
SELECT * FROM rw_rule ORDER BY id;

-- a BEFORE UPDATE trigger sorted before the guard: the direct path
CREATE TABLE rw_trig (id int PRIMARY KEY, status text NOT NULL, version int NOT NULL DEFAULT 0);
SELECT idem_guard('rw_trig', 'rw', 'status', 'version');
CREATE TABLE rw_trig_audit (id int, old_status text, new_status text);
CREATE FUNCTION rw_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rw_trig_audit VALUES (OLD.id, OLD.status, NEW.status);
    RETURN NEW;
END $$;
CREATE TRIGGER a_log BEFORE UPDATE ON rw_trig FOR EACH ROW EXECUTE FUNCTION rw_log();
INSERT INTO rw_trig VALUES (1, 'new'), (2, 'new');
SET client_min_messages = debug1;
SELECT idem_transition('rw_trig', '1', 'paid', 0);     -- applied
RESET client_min_messages;
SELECT idem_transition('rw_trig', '1', 'paid', 0);     -- already
SELECT idem_transition('rw_trig', '1', 'new');         -- stale
SELECT idem_transition('rw_trig', '1', 'cancelled');   -- illegal
SELECT idem_transition('rw_trig', '2', 'shipped');     -- illegal
SELECT * FROM rw_trig_audit ORDER BY id;
SELECT * FROM rw_trig ORDER BY id;

-- a partitioned table whose partitions have a BEFORE UPDATE trigger sorted
-- before the guard: through SPI, on the partitioned table
CREATE TABLE rw_part (id int, region int, status text NOT NULL, version int NOT NULL DEFAULT 0,
                      PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE rw_part_1 PARTITION OF rw_part FOR VALUES IN (1);
CREATE TABLE rw_part_2 PARTITION OF rw_part FOR VALUES IN (2);
SELECT idem_guard('rw_part', 'rw', 'status', 'version');
CREATE TRIGGER a_log BEFORE UPDATE ON rw_part FOR EACH ROW EXECUTE FUNCTION rw_log();
INSERT INTO rw_part VALUES (1, 1, 'new'), (2, 2, 'new');
SET client_min_messages = debug1;
SELECT idem_transition('rw_part', ARRAY['1', '1'], 'paid', 0);   -- applied
RESET client_min_messages;
SELECT idem_transition('rw_part', ARRAY['1', '1'], 'paid', 0);   -- already
SELECT idem_transition('rw_part', ARRAY['1', '1'], 'new');       -- stale
SELECT idem_transition('rw_part', ARRAY['2', '2'], 'shipped');   -- illegal
SELECT idem_transition('rw_part', ARRAY['3', '1'], 'paid');      -- not_found
SELECT * FROM rw_trig_audit WHERE id <> 1 OR new_status <> 'paid' OR old_status <> 'new' ORDER BY id;
SELECT count(*) AS moves_logged FROM rw_trig_audit;
SELECT * FROM rw_part ORDER BY id;
DROP TABLE rw_part;

-- the row stays locked after a refused move, as before
BEGIN;
SELECT idem_transition('rw_rule', '2', 'shipped');
SELECT idem_transition('rw_trig', '2', 'shipped');
SELECT (SELECT xmax FROM rw_rule WHERE id = 2) = txid_current()::text::xid AS rule_row_locked,
       (SELECT xmax FROM rw_trig WHERE id = 2) = txid_current()::text::xid AS trig_row_locked;
ROLLBACK;

DROP TABLE rw_rule, rw_rule_audit, rw_trig, rw_trig_audit;
DROP FUNCTION rw_log();
SELECT idem_disallow('rw', 'new', 'paid'), idem_disallow('rw', 'paid', 'shipped'),
       idem_disallow('rw', 'new', 'cancelled');

-- the SPI path judges the row first under the UPDATE's own privileges
-- (UPDATE on the state column, not on any column as the lock alone needs),
-- and locks it as that UPDATE would (FOR UPDATE when the state is in a
-- unique index, as here)
SELECT idem_allow('rw', 'new', 'paid');
CREATE TABLE rw_priv (id int PRIMARY KEY, status text NOT NULL, version int NOT NULL DEFAULT 0,
                      note text, UNIQUE (id, status));
SELECT idem_guard('rw_priv', 'rw', 'status', 'version');
CREATE FUNCTION rw_stmt() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER rw_stmt AFTER UPDATE ON rw_priv FOR EACH STATEMENT EXECUTE FUNCTION rw_stmt();
INSERT INTO rw_priv VALUES (1, 'new'), (2, 'paid');
CREATE ROLE idem_rw_clerk;
GRANT SELECT ON rw_priv TO idem_rw_clerk;
GRANT UPDATE (note) ON rw_priv TO idem_rw_clerk;
SET ROLE idem_rw_clerk;
\set VERBOSITY terse
SELECT idem_transition('rw_priv', '1', 'paid');
SELECT idem_transition('rw_priv', '2', 'paid');
SELECT idem_transition('rw_priv', '2', 'new');
\set VERBOSITY default
RESET ROLE;
CREATE EXTENSION pgrowlocks;
BEGIN;
SELECT idem_transition('rw_priv', '2', 'paid');
SELECT modes FROM pgrowlocks('rw_priv');
ROLLBACK;
DROP EXTENSION pgrowlocks;
DROP TABLE rw_priv;
DROP FUNCTION rw_stmt();
DROP ROLE idem_rw_clerk;
SELECT idem_disallow('rw', 'new', 'paid');
