-- idem_transition through a partitioned table finds the row as "UPDATE
-- parent ... WHERE pk = ..." does, whatever the partition's own indexes: a
-- partition attached with its own primary key in another column order, or
-- with no primary key at all (only the index the parent's key attached to).
\set VERBOSITY terse

SELECT idem_allow('lay', 'new', 'paid'), idem_allow('lay', 'paid', 'shipped');

-- a partition whose own primary key has another order and other types
CREATE TABLE lay_c (id int, r text, state text NOT NULL, PRIMARY KEY (id, r))
    PARTITION BY LIST (id);
CREATE TABLE lay_c1 (id int NOT NULL, r text NOT NULL, state text NOT NULL,
    PRIMARY KEY (r, id), UNIQUE (id, r));
ALTER TABLE lay_c ATTACH PARTITION lay_c1 FOR VALUES IN (1);
SELECT idem_guard('lay_c', 'lay', 'state');
INSERT INTO lay_c VALUES (1, 'x', 'new'), (1, 'y', 'new');
SELECT idem_transition('lay_c', ARRAY['1', 'x'], 'paid');
SELECT idem_transition('lay_c', ARRAY['1', 'x'], 'paid');
SELECT idem_transition('lay_c', ARRAY['1', 'z'], 'paid');
SELECT * FROM lay_c ORDER BY id, r;

-- the same with key columns of one type: the right row moves
CREATE TABLE lay_o (a int, b int, state text NOT NULL, v int NOT NULL DEFAULT 0,
    PRIMARY KEY (a, b)) PARTITION BY LIST (a);
CREATE TABLE lay_o1 (a int NOT NULL, b int NOT NULL, state text NOT NULL,
    v int NOT NULL DEFAULT 0, PRIMARY KEY (b, a), UNIQUE (a, b));
ALTER TABLE lay_o ATTACH PARTITION lay_o1 FOR VALUES IN (1, 2);
SELECT idem_guard('lay_o', 'lay', 'state', 'v');
INSERT INTO lay_o VALUES (1, 2, 'new'), (2, 1, 'new');
-- directly, through the partition of the parent's primary key
SET client_min_messages = debug1;
SELECT idem_transition('lay_o', ARRAY['1', '2'], 'paid', 0);
RESET client_min_messages;
SELECT * FROM lay_o ORDER BY a, b;
SELECT idem_transition('lay_o', ARRAY['2', '1'], 'paid', 0);
SELECT idem_transition('lay_o', ARRAY['1', '2'], 'shipped', 1);
SELECT * FROM lay_o ORDER BY a, b;
-- the partition's own key still serves idem_transition on the partition
SELECT idem_transition('lay_o1', ARRAY['1', '2'], 'shipped', 1);
SELECT * FROM lay_o ORDER BY a, b;

-- columns in another order in the partition (other attribute numbers)
CREATE TABLE lay_d (a int, b int, state text NOT NULL, PRIMARY KEY (a, b))
    PARTITION BY LIST (a);
CREATE TABLE lay_d1 (state text NOT NULL, b int NOT NULL, a int NOT NULL,
    PRIMARY KEY (a, b));
ALTER TABLE lay_d ATTACH PARTITION lay_d1 FOR VALUES IN (1, 2);
SELECT idem_guard('lay_d', 'lay', 'state');
INSERT INTO lay_d VALUES (1, 2, 'new'), (2, 1, 'new');
SELECT idem_transition('lay_d', ARRAY['1', '2'], 'paid');
SELECT a, b, state FROM lay_d ORDER BY a, b;

-- a partition with no primary key of its own
CREATE TABLE lay_n (a int, b int, state text NOT NULL, PRIMARY KEY (a, b))
    PARTITION BY LIST (a);
CREATE TABLE lay_n1 (a int NOT NULL, b int NOT NULL, state text NOT NULL,
    UNIQUE (a, b));
ALTER TABLE lay_n ATTACH PARTITION lay_n1 FOR VALUES IN (1);
SELECT idem_guard('lay_n', 'lay', 'state');
INSERT INTO lay_n VALUES (1, 1, 'new'), (1, 2, 'new');
SELECT idem_transition('lay_n', ARRAY['1', '1'], 'paid');
SELECT idem_transition('lay_n', ARRAY['1', '1'], 'paid');
SELECT idem_transition('lay_n', ARRAY['1', '3'], 'paid');
SELECT * FROM lay_n ORDER BY a, b;

-- a BEFORE UPDATE trigger that changes the partition key: the row moves to
-- another partition, as the UPDATE of the parent moves it
CREATE TABLE lay_m (region text, id int, state text NOT NULL,
    v int NOT NULL DEFAULT 0, PRIMARY KEY (region, id)) PARTITION BY LIST (region);
CREATE TABLE lay_m_eu PARTITION OF lay_m FOR VALUES IN ('eu');
CREATE TABLE lay_m_arch PARTITION OF lay_m FOR VALUES IN ('archive');
SELECT idem_guard('lay_m', 'lay', 'state', 'v');
CREATE FUNCTION lay_arch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'paid' THEN
        NEW.region := 'archive';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER zz_arch BEFORE UPDATE ON lay_m FOR EACH ROW EXECUTE FUNCTION lay_arch();
INSERT INTO lay_m VALUES ('eu', 1, 'new'), ('eu', 2, 'new');
UPDATE lay_m SET state = 'paid' WHERE region = 'eu' AND id = 1 AND state = 'new';
SELECT idem_transition('lay_m', ARRAY['eu', '2'], 'paid', 0);
SELECT tableoid::regclass, * FROM lay_m ORDER BY id;
SELECT idem_transition('lay_m', ARRAY['eu', '2'], 'paid', 0);
SELECT idem_transition('lay_m', ARRAY['archive', '2'], 'paid', 1);
-- the trigger disabled on the partition: directly again
ALTER TABLE lay_m_eu DISABLE TRIGGER zz_arch;
INSERT INTO lay_m VALUES ('eu', 3, 'new');
SET client_min_messages = debug1;
SELECT idem_transition('lay_m', ARRAY['eu', '3'], 'paid', 0);
RESET client_min_messages;
SELECT tableoid::regclass, * FROM lay_m ORDER BY id;

-- the guard disabled on the partition that holds the key
CREATE TABLE lay_u (id int PRIMARY KEY, state text NOT NULL) PARTITION BY RANGE (id);
CREATE TABLE lay_u1 PARTITION OF lay_u FOR VALUES FROM (0) TO (10);
CREATE TABLE lay_u2 PARTITION OF lay_u FOR VALUES FROM (10) TO (20);
SELECT idem_guard('lay_u', 'lay', 'state');
INSERT INTO lay_u VALUES (1, 'new'), (11, 'new');
ALTER TABLE lay_u1 DISABLE TRIGGER idem_guard;
\set VERBOSITY default
SELECT idem_transition('lay_u', '1', 'paid');
\set VERBOSITY terse
SELECT idem_transition('lay_u', '11', 'paid');
SELECT * FROM lay_u ORDER BY id;
DROP TABLE lay_c, lay_o, lay_d, lay_n, lay_m, lay_u;
DROP FUNCTION lay_arch();
