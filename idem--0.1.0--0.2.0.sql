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

-- ==== BEGIN purge with long retentions ====
-- A retention so long that now() - retention falls before the earliest
-- timestamp there is keeps every claim of its namespace: its cutoff cannot
-- be computed, and no claim can be older than it.  It no longer makes
-- idem_purge fail with "timestamp out of range" for every namespace.
CREATE OR REPLACE FUNCTION idem_purge(ns pg_catalog.text DEFAULT NULL, max_rows pg_catalog.int4 DEFAULT 10000)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    space   pg_catalog.text;
    cutoff  pg_catalog.timestamptz;
    budget  pg_catalog.int8;
    n       pg_catalog.int8;
    total   pg_catalog.int8 := 0;
BEGIN
    IF max_rows IS NULL THEN
        RAISE EXCEPTION 'max_rows must not be null'
            USING ERRCODE = '22004',
                  HINT = 'Give the largest number of rows one call may delete.';
    END IF;
    IF max_rows OPERATOR(pg_catalog.<=) 0 THEN
        RAISE EXCEPTION 'max_rows must be positive'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('max_rows was %s.', max_rows),
                  HINT = 'Give the largest number of rows one call may delete.';
    END IF;
    IF idem_purge.ns IS NOT NULL THEN
        PERFORM idem._check_ns(idem_purge.ns);
    END IF;
    budget := max_rows;

    -- Namespaces present in the table, found by skipping through the
    -- primary key rather than by reading every row.
    FOR space IN
        WITH RECURSIVE spaces(ns) AS (
            SELECT pg_catalog.min(c.ns) FROM idem.claims c
            UNION ALL
            SELECT (SELECT pg_catalog.min(c.ns) FROM idem.claims c
                     WHERE c.ns OPERATOR(pg_catalog.>) s.ns)
              FROM spaces s WHERE s.ns IS NOT NULL)
        SELECT s.ns FROM spaces s
         WHERE s.ns IS NOT NULL
           AND (idem_purge.ns IS NULL OR s.ns OPERATOR(pg_catalog.=) idem_purge.ns)
    LOOP
        EXIT WHEN budget OPERATOR(pg_catalog.<=) 0;
        -- The horizon is taken from this transaction's start: a claim
        -- younger than its namespace's retention is never deleted.  A
        -- horizon before the earliest timestamp keeps every claim.
        BEGIN
            cutoff := pg_catalog.now() OPERATOR(pg_catalog.-) idem.retention_of(space);
        EXCEPTION WHEN datetime_field_overflow THEN
            CONTINUE;
        END;
        -- Rows locked by someone else are skipped, never waited for.
        DELETE FROM idem.claims c
         WHERE c.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
                SELECT v.ctid FROM idem.claims v
                 WHERE v.ns OPERATOR(pg_catalog.=) space
                   AND v.claimed_at OPERATOR(pg_catalog.<) cutoff
                 LIMIT budget
                   FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS n = ROW_COUNT;
        total := total OPERATOR(pg_catalog.+) n;
        budget := budget OPERATOR(pg_catalog.-) n;
    END LOOP;
    RETURN total;
END;
$$;
-- ==== END purge with long retentions ====
