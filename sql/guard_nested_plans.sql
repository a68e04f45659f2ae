-- idem_transition through SPI (the table has row-level security) keeps its
-- plans allocated until it is done with them: a policy of the table that
-- calls idem_transition on it again, after an invalidation of the table,
-- while the outer call looks for the row, makes the inner call prepare new
-- plans, and the outer call's look-up goes on with its own.  (The error's
-- context names the outer look-up, read from its plan.)
-- the SQLSTATE, message and detail of the error a statement raises
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    detail text;
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
    RETURN SQLSTATE || ': ' || SQLERRM || ' | ' || detail;
END;
$$;
SELECT idem_allow('nested', 'new', 'paid');
CREATE ROLE regress_idem_nested;
CREATE SCHEMA nested AUTHORIZATION regress_idem_nested;
CREATE TABLE nested.np (id int PRIMARY KEY, status text NOT NULL);
INSERT INTO nested.np VALUES (1, 'new');
SELECT idem_guard('nested.np', 'nested', 'status');
ALTER TABLE nested.np OWNER TO regress_idem_nested;
SET ROLE regress_idem_nested;
-- a BEFORE UPDATE trigger that fires before the guard skips the row when
-- told to, and arms the policy: the outer call then looks for the row
CREATE FUNCTION nested.skip() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('nested.skip', true) = 'on' THEN
        PERFORM set_config('nested.arm', 'on', false);
        RETURN NULL;
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER a_skip BEFORE UPDATE ON nested.np FOR EACH ROW EXECUTE FUNCTION nested.skip();
CREATE FUNCTION nested.visible(k int) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('nested.arm', true) = 'on' THEN
        PERFORM set_config('nested.arm', 'off', false);
        PERFORM set_config('nested.skip', 'off', false);
        -- an invalidation of the table: the inner calls prepare new plans
        GRANT SELECT ON nested.np TO PUBLIC;
        PERFORM idem_transition('nested.np', '999', 'paid');
        REVOKE SELECT ON nested.np FROM PUBLIC;
        PERFORM idem_transition('nested.np', '998', 'paid');
        IF current_setting('nested.raise', true) = 'on' THEN
            RAISE EXCEPTION 'inner calls done';
        END IF;
        -- the outer look-up then finds no row: not_found, without an error
        RETURN current_setting('nested.hide', true) IS DISTINCT FROM 'on';
    END IF;
    RETURN true;
END;
$$;
ALTER TABLE nested.np ENABLE ROW LEVEL SECURITY;
ALTER TABLE nested.np FORCE ROW LEVEL SECURITY;
CREATE POLICY p ON nested.np USING (nested.visible(id));
SET nested.skip = 'on';
SET nested.raise = 'on';
SELECT idem_transition('nested.np', '1', 'paid');
-- and with the outer look-up going on to its end: the row is there, the
-- guard did not fire
SET nested.skip = 'on';
SET nested.raise = 'off';
SELECT pg_temp.err($$SELECT idem_transition('nested.np', '1', 'paid')$$);
-- the plans the inner calls replaced are freed once the outer call is
-- done: 50 such calls leave no plans behind
RESET ROLE;
SELECT count(*) AS plans FROM pg_backend_memory_contexts WHERE name = 'SPI Plan' \gset
SET ROLE regress_idem_nested;
SET nested.hide = 'on';
CREATE TEMP TABLE outcomes (outcome text);
DO $$
BEGIN
    FOR i IN 1..50 LOOP
        PERFORM set_config('nested.skip', 'on', false);
        INSERT INTO outcomes SELECT idem_transition('nested.np', '1', 'paid');
    END LOOP;
END;
$$;
SELECT outcome, count(*) FROM outcomes GROUP BY outcome;
DROP TABLE outcomes;
SET nested.hide = 'off';
RESET ROLE;
SELECT count(*) - :plans < 10 AS plans_freed FROM pg_backend_memory_contexts WHERE name = 'SPI Plan';
SET ROLE regress_idem_nested;
SET nested.skip = 'off';
SELECT idem_transition('nested.np', '1', 'paid');
SELECT status FROM nested.np;
RESET ROLE;
DROP SCHEMA nested CASCADE;
DROP ROLE regress_idem_nested;
DELETE FROM idem.transitions WHERE machine = 'nested';
