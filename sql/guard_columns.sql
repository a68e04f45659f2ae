-- idem_transition's outcomes tell the state of a row and, tried with
-- several expected versions, its version: the caller needs SELECT on the
-- key, the state and the version columns, as a hand-written
-- "UPDATE ... WHERE id = $1 AND status = ... AND version = ..." does.
-- A plain UPDATE refused by the guard does not tell a role the state or
-- version it may not read either.
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
    RETURN st || ': ' || msg || coalesce(' | ' || nullif(det, ''), '');
END;
$$;

SELECT idem_allow('gc', 'new', 'paid'), idem_allow('gc', 'paid', 'shipped');
CREATE TABLE gc (id integer PRIMARY KEY, status text NOT NULL,
                 version integer NOT NULL DEFAULT 0, note text);
INSERT INTO gc (id, status, version) VALUES (1, 'new', 0), (2, 'paid', 0), (3, 'shipped', 7);
SELECT idem_guard('gc', 'gc', 'status', 'version');
CREATE TABLE gc_nover (id integer PRIMARY KEY, status text NOT NULL);
INSERT INTO gc_nover VALUES (1, 'new'), (3, 'shipped');
SELECT idem_guard('gc_nover', 'gc', 'status');

CREATE ROLE regress_idem_gc;
GRANT SELECT (id), UPDATE (status, version) ON gc TO regress_idem_gc;
GRANT SELECT (id), UPDATE (status) ON gc_nover TO regress_idem_gc;

SET ROLE regress_idem_gc;
-- the role may not read the state...
SELECT err($$SELECT status FROM gc WHERE id = 3$$);
-- ...nor may the UPDATE that would find it out
SELECT err($$UPDATE gc SET status = 'paid' WHERE id = 3 AND status = 'new'$$);
-- so idem_transition refuses to answer, whatever the answer would be
SELECT err($$SELECT idem_transition('gc', '1', 'paid')$$);
SELECT err($$SELECT idem_transition('gc', '3', 'shipped')$$);
SELECT err($$SELECT idem_transition('gc', '3', 'paid')$$);
SELECT err($$SELECT idem_transition('gc', '3', 'new')$$);
SELECT err($$SELECT idem_transition('gc', '3', 'shipped', 6)$$);
SELECT err($$SELECT idem_transition('gc', '3', 'shipped', 7)$$);
SELECT err($$SELECT idem_transition('gc', '42', 'paid')$$);
SELECT err($$SELECT idem_transition('gc_nover', '3', 'paid')$$);
-- a plain UPDATE stays under the guard, whose errors do not tell the state
-- or the version the role may not read
SELECT err($$UPDATE gc SET status = 'new' WHERE id = 3$$);
SELECT err($$UPDATE gc SET version = 100 WHERE id = 3$$);
SELECT err($$UPDATE gc_nover SET status = 'new' WHERE id = 3$$);
RESET ROLE;

-- with SELECT on the state but not the version: still refused where there
-- is a version column
GRANT SELECT (status) ON gc, gc_nover TO regress_idem_gc;
SET ROLE regress_idem_gc;
SELECT err($$SELECT idem_transition('gc', '3', 'shipped', 6)$$);
SELECT err($$SELECT idem_transition('gc', '3', 'paid')$$);
SELECT idem_transition('gc_nover', '3', 'paid');
SELECT idem_transition('gc_nover', '1', 'paid');
SELECT err($$UPDATE gc SET status = 'new' WHERE id = 3$$);
SELECT err($$UPDATE gc SET version = 100 WHERE id = 3$$);
RESET ROLE;

-- with SELECT on all three, every outcome
GRANT SELECT (version) ON gc TO regress_idem_gc;
SET ROLE regress_idem_gc;
SELECT idem_transition('gc', '1', 'paid');
SELECT idem_transition('gc', '3', 'shipped');
SELECT idem_transition('gc', '3', 'paid');
SELECT idem_transition('gc', '3', 'new');
SELECT idem_transition('gc', '3', 'shipped', 6);
SELECT idem_transition('gc', '3', 'shipped', 5);
SELECT idem_transition('gc', '42', 'paid');
SELECT err($$UPDATE gc SET version = 100 WHERE id = 3$$);
RESET ROLE;

-- SELECT on the table is enough, as for the UPDATE
REVOKE SELECT (id, status, version) ON gc FROM regress_idem_gc;
GRANT SELECT ON gc TO regress_idem_gc;
SET ROLE regress_idem_gc;
SELECT idem_transition('gc', '2', 'shipped');
RESET ROLE;
SELECT id, status, version FROM gc ORDER BY id;

-- Under row-level security, the messages name neither the state nor the
-- version of a row, as PostgreSQL's own messages name no value of it
CREATE TABLE rl (id int PRIMARY KEY, owner text NOT NULL, status text NOT NULL,
    version int NOT NULL DEFAULT 0);
SELECT idem_guard('rl', 'gc', 'status', 'version');
INSERT INTO rl VALUES (1, 'someone else', 'shipped', 41);
ALTER TABLE rl ENABLE ROW LEVEL SECURITY;
CREATE POLICY sel ON rl FOR SELECT USING (owner = current_user);
CREATE POLICY upd ON rl FOR UPDATE USING (true) WITH CHECK (true);
GRANT SELECT, UPDATE ON rl TO regress_idem_gc;
SET ROLE regress_idem_gc;
SELECT count(*) FROM rl;
SELECT err($$UPDATE rl SET status = 'new'$$);
SELECT err($$UPDATE rl SET version = 7$$);
RESET ROLE;
-- the owner, whom the policies do not bind, is told
SELECT err($$UPDATE rl SET status = 'new'$$);
-- policies on a partitioned table hide the rows of its partitions, also from
-- a role granted SELECT on a partition itself
CREATE TABLE prl (id int PRIMARY KEY, status text NOT NULL, version int NOT NULL DEFAULT 0)
    PARTITION BY RANGE (id);
CREATE TABLE prl_1 PARTITION OF prl FOR VALUES FROM (0) TO (100);
SELECT idem_guard('prl', 'gc', 'status', 'version');
INSERT INTO prl VALUES (1, 'shipped', 41);
ALTER TABLE prl ENABLE ROW LEVEL SECURITY;
CREATE POLICY upd ON prl FOR UPDATE USING (true) WITH CHECK (true);
GRANT SELECT, UPDATE ON prl TO regress_idem_gc;
GRANT SELECT ON prl_1 TO regress_idem_gc;
SET ROLE regress_idem_gc;
SELECT count(*) FROM prl;
SELECT err($$UPDATE prl SET status = 'new'$$);
RESET ROLE;

DROP TABLE gc, gc_nover, rl, prl;
DROP ROLE regress_idem_gc;
DELETE FROM idem.transitions;
DROP FUNCTION err(text);
