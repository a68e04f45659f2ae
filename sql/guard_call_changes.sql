-- idem_transition runs the input functions of the key's and the state's
-- types to read its arguments; a domain's check may run any SQL, also a
-- change of the table's guard.  The call then fails (55000)
-- rather than use what it read under the guard as it was (it crashed: the
-- state read as an integer was printed as text).  Any role may do this on
-- its own temporary table: no grant is needed.
\set VERBOSITY terse
-- the SQLSTATE and message of the error a statement raises
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;
CREATE ROLE idem_gcc_nobody;
SET ROLE idem_gcc_nobody;

CREATE FUNCTION pg_temp.swap(v int) RETURNS bool LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('idem_gcc.go', true) = 'on' THEN
        SET idem_gcc.go = 'off';
        EXECUTE 'DROP TRIGGER idem_guard ON t';
        EXECUTE 'CREATE TRIGGER idem_guard BEFORE INSERT OR UPDATE ON t
                 FOR EACH ROW EXECUTE FUNCTION idem_guard_trigger(''m2'', ''s2'')';
        EXECUTE 'UPDATE t SET s2 = s2';
    END IF;
    RETURN true;
END $$;
CREATE DOMAIN pg_temp.st AS int CHECK (pg_temp.swap(VALUE));
CREATE TEMP TABLE t (id int PRIMARY KEY, s pg_temp.st NOT NULL, s2 text);
INSERT INTO t VALUES (1, 1, 'x');
CREATE TRIGGER idem_guard BEFORE INSERT OR UPDATE ON t
    FOR EACH ROW EXECUTE FUNCTION idem_guard_trigger('m1', 's');

-- the state's domain swaps the guard while the state is read
SET idem_gcc.go = 'on';
SELECT pg_temp.err($$SELECT idem_transition('t', '1', '2')$$);
-- the error undid the change of guard: with the domain's check left alone,
-- the call answers (machine m1 allows no move)
SET idem_gcc.go = 'off';
SELECT idem_transition('t', '1', '2');
SELECT * FROM t;

-- a session that guards tables and drops them keeps no memory for each
-- (the entries of dropped tables are removed as new ones come)
CREATE PROCEDURE pg_temp.churn(n int) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..n LOOP
        CREATE TEMP TABLE tt (id int PRIMARY KEY, s text NOT NULL);
        CREATE TRIGGER idem_guard BEFORE INSERT OR UPDATE ON tt
            FOR EACH ROW EXECUTE FUNCTION idem_guard_trigger('m1', 's');
        INSERT INTO tt VALUES (1, 'a');
        PERFORM idem_transition('tt', '1', 'b');
        DROP TABLE tt;
        COMMIT;
    END LOOP;
END $$;
CALL pg_temp.churn(300);
RESET ROLE;
SELECT count(*) < 150 AS bounded
  FROM pg_backend_memory_contexts WHERE name = 'idem guarded table';
DROP TABLE pg_temp.t;
DROP OWNED BY idem_gcc_nobody;
DROP ROLE idem_gcc_nobody;

-- the same through a row-level security policy, which the SPI path's look
-- at the row (before its UPDATE) runs: the call fails as well
CREATE ROLE idem_gcc_rls;
SET ROLE idem_gcc_rls;
CREATE FUNCTION pg_temp.swap2(i int) RETURNS bool LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('idem_gcc.go', true) = 'on' THEN
        SET idem_gcc.go = 'off';
        EXECUTE 'DROP TRIGGER idem_guard ON r';
        EXECUTE 'CREATE TRIGGER idem_guard BEFORE INSERT OR UPDATE ON r
                 FOR EACH ROW EXECUTE FUNCTION idem_guard_trigger(''m2'', ''s2'')';
        EXECUTE 'UPDATE r SET s2 = s2 WHERE id = 2';
    END IF;
    RETURN true;
END $$;
SET idem_gcc.go = 'off';
CREATE TEMP TABLE r (id int PRIMARY KEY, s int NOT NULL, s2 text);
INSERT INTO r VALUES (1, 1, 'x'), (2, 1, 'y');
CREATE TRIGGER idem_guard BEFORE INSERT OR UPDATE ON r
    FOR EACH ROW EXECUTE FUNCTION idem_guard_trigger('m1', 's');
ALTER TABLE r ENABLE ROW LEVEL SECURITY;
ALTER TABLE r FORCE ROW LEVEL SECURITY;
CREATE POLICY p ON r USING (pg_temp.swap2(id)) WITH CHECK (true);
SET idem_gcc.go = 'on';
SELECT pg_temp.err($$SELECT idem_transition('r', '1', '2')$$);
SET idem_gcc.go = 'off';
SELECT idem_transition('r', '1', '2');
DROP TABLE r;
RESET ROLE;
DROP OWNED BY idem_gcc_rls;
DROP ROLE idem_gcc_rls;
