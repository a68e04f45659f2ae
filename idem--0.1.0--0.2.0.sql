/* idem--0.1.0--0.2.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idem UPDATE TO '0.2.0'" to load this file. \quit

-- Every statement of this script can run twice: Citus runs an extension's
-- update script on every node, where it meets objects it already changed.
-- CREATE OR REPLACE, IF NOT EXISTS, GRANT and REVOKE repeat as they are;
-- any other DDL on idem's tables goes through a catalog check.

-- ==== BEGIN secure defaults ====
-- idem_release makes any namespace's message be processed again: it is an
-- administration function, granted like the others.
REVOKE ALL ON FUNCTION idem_release(pg_catalog.text, pg_catalog.text) FROM PUBLIC;
-- Internal functions are called by idem's own functions, as their owner.
REVOKE ALL ON FUNCTION idem.retention_of(pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem._check_ns(pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem._transitions_changed() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem._check_transition(pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;
-- ==== END secure defaults ====

-- ==== BEGIN guard definitions ====
-- A guard names its columns in its trigger's arguments, which pg_dump keeps
-- with the table.  This event trigger refuses a command that would leave a
-- guard that cannot work: renaming or dropping a guarded column, changing
-- the version column's type, dropping its NOT NULL, putting it in a key
-- (2BP01); and a guard trigger made by hand that is not BEFORE UPDATE FOR
-- EACH ROW with the guard's arguments, or a second guard on a table.
CREATE OR REPLACE FUNCTION idem._guard_ddl()
RETURNS event_trigger
AS 'MODULE_PATHNAME', 'idem_guard_ddl'
LANGUAGE C;
COMMENT ON FUNCTION idem._guard_ddl() IS
    'refuse DDL that would leave a guard that cannot work (internal)';
REVOKE ALL ON FUNCTION idem._guard_ddl() FROM PUBLIC;
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_event_trigger e
                    WHERE e.evtname OPERATOR(pg_catalog.=) 'idem_guard_ddl') THEN
        CREATE EVENT TRIGGER idem_guard_ddl ON ddl_command_end
            WHEN TAG IN ('ALTER TABLE', 'CREATE INDEX', 'CREATE TRIGGER')
            EXECUTE FUNCTION idem._guard_ddl();
    END IF;
END;
$$;
COMMENT ON EVENT TRIGGER idem_guard_ddl IS
    'refuse DDL that would leave a guard that cannot work: renaming or dropping a guarded column, '
    'changing the version column''s type or NOT NULL, putting it in a key, a guard trigger made by hand that cannot work';
-- ==== END guard definitions ====
