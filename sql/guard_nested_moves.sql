-- state-transition guard: a move of a row to another partition while
-- another move is under way one trigger level deeper.  Each move's INSERT
-- must find its own note: a trigger that fires during the outer move and
-- moves a row of another guarded table (before the outer row is deleted, or
-- from the BEFORE DELETE trigger of the partition it leaves) must not make
-- the outer move look like a new row.  The objects of this file start with
-- "gnm".
\set VERBOSITY terse

SELECT idem_allow('gnm', 'new', 'paid'), idem_allow_initial('gnm', 'new');
CREATE TABLE gnm_a (region text, id integer, status text NOT NULL,
                    version integer NOT NULL DEFAULT 0, PRIMARY KEY (region, id))
    PARTITION BY LIST (region);
CREATE TABLE gnm_a_eu PARTITION OF gnm_a FOR VALUES IN ('eu');
CREATE TABLE gnm_a_us PARTITION OF gnm_a FOR VALUES IN ('us');
CREATE TABLE gnm_b (region text, id integer, status text NOT NULL,
                    version integer NOT NULL DEFAULT 0, PRIMARY KEY (region, id))
    PARTITION BY LIST (region);
CREATE TABLE gnm_b_eu PARTITION OF gnm_b FOR VALUES IN ('eu');
CREATE TABLE gnm_b_us PARTITION OF gnm_b FOR VALUES IN ('us');
SELECT idem_guard('gnm_a', 'gnm', 'status', 'version');
SELECT idem_guard('gnm_b', 'gnm', 'status', 'version');
INSERT INTO gnm_a SELECT 'eu', i, 'new' FROM generate_series(1, 4) i;
INSERT INTO gnm_b SELECT 'eu', i, 'new' FROM generate_series(1, 4) i;
UPDATE gnm_a SET status = 'paid';
UPDATE gnm_b SET status = 'paid';

-- a BEFORE UPDATE trigger sorted after the guard moves the row of gnm_b
-- with the same id: both moves succeed
CREATE FUNCTION gnm_cascade() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE gnm_b SET region = NEW.region WHERE id = NEW.id AND region <> NEW.region;
    RETURN NEW;
END $$;
CREATE TRIGGER zz_cascade BEFORE UPDATE ON gnm_a
    FOR EACH ROW EXECUTE FUNCTION gnm_cascade();
UPDATE gnm_a SET region = 'us' WHERE id = 1;
SELECT tableoid::regclass, * FROM gnm_a WHERE id = 1;
SELECT tableoid::regclass, * FROM gnm_b WHERE id = 1;
-- and back, several rows in one statement
UPDATE gnm_a SET region = 'us' WHERE id IN (2, 3);
UPDATE gnm_a SET region = 'eu' WHERE id <= 3;
SELECT tableoid::regclass, * FROM gnm_a ORDER BY id;
SELECT tableoid::regclass, * FROM gnm_b ORDER BY id;
DROP TRIGGER zz_cascade ON gnm_a;

-- the BEFORE DELETE trigger of the partition the row leaves moves another
-- guarded row
CREATE FUNCTION gnm_on_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE gnm_b SET region = 'us' WHERE id = OLD.id AND region <> 'us';
    RETURN OLD;
END $$;
CREATE TRIGGER gnm_on_delete BEFORE DELETE ON gnm_a_eu
    FOR EACH ROW EXECUTE FUNCTION gnm_on_delete();
UPDATE gnm_a SET region = 'us' WHERE id = 4;
SELECT tableoid::regclass, * FROM gnm_a WHERE id = 4;
SELECT tableoid::regclass, * FROM gnm_b WHERE id = 4;
DROP TRIGGER gnm_on_delete ON gnm_a_eu;

-- a nested move that fails, caught in the trigger: the outer move still
-- succeeds, and the failed one leaves no note that lets its row in
CREATE FUNCTION gnm_failing() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    BEGIN
        UPDATE gnm_b SET region = 'us' WHERE id = NEW.id AND region <> 'us';
        RAISE EXCEPTION 'gnm: undone';
    EXCEPTION WHEN raise_exception THEN
        NULL;
    END;
    RETURN NEW;
END $$;
CREATE TRIGGER zz_failing BEFORE UPDATE ON gnm_a
    FOR EACH ROW EXECUTE FUNCTION gnm_failing();
UPDATE gnm_a SET region = 'us' WHERE id = 2;
SELECT tableoid::regclass, * FROM gnm_a WHERE id = 2;
SELECT tableoid::regclass, * FROM gnm_b WHERE id = 2;
DROP TRIGGER zz_failing ON gnm_a;

-- a row inserted in a non-initial state is still refused, also right
-- after a move that failed, at either level
INSERT INTO gnm_b VALUES ('us', 2, 'paid', 1);
BEGIN;
SAVEPOINT s;
CREATE FUNCTION gnm_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'gnm: refused'; END $$;
CREATE TRIGGER gnm_refuse BEFORE DELETE ON gnm_b_eu
    FOR EACH ROW EXECUTE FUNCTION gnm_refuse();
UPDATE gnm_b SET region = 'us' WHERE id = 2;
ROLLBACK TO s;
INSERT INTO gnm_b VALUES ('us', 2, 'paid', 1);
ROLLBACK;
SELECT tableoid::regclass, * FROM gnm_b ORDER BY id;

DROP TABLE gnm_a, gnm_b;
DROP FUNCTION gnm_cascade(), gnm_on_delete(), gnm_failing();
DELETE FROM idem.initial_states WHERE machine = 'gnm';
DELETE FROM idem.transitions WHERE machine = 'gnm';
