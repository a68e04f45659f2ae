-- idem.initial_states, like idem.transitions, takes writes only from its
-- owner (idem_allow_initial and idem_disallow_initial run as it): its
-- trigger initial_states_writers refuses every INSERT, UPDATE, DELETE and
-- TRUNCATE by another role with 42501, whatever its grants.  A member of
-- pg_write_all_data (which has USAGE on every schema and may write every
-- table, so no privilege is what refuses it) cannot let a row of a guarded
-- table it may INSERT into start in a state the machine does not allow.
\set VERBOSITY terse

-- err(query): the SQLSTATE, message, detail and hint of the error the
-- query raises; the trigger's refusal has a detail and a hint, the
-- server's own "permission denied" has neither
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    detail text;
    hint text;
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RETURN SQLSTATE || ': ' || SQLERRM || coalesce(' (' || nullif(detail, '') || ')', '')
        || coalesce(' [' || nullif(hint, '') || ']', '');
END $$;
GRANT EXECUTE ON FUNCTION pg_temp.err(text) TO PUBLIC;

CREATE ROLE regress_idem_is_writer IN ROLE pg_write_all_data;
CREATE ROLE regress_idem_is_granted;
GRANT USAGE ON SCHEMA idem TO regress_idem_is_granted;
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON idem.initial_states TO regress_idem_is_granted;

SELECT idem_allow('pis', 'new', 'paid'), idem_allow_initial('pis', 'new');
CREATE TABLE pis_orders (id int PRIMARY KEY, status text NOT NULL);
SELECT idem_guard('pis_orders', 'pis', 'status');
GRANT SELECT, INSERT, UPDATE ON pis_orders TO regress_idem_is_writer;

-- the writer may write idem's other tables, but no initial state: a row
-- that starts in 'paid' stays refused (TRUNCATE is no privilege of
-- pg_write_all_data: the server refuses it before the trigger)
SET ROLE regress_idem_is_writer;
SELECT pg_temp.err($$INSERT INTO idem.claims VALUES ('pis', 'm1', now())$$) AS claims_insert;
SELECT pg_temp.err($$INSERT INTO idem.initial_states VALUES ('pis', 'paid')$$);
SELECT pg_temp.err($$UPDATE idem.initial_states SET state = 'paid'$$);
SELECT pg_temp.err($$DELETE FROM idem.initial_states$$);
SELECT pg_temp.err($$TRUNCATE idem.initial_states$$);
SELECT pg_temp.err($$SELECT idem_allow_initial('pis', 'paid')$$);
SELECT pg_temp.err($$INSERT INTO pis_orders VALUES (1, 'paid')$$);
SELECT pg_temp.err($$INSERT INTO pis_orders VALUES (2, 'new')$$);
RESET ROLE;
-- nor does a grant on the table get round it
SET ROLE regress_idem_is_granted;
SELECT pg_temp.err($$INSERT INTO idem.initial_states VALUES ('pis', 'paid')$$);
SELECT pg_temp.err($$UPDATE idem.initial_states SET state = 'paid' WHERE machine = 'pis'$$);
SELECT pg_temp.err($$DELETE FROM idem.initial_states WHERE machine = 'pis'$$);
SELECT pg_temp.err($$TRUNCATE idem.initial_states$$);
RESET ROLE;
SELECT state FROM idem.initial_states WHERE machine = 'pis' ORDER BY 1;
SELECT id, status FROM pis_orders ORDER BY id;

-- the way in is idem_allow_initial and idem_disallow_initial, granted: they
-- run as the owner
GRANT EXECUTE ON FUNCTION idem_allow_initial(text, text), idem_disallow_initial(text, text)
    TO regress_idem_is_writer;
SET ROLE regress_idem_is_writer;
SELECT idem_allow_initial('pis', 'paid') AS allowed;
SELECT pg_temp.err($$INSERT INTO pis_orders VALUES (3, 'paid')$$);
SELECT idem_disallow_initial('pis', 'paid') AS disallowed;
SELECT pg_temp.err($$INSERT INTO pis_orders VALUES (4, 'paid')$$);
RESET ROLE;
-- and the owner (a superuser here) writes the table directly
INSERT INTO idem.initial_states VALUES ('pis', 'shipped');
DELETE FROM idem.initial_states WHERE machine = 'pis' AND state = 'shipped';
SELECT state FROM idem.initial_states WHERE machine = 'pis' ORDER BY 1;
SELECT id, status FROM pis_orders ORDER BY id;

SELECT idem_unguard('pis_orders');
DROP TABLE pis_orders;
DELETE FROM idem.initial_states WHERE machine = 'pis';
DELETE FROM idem.transitions WHERE machine = 'pis';
DELETE FROM idem.claims WHERE ns = 'pis';
REVOKE ALL ON idem.initial_states FROM regress_idem_is_granted;
REVOKE USAGE ON SCHEMA idem FROM regress_idem_is_granted;
REVOKE EXECUTE ON FUNCTION idem_allow_initial(text, text), idem_disallow_initial(text, text)
    FROM regress_idem_is_writer;
DROP ROLE regress_idem_is_writer, regress_idem_is_granted;
