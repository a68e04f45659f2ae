/* idem--0.1.0.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION idem" to load this file. \quit

-- idem's own data lives in the schema "idem"; the functions users call live
-- in the extension's schema so that they need no qualification.
CREATE SCHEMA idem;
COMMENT ON SCHEMA idem IS 'storage of the idem extension';
REVOKE ALL ON SCHEMA idem FROM PUBLIC;

-- Consumer dedup: one row per claimed (namespace, message id).
-- The C collation makes the key comparison a memcmp and the order stable
-- across locales.
CREATE TABLE idem.claims (
    ns          pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    msg_id      pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    claimed_at  pg_catalog.timestamptz NOT NULL,
    CONSTRAINT claims_pkey PRIMARY KEY (ns, msg_id)
);
COMMENT ON TABLE idem.claims IS 'claimed message ids, one row per (namespace, message id)';

-- Per-namespace settings; a namespace without a row uses the defaults.
CREATE TABLE idem.namespaces (
    ns          pg_catalog.text COLLATE pg_catalog."C" NOT NULL PRIMARY KEY,
    retention   pg_catalog.interval NOT NULL
        CHECK (retention OPERATOR(pg_catalog.>) '0'::pg_catalog.interval)
);
COMMENT ON TABLE idem.namespaces IS 'per-namespace settings (dedup horizon)';

REVOKE ALL ON ALL TABLES IN SCHEMA idem FROM PUBLIC;

-- pg_dump keeps idem's data with the database it belongs to.
SELECT pg_catalog.pg_extension_config_dump('idem.claims', '');
SELECT pg_catalog.pg_extension_config_dump('idem.namespaces', '');

CREATE TYPE idem_claim_result AS ENUM ('claimed', 'duplicate', 'in_flight');
COMMENT ON TYPE idem_claim_result IS 'outcome of idem_try_claim';

CREATE FUNCTION idem_claim(msg_id pg_catalog.text, ns pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_claim(pg_catalog.text, pg_catalog.text) IS
    'claim a message id: true for the first claim, false for a duplicate; waits on an uncommitted claim';

CREATE FUNCTION idem_try_claim(msg_id pg_catalog.text, ns pg_catalog.text DEFAULT 'default')
RETURNS idem_claim_result
AS 'MODULE_PATHNAME', 'idem_try_claim'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_try_claim(pg_catalog.text, pg_catalog.text) IS
    'claim a message id without waiting: claimed, duplicate or in_flight';

CREATE FUNCTION idem_claim_batch(msg_ids pg_catalog.text[], ns pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.bool[]
AS 'MODULE_PATHNAME', 'idem_claim_batch'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_claim_batch(pg_catalog.text[], pg_catalog.text) IS
    'claim many message ids at once: one result per element, in order';

CREATE FUNCTION idem_claim_info(msg_id pg_catalog.text, ns pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.timestamptz
AS 'MODULE_PATHNAME', 'idem_claim_info'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL SAFE;
COMMENT ON FUNCTION idem_claim_info(pg_catalog.text, pg_catalog.text) IS
    'when a message id was claimed, or NULL if it is not claimed';

CREATE FUNCTION idem_release(msg_id pg_catalog.text, ns pg_catalog.text DEFAULT 'default')
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idem_release'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_release(pg_catalog.text, pg_catalog.text) IS
    'forget a claim on purpose so that the message can be processed again';

-- Retention.  Administration runs as the extension owner through SQL with
-- plans kept by PL/pgSQL: it is a cold path.
CREATE FUNCTION idem_set_retention(ns pg_catalog.text, retention pg_catalog.interval)
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
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
    INSERT INTO idem.namespaces AS n (ns, retention)
        VALUES (idem_set_retention.ns, idem_set_retention.retention)
        ON CONFLICT ON CONSTRAINT namespaces_pkey
        DO UPDATE SET retention = excluded.retention;
END;
$$;
COMMENT ON FUNCTION idem_set_retention(pg_catalog.text, pg_catalog.interval) IS
    'set how long claims of a namespace are kept (its dedup horizon)';

CREATE FUNCTION idem.retention_of(ns pg_catalog.text)
RETURNS pg_catalog.interval
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT COALESCE(
        (SELECT n.retention FROM idem.namespaces n WHERE n.ns OPERATOR(pg_catalog.=) $1),
        '7 days'::pg_catalog.interval);
$$;
COMMENT ON FUNCTION idem.retention_of(pg_catalog.text) IS
    'retention of a namespace: its setting, or 7 days (internal)';

CREATE FUNCTION idem._check_ns(ns pg_catalog.text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_check_ns'
LANGUAGE C IMMUTABLE CALLED ON NULL INPUT PARALLEL SAFE;
COMMENT ON FUNCTION idem._check_ns(pg_catalog.text) IS
    'raise the error of a null, empty or too long namespace (internal)';

CREATE FUNCTION idem_purge(ns pg_catalog.text DEFAULT NULL, max_rows pg_catalog.int4 DEFAULT 10000)
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
        -- younger than its namespace's retention is never deleted.
        cutoff := pg_catalog.now() OPERATOR(pg_catalog.-) idem.retention_of(space);
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
COMMENT ON FUNCTION idem_purge(pg_catalog.text, pg_catalog.int4) IS
    'delete claims older than their namespace''s retention, at most max_rows per call';

REVOKE ALL ON FUNCTION idem_set_retention(pg_catalog.text, pg_catalog.interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_purge(pg_catalog.text, pg_catalog.int4) FROM PUBLIC;

-- ==== BEGIN single-use tokens ====
-- Single-use tokens against double submission.  Only the SHA-256 digest of a
-- token is stored: the table, a backup or a replica yields no usable token.
-- A consumed row is kept until its expiry so that its status stays
-- 'consumed'; idem_token_purge removes rows whose expiry has passed.
-- fillfactor leaves room on each page for what consumption adds: the
-- consumed version is 8 bytes longer and takes a line pointer of its own
-- (about 12 bytes a row for good, 15% of a page of small rows), plus the old
-- versions not yet pruned.  With that room every consumption is a HOT
-- update, even of the last token of a page.
CREATE TABLE idem.tokens (
    scope       pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    digest      pg_catalog.bytea NOT NULL,
    expires_at  pg_catalog.timestamptz NOT NULL,
    consumed_at pg_catalog.timestamptz,
    CONSTRAINT tokens_pkey PRIMARY KEY (scope, digest)
) WITH (fillfactor = 80);
-- purge finds expired rows through this index, oldest first
CREATE INDEX tokens_expires_at_idx ON idem.tokens (expires_at);
COMMENT ON TABLE idem.tokens IS
    'single-use tokens, stored as the SHA-256 digest of the token text, one row per (scope, digest). '
    'The table is WAL-logged: tokens survive a crash and reach standbys. '
    'ALTER TABLE idem.tokens SET UNLOGGED makes issue and consumption cheaper (no WAL for the rows), '
    'at a price: after a crash or an immediate shutdown the table is empty, so every outstanding token becomes unknown, '
    'and a standby holds no tokens (idem_token_status fails there, and after a failover every token is unknown). '
    'SET LOGGED turns it back.';
REVOKE ALL ON TABLE idem.tokens FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('idem.tokens', '');

-- The key that hides, in each token, where its row is (the last 8 of the
-- token's 51 characters).  Made here from the server's strong random source;
-- not dumped, so that a restored database makes its own: hints of tokens
-- issued before then no longer decode, which costs their consumption an
-- index look-up and never changes an answer.  Sessions read it once.
CREATE TABLE idem.token_key (
    only_row pg_catalog.bool PRIMARY KEY DEFAULT true CHECK (only_row),
    key      pg_catalog.bytea NOT NULL CHECK (pg_catalog.octet_length(key) = 32)
);
INSERT INTO idem.token_key (key)
    SELECT pg_catalog.decode(pg_catalog.replace(pg_catalog.gen_random_uuid()::pg_catalog.text
                                                OPERATOR(pg_catalog.||) pg_catalog.gen_random_uuid()::pg_catalog.text,
                                                '-', ''), 'hex');
COMMENT ON TABLE idem.token_key IS
    'key hiding the row address carried by each token; changing it slows the consumption of outstanding tokens, never changes an answer';
REVOKE ALL ON TABLE idem.token_key FROM PUBLIC;

CREATE TYPE idem_token_state AS ENUM ('valid', 'consumed', 'expired', 'unknown');
COMMENT ON TYPE idem_token_state IS 'state of a single-use token, as told by idem_token_status';

CREATE FUNCTION idem_token_issue(scope pg_catalog.text DEFAULT '',
                                 ttl pg_catalog.interval DEFAULT '30 minutes')
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idem_token_issue'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_token_issue(pg_catalog.text, pg_catalog.interval) IS
    'issue a single-use token (256 random bits, URL-safe) valid in scope until now() + ttl (at most one year)';

CREATE FUNCTION idem_token_consume(token pg_catalog.text, scope pg_catalog.text DEFAULT '')
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idem_token_consume'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_token_consume(pg_catalog.text, pg_catalog.text) IS
    'consume a token: true exactly once for a valid token of scope; false when consumed, expired, unknown, malformed or of another scope; undone if the transaction rolls back';

CREATE FUNCTION idem_token_status(token pg_catalog.text, scope pg_catalog.text DEFAULT '')
RETURNS idem_token_state
AS 'MODULE_PATHNAME', 'idem_token_status'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL SAFE;
COMMENT ON FUNCTION idem_token_status(pg_catalog.text, pg_catalog.text) IS
    'state of a token in scope as committed (or as this transaction left it): valid, consumed, expired or unknown';

CREATE FUNCTION idem_token_purge(max_rows pg_catalog.int4 DEFAULT 10000)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n   pg_catalog.int8;
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
    -- Expiry is judged at this transaction's start, as consumption judges
    -- it.  Rows locked by someone else (a consumption in progress) are
    -- skipped, never waited for.
    DELETE FROM idem.tokens t
     WHERE t.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
            SELECT v.ctid FROM idem.tokens v
             WHERE v.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
             ORDER BY v.expires_at
             LIMIT max_rows
               FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;
COMMENT ON FUNCTION idem_token_purge(pg_catalog.int4) IS
    'delete tokens whose expiry has passed (consumed or not), at most max_rows per call';
REVOKE ALL ON FUNCTION idem_token_purge(pg_catalog.int4) FROM PUBLIC;
-- ==== END single-use tokens ====

-- ==== BEGIN state-transition guard ====
-- State machines: one row per allowed transition.  States are compared as
-- the text the state column's type prints, so integer, text and enum state
-- columns all work (an integer state 1 is written '1').
CREATE TABLE idem.transitions (
    machine     pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    from_state  pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    to_state    pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    CONSTRAINT transitions_pkey PRIMARY KEY (machine, from_state, to_state),
    CONSTRAINT transitions_machine_check
        CHECK (pg_catalog.octet_length(machine) OPERATOR(pg_catalog.>=) 1
               AND pg_catalog.octet_length(machine) OPERATOR(pg_catalog.<=) 63)
);
COMMENT ON TABLE idem.transitions IS
    'state machines: the allowed transitions, one row each';
REVOKE ALL ON TABLE idem.transitions FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('idem.transitions', '');

-- Every backend keeps the machines in memory; any change of the table
-- (through idem_allow, idem_disallow or plain SQL, on a primary or applied
-- by logical replication) tells every backend to read them again.
CREATE FUNCTION idem._transitions_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_transitions_changed'
LANGUAGE C;
COMMENT ON FUNCTION idem._transitions_changed() IS
    'invalidate the cached state machines of every session';
CREATE TRIGGER transitions_changed
    AFTER INSERT OR UPDATE OR DELETE ON idem.transitions
    FOR EACH ROW EXECUTE FUNCTION idem._transitions_changed();
CREATE TRIGGER transitions_truncated
    AFTER TRUNCATE ON idem.transitions
    FOR EACH STATEMENT EXECUTE FUNCTION idem._transitions_changed();
ALTER TABLE idem.transitions ENABLE ALWAYS TRIGGER transitions_changed;
ALTER TABLE idem.transitions ENABLE ALWAYS TRIGGER transitions_truncated;

CREATE FUNCTION idem._check_transition(machine pg_catalog.text,
                                       from_state pg_catalog.text,
                                       to_state pg_catalog.text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE CALLED ON NULL INPUT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF machine IS NULL THEN
        RAISE EXCEPTION 'machine must not be null' USING ERRCODE = '22004';
    END IF;
    IF from_state IS NULL THEN
        RAISE EXCEPTION 'from_state must not be null' USING ERRCODE = '22004';
    END IF;
    IF to_state IS NULL THEN
        RAISE EXCEPTION 'to_state must not be null' USING ERRCODE = '22004';
    END IF;
    IF machine OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'machine must not be empty'
            USING ERRCODE = '22023', HINT = 'Give a non-empty identifier.';
    END IF;
    IF pg_catalog.octet_length(machine) OPERATOR(pg_catalog.>) 63 THEN
        RAISE EXCEPTION 'machine is too long'
            USING ERRCODE = '22001',
                  DETAIL = pg_catalog.format('The machine is %s bytes long; the limit is 63 bytes.',
                                             pg_catalog.octet_length(machine));
    END IF;
END;
$$;
COMMENT ON FUNCTION idem._check_transition(pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
    'check the arguments of idem_allow and idem_disallow';

CREATE FUNCTION idem_allow(machine pg_catalog.text, from_state pg_catalog.text,
                           to_state pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n pg_catalog.int8;
BEGIN
    PERFORM idem._check_transition(machine, from_state, to_state);
    INSERT INTO idem.transitions AS t (machine, from_state, to_state)
        VALUES (idem_allow.machine, idem_allow.from_state, idem_allow.to_state)
        ON CONFLICT ON CONSTRAINT transitions_pkey DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n OPERATOR(pg_catalog.>) 0;
END;
$$;
COMMENT ON FUNCTION idem_allow(pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
    'allow a transition of a state machine: true if it was not allowed yet';

CREATE FUNCTION idem_disallow(machine pg_catalog.text, from_state pg_catalog.text,
                              to_state pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n pg_catalog.int8;
BEGIN
    PERFORM idem._check_transition(machine, from_state, to_state);
    DELETE FROM idem.transitions t
     WHERE t.machine OPERATOR(pg_catalog.=) idem_disallow.machine
       AND t.from_state OPERATOR(pg_catalog.=) idem_disallow.from_state
       AND t.to_state OPERATOR(pg_catalog.=) idem_disallow.to_state;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n OPERATOR(pg_catalog.>) 0;
END;
$$;
COMMENT ON FUNCTION idem_disallow(pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
    'disallow a transition of a state machine: true if it was allowed';

-- The guard: a C row trigger, BEFORE UPDATE, named idem_guard, whose
-- arguments (machine, state column, version column) are the whole
-- definition of the guard; it is dumped with the table.
CREATE FUNCTION idem_guard_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_guard_trigger'
LANGUAGE C;
COMMENT ON FUNCTION idem_guard_trigger() IS
    'trigger of a guarded table: refuses illegal transitions and keeps the version';

-- Not SECURITY DEFINER: creating the trigger takes the caller's TRIGGER
-- privilege on the table, dropping it the caller's ownership.
CREATE FUNCTION idem_guard(tbl pg_catalog.regclass, machine pg_catalog.text,
                           state_column pg_catalog.name,
                           version_column pg_catalog.name DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_guard'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_guard(pg_catalog.regclass, pg_catalog.text, pg_catalog.name, pg_catalog.name) IS
    'guard a table: every UPDATE must follow the machine and bump the version by one';

CREATE FUNCTION idem_unguard(tbl pg_catalog.regclass)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idem_unguard'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_unguard(pg_catalog.regclass) IS
    'remove the guard of a table: true if it had one';

CREATE TYPE idem_transition_result AS ENUM
    ('applied', 'already', 'stale', 'illegal', 'not_found');
COMMENT ON TYPE idem_transition_result IS 'outcome of idem_transition';

CREATE FUNCTION idem_transition(tbl pg_catalog.regclass, key pg_catalog.text,
                                to_state pg_catalog.text,
                                expected_version pg_catalog.int8 DEFAULT NULL)
RETURNS idem_transition_result
AS 'MODULE_PATHNAME', 'idem_transition'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_transition(pg_catalog.regclass, pg_catalog.text, pg_catalog.text, pg_catalog.int8) IS
    'move a row of a guarded table to a state: applied, already, stale, illegal or not_found';

REVOKE ALL ON FUNCTION idem_allow(pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_disallow(pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_guard(pg_catalog.regclass, pg_catalog.text, pg_catalog.name, pg_catalog.name) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_unguard(pg_catalog.regclass) FROM PUBLIC;
-- ==== END state-transition guard ====
