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

-- ==== BEGIN token key ====
-- The key that hides the hints of tokens is 256 bits from the server's
-- strong random source.  0.1.0 made it from two gen_random_uuid() values,
-- whose version and variant bits (12 of the 256) are fixed: such a key is
-- replaced.  A new key only costs the tokens issued before it the page their
-- hint saves (they are found through the primary key); no answer changes.
CREATE OR REPLACE FUNCTION idem._random_key()
RETURNS pg_catalog.bytea
AS 'MODULE_PATHNAME', 'idem_random_key'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION idem._random_key() IS
    'a new key for idem.token_key: 32 bytes from pg_strong_random (internal)';
REVOKE ALL ON FUNCTION idem._random_key() FROM PUBLIC;

UPDATE idem.token_key k
   SET key = idem._random_key()
 WHERE pg_catalog.octet_length(k.key) OPERATOR(pg_catalog.=) 32
   AND (pg_catalog.get_byte(k.key, 6) OPERATOR(pg_catalog.>>) 4) OPERATOR(pg_catalog.=) 4
   AND (pg_catalog.get_byte(k.key, 8) OPERATOR(pg_catalog.>>) 6) OPERATOR(pg_catalog.=) 2
   AND (pg_catalog.get_byte(k.key, 22) OPERATOR(pg_catalog.>>) 4) OPERATOR(pg_catalog.=) 4
   AND (pg_catalog.get_byte(k.key, 24) OPERATOR(pg_catalog.>>) 6) OPERATOR(pg_catalog.=) 2;
INSERT INTO idem.token_key AS k (only_row, key)
    VALUES (true, idem._random_key())
    ON CONFLICT (only_row) DO NOTHING;
COMMENT ON TABLE idem.token_key IS
    'key hiding the row address carried by each token (32 bytes from pg_strong_random, made at CREATE EXTENSION, not dumped); changing it slows the consumption of outstanding tokens, never changes an answer';
-- ==== END token key ====

-- ==== BEGIN retention and purge ====
-- Purge reaches the claims older than a namespace's horizon through this
-- index, oldest first, and stops there: a call with nothing to delete reads
-- a few index pages, not the namespace.  claimed_at is the claiming
-- transaction's start, so new entries go to the right end of their
-- namespace.  On a large idem.claims, create it beforehand with
-- CREATE INDEX CONCURRENTLY idem.claims_ns_claimed_at_idx ON idem.claims (ns, claimed_at):
-- the update then leaves it as it is.
CREATE INDEX IF NOT EXISTS claims_ns_claimed_at_idx ON idem.claims (ns, claimed_at);

-- A retention is at most 100 years, and one that no timestamp can be taken
-- back by is refused: purge computes now() - retention.
CREATE OR REPLACE FUNCTION idem_set_retention(ns pg_catalog.text, retention pg_catalog.interval)
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    out_of_range pg_catalog.bool := false;
BEGIN
    PERFORM idem._check_ns(ns);
    IF retention IS NULL THEN
        RAISE EXCEPTION 'retention must not be null'
            USING ERRCODE = '22004',
                  HINT = 'Give the dedup horizon as a positive interval, such as ''7 days''.';
    END IF;
    IF retention OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval THEN
        RAISE EXCEPTION 'retention must be positive'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The retention given was %s.', retention),
                  HINT = 'Give the dedup horizon as a positive interval, such as ''7 days''.';
    END IF;
    IF retention OPERATOR(pg_catalog.>) '100 years'::pg_catalog.interval THEN
        out_of_range := true;
    ELSE
        -- fields of opposite signs may cancel out in the comparison
        BEGIN
            PERFORM pg_catalog.now() OPERATOR(pg_catalog.-) retention;
        EXCEPTION WHEN datetime_field_overflow THEN
            out_of_range := true;
        END;
    END IF;
    IF out_of_range THEN
        RAISE EXCEPTION 'retention must not exceed 100 years'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The retention given was %s.', retention),
                  HINT = 'Give the dedup horizon as a positive interval, such as ''7 days''.';
    END IF;
    INSERT INTO idem.namespaces AS n (ns, retention)
        VALUES (idem_set_retention.ns, idem_set_retention.retention)
        ON CONFLICT ON CONSTRAINT namespaces_pkey
        DO UPDATE SET retention = excluded.retention;
END;
$$;
COMMENT ON FUNCTION idem_set_retention(pg_catalog.text, pg_catalog.interval) IS
    'set how long claims of a namespace are kept (its dedup horizon, at most 100 years)';

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
        -- retention that reaches before the first timestamp (stored before
        -- retentions were bounded) has nothing older than it.
        BEGIN
            cutoff := pg_catalog.now() OPERATOR(pg_catalog.-) idem.retention_of(space);
        EXCEPTION WHEN datetime_field_overflow THEN
            CONTINUE;
        END;
        -- Oldest first through claims_ns_claimed_at_idx, so that a call
        -- reads what it deletes.  Rows locked by someone else are skipped,
        -- never waited for.
        DELETE FROM idem.claims c
         WHERE c.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
                SELECT v.ctid FROM idem.claims v
                 WHERE v.ns OPERATOR(pg_catalog.=) space
                   AND v.claimed_at OPERATOR(pg_catalog.<) cutoff
                 ORDER BY v.claimed_at
                 LIMIT budget
                   FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS n = ROW_COUNT;
        total := total OPERATOR(pg_catalog.+) n;
        budget := budget OPERATOR(pg_catalog.-) n;
    END LOOP;
    RETURN total;
END;
$$;
-- ==== END retention and purge ====

-- ==== BEGIN transitions writers ====
-- The state machines bind every role that may UPDATE a guarded table, even
-- members of pg_write_all_data, who may write any table: so idem.transitions
-- takes writes only from roles with its owner's rights (idem_allow and
-- idem_disallow run as the owner).  Grants on the table do not get round
-- it.  Logical replication applies changes with the trigger off, as
-- session_replication_role = replica leaves it.
CREATE OR REPLACE FUNCTION idem._transitions_writer()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT pg_catalog.pg_has_role(
            (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) TG_RELID),
            'USAGE') THEN
        RAISE EXCEPTION 'permission denied for table %', TG_TABLE_NAME
            USING ERRCODE = '42501',
                  DETAIL = 'State machines are changed through idem_allow and idem_disallow, or by the owner of the table.',
                  HINT = 'Grant EXECUTE on idem_allow and idem_disallow to the role.';
    END IF;
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION idem._transitions_writer() IS
    'refuse writes to idem.transitions from roles without its owner''s rights (internal)';
REVOKE ALL ON FUNCTION idem._transitions_writer() FROM PUBLIC;
CREATE OR REPLACE TRIGGER transitions_writers
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON idem.transitions
    FOR EACH STATEMENT EXECUTE FUNCTION idem._transitions_writer();
-- ==== END transitions writers ====
