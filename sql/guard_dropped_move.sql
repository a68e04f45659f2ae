-- state-transition guard: a move of a row to another partition whose
-- INSERT a BEFORE INSERT trigger of the partition (sorted before the guard)
-- drops leaves the guard's note of the move at its trigger depth; the next
-- statement that fires the guard for an UPDATE at that depth forgets it.
-- idem_transition of a move it refuses, which runs no UPDATE, forgets it as
-- that UPDATE would have: the same row inserted next by hand, in a state
-- that is not initial, is refused.  The objects of this file start with "gdm".
\set VERBOSITY terse
SELECT idem_allow('gdm', 'new', 'paid'), idem_allow_initial('gdm', 'new');
CREATE TABLE gdm (region text, id integer, status text NOT NULL,
                  version integer NOT NULL DEFAULT 0, PRIMARY KEY (region, id))
    PARTITION BY LIST (region);
CREATE TABLE gdm_eu PARTITION OF gdm FOR VALUES IN ('eu');
CREATE TABLE gdm_us PARTITION OF gdm FOR VALUES IN ('us');
SELECT idem_guard('gdm', 'gdm', 'status', 'version');
INSERT INTO gdm VALUES ('eu', 1, 'new'), ('eu', 2, 'new');
UPDATE gdm SET status = 'paid' WHERE id = 1;
CREATE FUNCTION gdm_drop() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN CASE WHEN current_setting('gdm.drop', true) = 'on' THEN NULL ELSE NEW END;
END $$;
CREATE TRIGGER a_drop BEFORE INSERT ON gdm_us FOR EACH ROW EXECUTE FUNCTION gdm_drop();

BEGIN;
-- the move of row 1 to 'us': its INSERT is dropped (the row is gone)
SET LOCAL gdm.drop = 'on';
UPDATE gdm SET region = 'us' WHERE id = 1;
SET LOCAL gdm.drop = 'off';
-- a move the machine refuses
SELECT idem_transition('gdm', ARRAY['eu', '2'], 'shipped');
-- the row the move would have inserted, in a state that is not initial,
-- inserted by hand: a new row, refused
INSERT INTO gdm VALUES ('us', 1, 'paid', 2);
ROLLBACK;
SELECT * FROM gdm ORDER BY region, id;

DROP TABLE gdm;
DROP FUNCTION gdm_drop();
SELECT idem_disallow('gdm', 'new', 'paid'), idem_disallow_initial('gdm', 'new');
