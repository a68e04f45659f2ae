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

-- ==== BEGIN request idempotency keys ====
-- One row per (namespace, Idempotency-Key).  While a request runs, the row
-- names its owner (the session's pid and start time, and on a Citus cluster
-- the node it is connected to) and a lease; once finished it holds the
-- response until expires_at.
CREATE TABLE IF NOT EXISTS idem.requests (
    ns              pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    key             pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    fingerprint     pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    owner_pid       pg_catalog.int4,
    owner_started   pg_catalog.timestamptz,
    owner_node      pg_catalog.int4,
    lease           pg_catalog.interval,
    lease_until     pg_catalog.timestamptz,
    recovery_point  pg_catalog.text,
    recovery_data   pg_catalog.jsonb,
    response_code   pg_catalog.int4,
    response_body   pg_catalog.jsonb,
    attempts        pg_catalog.int4 NOT NULL,
    created_at      pg_catalog.timestamptz NOT NULL,
    finished_at     pg_catalog.timestamptz,
    expires_at      pg_catalog.timestamptz,
    CONSTRAINT requests_pkey PRIMARY KEY (ns, key)
);
-- purge finds expired requests through this index, oldest first; a request
-- in flight has no expiry and no entry
CREATE INDEX IF NOT EXISTS requests_expires_at_idx ON idem.requests (expires_at)
    WHERE expires_at IS NOT NULL;
COMMENT ON TABLE idem.requests IS
    'request idempotency keys: fingerprint, owner while in flight, stored response once finished';
REVOKE ALL ON TABLE idem.requests FROM PUBLIC;

-- Per-namespace retention of finished requests; 24 hours without a row.
CREATE TABLE IF NOT EXISTS idem.request_retention (
    ns          pg_catalog.text COLLATE pg_catalog."C" NOT NULL PRIMARY KEY,
    retention   pg_catalog.interval NOT NULL
        CHECK (retention OPERATOR(pg_catalog.>) '0'::pg_catalog.interval)
);
COMMENT ON TABLE idem.request_retention IS
    'per-namespace retention of finished requests (24 hours without a row)';
REVOKE ALL ON TABLE idem.request_retention FROM PUBLIC;

-- pg_dump keeps requests and their settings with the database.  Marked
-- once, one table per statement: the function runs only inside CREATE or
-- ALTER EXTENSION, and updates the extension's own row.
SELECT pg_catalog.pg_extension_config_dump('idem.requests', '')
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'idem'
                      AND 'idem.requests'::pg_catalog.regclass OPERATOR(pg_catalog.=) ANY (e.extconfig));
SELECT pg_catalog.pg_extension_config_dump('idem.request_retention', '')
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'idem'
                      AND 'idem.request_retention'::pg_catalog.regclass OPERATOR(pg_catalog.=) ANY (e.extconfig));

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_type t
                    WHERE t.typname OPERATOR(pg_catalog.=) 'idem_request_status'
                      AND t.typnamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace
                      AND EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                                   WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
                                     AND d.objid OPERATOR(pg_catalog.=) t.oid
                                     AND d.deptype OPERATOR(pg_catalog.=) 'e'
                                     AND d.refobjid OPERATOR(pg_catalog.=)
                                         (SELECT x.oid FROM pg_catalog.pg_extension x
                                           WHERE x.extname OPERATOR(pg_catalog.=) 'idem'))) THEN
        CREATE TYPE @extschema@.idem_request_status AS ENUM
            ('new', 'replay', 'mismatch', 'in_flight', 'resume');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_type t
                    WHERE t.typname OPERATOR(pg_catalog.=) 'idem_request'
                      AND t.typnamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace
                      AND EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                                   WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
                                     AND d.objid OPERATOR(pg_catalog.=) t.oid
                                     AND d.deptype OPERATOR(pg_catalog.=) 'e'
                                     AND d.refobjid OPERATOR(pg_catalog.=)
                                         (SELECT x.oid FROM pg_catalog.pg_extension x
                                           WHERE x.extname OPERATOR(pg_catalog.=) 'idem'))) THEN
        CREATE TYPE @extschema@.idem_request AS (
            status          @extschema@.idem_request_status,
            response_code   pg_catalog.int4,
            response_body   pg_catalog.jsonb,
            recovery_point  pg_catalog.text,
            recovery_data   pg_catalog.jsonb,
            attempts        pg_catalog.int4,
            created_at      pg_catalog.timestamptz);
    END IF;
END;
$$;
COMMENT ON TYPE idem_request_status IS 'outcome of idem_request_begin';
COMMENT ON TYPE idem_request IS 'answer of idem_request_begin';

CREATE OR REPLACE FUNCTION idem_request_begin(key pg_catalog.text, fingerprint pg_catalog.text,
                                              ns pg_catalog.text DEFAULT 'default',
                                              lease pg_catalog.interval DEFAULT '5 minutes')
RETURNS idem_request
AS 'MODULE_PATHNAME', 'idem_request_begin'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_request_begin(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.interval) IS
    'begin a request under an idempotency key: new, replay, mismatch, in_flight or resume; never waits';

CREATE OR REPLACE FUNCTION idem_request_checkpoint(key pg_catalog.text, recovery_point pg_catalog.text,
                                                   recovery_data pg_catalog.jsonb DEFAULT NULL,
                                                   ns pg_catalog.text DEFAULT 'default')
RETURNS void
AS 'MODULE_PATHNAME', 'idem_request_checkpoint'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_request_checkpoint(pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.text) IS
    'record how far the owner of a request got: a later attempt resumes from there';

CREATE OR REPLACE FUNCTION idem_request_finish(key pg_catalog.text, response_code pg_catalog.int4,
                                               response_body pg_catalog.jsonb DEFAULT NULL,
                                               ns pg_catalog.text DEFAULT 'default',
                                               cache pg_catalog.bool DEFAULT true)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_request_finish'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_request_finish(pg_catalog.text, pg_catalog.int4, pg_catalog.jsonb, pg_catalog.text, pg_catalog.bool) IS
    'store the response of a request in this transaction (replayed to every retry); cache => false releases the key instead';

CREATE OR REPLACE FUNCTION idem_request_fingerprint(payload pg_catalog.jsonb)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idem_request_fingerprint'
LANGUAGE C IMMUTABLE CALLED ON NULL INPUT PARALLEL SAFE;
COMMENT ON FUNCTION idem_request_fingerprint(pg_catalog.jsonb) IS
    'SHA-256 (hex) of a JSON payload: key order, whitespace and the notation of equal numbers do not matter';

-- Whether an interval has fields of both signs (one month less 29 days): a
-- span that depends on the date it is added to (a day from March 1st, a
-- negative span from February 1st).  The retentions refuse them.
CREATE OR REPLACE FUNCTION idem._interval_mixed(span pg_catalog.interval)
RETURNS pg_catalog.bool
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.date_part('year', span) OPERATOR(pg_catalog.<) 0
        OR pg_catalog.date_part('month', span) OPERATOR(pg_catalog.<) 0
        OR pg_catalog.date_part('day', span) OPERATOR(pg_catalog.<) 0
        OR pg_catalog.date_part('hour', span) OPERATOR(pg_catalog.<) 0
        OR pg_catalog.date_part('minute', span) OPERATOR(pg_catalog.<) 0
        OR pg_catalog.date_part('second', span) OPERATOR(pg_catalog.<) 0
$$;
COMMENT ON FUNCTION idem._interval_mixed(pg_catalog.interval) IS
    'whether an interval has fields of both signs (internal)';
REVOKE ALL ON FUNCTION idem._interval_mixed(pg_catalog.interval) FROM PUBLIC;

-- The length of an interval without fields of both signs, in days, a month
-- counting as a mean month (30.4375 days): what the retentions' bounds are
-- judged by, so that 100 years are 1,200 months, 36,525 days, or any mix of
-- the two that adds up to no more.  (An interval compares a month as 30
-- days, which takes 1 month and 36,000 days for more than 100 years.)
CREATE OR REPLACE FUNCTION idem._interval_days(span pg_catalog.interval)
RETURNS pg_catalog.float8
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    -- (OPERATOR() gives every operator the same precedence: parenthesized)
    SELECT (((pg_catalog.date_part('year', span) OPERATOR(pg_catalog.*) 12)
             OPERATOR(pg_catalog.+) pg_catalog.date_part('month', span)) OPERATOR(pg_catalog.*) 30.4375::pg_catalog.float8)
           OPERATOR(pg_catalog.+) pg_catalog.date_part('day', span)
           OPERATOR(pg_catalog.+) (((pg_catalog.date_part('hour', span) OPERATOR(pg_catalog.*) 3600)
                                    OPERATOR(pg_catalog.+) (pg_catalog.date_part('minute', span) OPERATOR(pg_catalog.*) 60)
                                    OPERATOR(pg_catalog.+) pg_catalog.date_part('second', span))
                                   OPERATOR(pg_catalog./) 86400)
$$;
COMMENT ON FUNCTION idem._interval_days(pg_catalog.interval) IS
    'the length of an interval in days, a month as 30.4375 days (internal)';
REVOKE ALL ON FUNCTION idem._interval_days(pg_catalog.interval) FROM PUBLIC;

CREATE OR REPLACE FUNCTION idem_request_set_retention(ns pg_catalog.text, retention pg_catalog.interval)
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idem._check_ns(ns);
    IF retention IS NULL THEN
        RAISE EXCEPTION 'retention must not be null'
            USING ERRCODE = '22004',
                  HINT = 'Give how long finished requests are replayed, such as ''24 hours''.';
    END IF;
    -- one year is 12 months, 366 days, or a mix of the two that adds up to
    -- no more (a month as 30.4375 days)
    IF retention OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval
       OR idem._interval_days(retention) OPERATOR(pg_catalog.>) 366 THEN
        RAISE EXCEPTION 'retention must be positive and at most one year'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The retention given was %s.', retention),
                  HINT = 'Give how long finished requests are replayed, such as ''24 hours''.';
    END IF;
    -- a field of the other sign makes the span depend on the date: one month
    -- less 29 days is a day from March 1st and a negative span from February 1st
    IF idem._interval_mixed(retention) THEN
        RAISE EXCEPTION 'retention must not mix positive and negative fields'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The retention given was %s.', retention),
                  HINT = 'Give how long finished requests are replayed, such as ''24 hours''.';
    END IF;
    INSERT INTO idem.request_retention AS r (ns, retention)
        VALUES (idem_request_set_retention.ns, idem_request_set_retention.retention)
        ON CONFLICT ON CONSTRAINT request_retention_pkey
        DO UPDATE SET retention = excluded.retention;
END;
$$;
COMMENT ON FUNCTION idem_request_set_retention(pg_catalog.text, pg_catalog.interval) IS
    'set how long the finished requests of a namespace are replayed (from their finish on)';

CREATE OR REPLACE FUNCTION idem_request_purge(max_rows pg_catalog.int4 DEFAULT 10000)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Only finished and released requests have an expiry (idem._purge_expired,
    -- defined with the purge of claims)
    RETURN idem._purge_expired('idem.requests', max_rows);
END;
$$;
COMMENT ON FUNCTION idem_request_purge(pg_catalog.int4) IS
    'delete finished and released requests whose expiry has passed, at most max_rows per call';

REVOKE ALL ON FUNCTION idem_request_set_retention(pg_catalog.text, pg_catalog.interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_request_purge(pg_catalog.int4) FROM PUBLIC;
-- ==== END request idempotency keys ====

-- ==== BEGIN guard definitions ====
-- A guard names its columns in its trigger's arguments, which pg_dump keeps
-- with the table.  This event trigger refuses a command that would leave a
-- guard that cannot work: renaming or dropping a guarded column, changing
-- the version column's type, dropping its NOT NULL, putting it in a key
-- (2BP01), also in a new partition (CREATE TABLE ... PARTITION OF); and a
-- guard trigger made by hand that is not BEFORE UPDATE FOR EACH ROW with the
-- guard's arguments, or a second guard on a table.
CREATE OR REPLACE FUNCTION idem._guard_ddl()
RETURNS event_trigger
AS 'MODULE_PATHNAME', 'idem_guard_ddl'
LANGUAGE C;
COMMENT ON FUNCTION idem._guard_ddl() IS
    'refuse DDL that would leave a guard that cannot work (internal)';
REVOKE ALL ON FUNCTION idem._guard_ddl() FROM PUBLIC;
-- The event triggers, made when the extension does not have them yet (an
-- update script may run twice).
DO $$
DECLARE
    have pg_catalog.name[];
BEGIN
    SELECT pg_catalog.array_agg(e.evtname) INTO have
      FROM pg_catalog.pg_event_trigger e
      JOIN pg_catalog.pg_depend d
        ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_event_trigger'::pg_catalog.regclass
       AND d.objid OPERATOR(pg_catalog.=) e.oid
       AND d.deptype OPERATOR(pg_catalog.=) 'e'
     WHERE d.refobjid OPERATOR(pg_catalog.=)
           (SELECT x.oid FROM pg_catalog.pg_extension x WHERE x.extname OPERATOR(pg_catalog.=) 'idem');
    IF NOT ('idem_guard_ddl' OPERATOR(pg_catalog.=) ANY (COALESCE(have, '{}'))) THEN
        CREATE EVENT TRIGGER idem_guard_ddl ON ddl_command_end
            WHEN TAG IN ('ALTER TABLE', 'ALTER TYPE', 'CREATE INDEX', 'CREATE TABLE', 'CREATE TRIGGER')
            EXECUTE FUNCTION idem._guard_ddl();
    END IF;
    IF NOT ('idem_guard_drop' OPERATOR(pg_catalog.=) ANY (COALESCE(have, '{}'))) THEN
        CREATE EVENT TRIGGER idem_guard_drop ON sql_drop
            EXECUTE FUNCTION idem._guard_ddl();
    END IF;
END;
$$;
COMMENT ON EVENT TRIGGER idem_guard_ddl IS
    'refuse DDL that would leave a guard that cannot work: renaming or dropping a guarded column, '
    'changing the version column''s type or NOT NULL, putting it in a key, a guard trigger made by hand that cannot work';
COMMENT ON EVENT TRIGGER idem_guard_drop IS
    'refuse a drop that takes a guarded column with it, such as DROP TYPE ... CASCADE of its type';
-- ==== END guard definitions ====

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
-- CREATE INDEX CONCURRENTLY claims_ns_claimed_at_idx ON idem.claims (ns, claimed_at):
-- the update then leaves it as it is, unless that build was interrupted
-- (the index is then invalid, and built again here).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                WHERE i.indexrelid OPERATOR(pg_catalog.=)
                      pg_catalog.to_regclass('idem.claims_ns_claimed_at_idx')
                  AND NOT (i.indisvalid AND i.indisready)) THEN
        DROP INDEX idem.claims_ns_claimed_at_idx;
    END IF;
END;
$$;
CREATE INDEX IF NOT EXISTS claims_ns_claimed_at_idx ON idem.claims (ns, claimed_at);

-- A retention is at most 100 years, and one that no timestamp can be taken
-- back by is refused: purge computes now() - retention (in UTC).
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
    -- a field of the other sign makes the span depend on the date: one month
    -- less 29 days is a day from March 1st and a negative span from February 1st
    IF idem._interval_mixed(retention) THEN
        RAISE EXCEPTION 'retention must not mix positive and negative fields'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The retention given was %s.', retention),
                  HINT = 'Give the dedup horizon as a positive interval, such as ''7 days''.';
    END IF;
    -- 100 years are 1,200 months, 36,525 days, or a mix of the two that
    -- adds up to no more (a month as 30.4375 days)
    IF idem._interval_days(retention) OPERATOR(pg_catalog.>) 36525 THEN
        out_of_range := true;
    ELSE
        -- fields of opposite signs may cancel out in the comparison
        BEGIN
            PERFORM pg_catalog.timezone('UTC', pg_catalog.now()) OPERATOR(pg_catalog.-) retention;
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

-- 0.1.0 took retentions with fields of both signs; the purge keeps the
-- claims of their namespaces (see idem._purge_claims) until they are set
-- again.
DO $$
DECLARE
    r   record;
BEGIN
    FOR r IN SELECT n.ns, n.retention FROM idem.namespaces n
              WHERE idem._interval_mixed(n.retention)
              ORDER BY n.ns LOOP
        RAISE WARNING 'the retention % of namespace "%" mixes positive and negative fields: its claims are not purged',
            r.retention, r.ns
            USING HINT = 'Set it again with idem_set_retention().';
    END LOOP;
END;
$$;

-- The relations a purge deletes from on this node: the table, or, when
-- Citus distributes it, the shards of it that this node holds (a purge on a
-- distributed table cannot be one statement through Citus: each node
-- purges its own shards, and the coordinator asks the workers, see
-- idem._purge_workers).
CREATE OR REPLACE FUNCTION idem._is_distributed(tbl pg_catalog.regclass)
RETURNS pg_catalog.bool
LANGUAGE plpgsql STABLE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d   pg_catalog.bool;
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                             WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1
                               AND p.partmethod OPERATOR(pg_catalog.=) ''h'')'
        INTO d USING tbl;
    RETURN d;
END;
$$;
COMMENT ON FUNCTION idem._is_distributed(pg_catalog.regclass) IS
    'whether Citus distributes the table by hash, in shards (internal)';
REVOKE ALL ON FUNCTION idem._is_distributed(pg_catalog.regclass) FROM PUBLIC;

CREATE OR REPLACE FUNCTION idem._purge_targets(tbl pg_catalog.regclass)
RETURNS SETOF pg_catalog.regclass
LANGUAGE plpgsql STABLE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT idem._is_distributed(tbl) THEN
        RETURN NEXT tbl;
        RETURN;
    END IF;
    RETURN QUERY EXECUTE
        'SELECT x.r FROM (SELECT pg_catalog.to_regclass(pg_catalog.shard_name($1, s.shardid)) AS r, s.shardid
                            FROM pg_catalog.pg_dist_shard s
                            JOIN pg_catalog.pg_dist_placement p ON p.shardid OPERATOR(pg_catalog.=) s.shardid
                            JOIN pg_catalog.pg_dist_local_group g ON g.groupid OPERATOR(pg_catalog.=) p.groupid
                           WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1
                             AND p.shardstate OPERATOR(pg_catalog.=) 1) x
          WHERE x.r IS NOT NULL ORDER BY x.shardid'
        USING tbl;
END;
$$;
COMMENT ON FUNCTION idem._purge_targets(pg_catalog.regclass) IS
    'what a purge of the table deletes from on this node: the table, or the shards of it this node holds (internal)';
REVOKE ALL ON FUNCTION idem._purge_targets(pg_catalog.regclass) FROM PUBLIC;

-- On the Citus coordinator of a distributed table, a purge runs the same call
-- on every worker (each purges the shards it holds, at most max_rows there,
-- by its own retention settings) and adds what they deleted.  A worker that
-- fails is reported with a warning; what the others deleted stays deleted.
CREATE OR REPLACE FUNCTION idem._purge_workers(tbl pg_catalog.regclass, call pg_catalog.text)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r       record;
    coord   pg_catalog.bool;
    total   pg_catalog.int8 := 0;
BEGIN
    IF NOT idem._is_distributed(tbl) THEN
        RETURN 0;
    END IF;
    EXECUTE 'SELECT pg_catalog.citus_is_coordinator()' INTO coord;
    IF NOT coord THEN
        RETURN 0;
    END IF;
    FOR r IN EXECUTE 'SELECT nodename, nodeport, success, result
                        FROM pg_catalog.run_command_on_workers($1)' USING call LOOP
        IF r.success AND r.result OPERATOR(pg_catalog.~) '^[0-9]+$' THEN
            total := total OPERATOR(pg_catalog.+) r.result::pg_catalog.int8;
        ELSE
            RAISE WARNING 'the purge of % failed on the worker %:%', tbl, r.nodename, r.nodeport
                USING DETAIL = r.result;
        END IF;
    END LOOP;
    RETURN total;
END;
$$;
COMMENT ON FUNCTION idem._purge_workers(pg_catalog.regclass, pg_catalog.text) IS
    'on a Citus coordinator: runs a purge of a distributed table on every worker and adds what they deleted (internal)';
REVOKE ALL ON FUNCTION idem._purge_workers(pg_catalog.regclass, pg_catalog.text) FROM PUBLIC;

-- The purges' bodies are internal functions in the schema idem, which only
-- the extension's owner may change, and the functions that run as the owner
-- (the purges, idem_maintenance, and the calls sent to Citus workers) call
-- those: the extension's own schema (public, usually) is one its owner, or
-- a role with CREATE on it, could put a function of the same name in, or
-- rename, and have it run as a superuser.
CREATE OR REPLACE FUNCTION idem._purge_claims(ns pg_catalog.text, max_rows pg_catalog.int4)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    rel     pg_catalog.regclass;
    space   pg_catalog.text;
    span    pg_catalog.interval;
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
    IF _purge_claims.ns IS NOT NULL THEN
        PERFORM idem._check_ns(_purge_claims.ns);
    END IF;
    budget := max_rows;

    FOR rel IN SELECT t FROM idem._purge_targets('idem.claims') t LOOP
        -- Namespaces present in the table, found by skipping through the
        -- primary key rather than by reading every row.
        FOR space IN EXECUTE pg_catalog.format(
            'WITH RECURSIVE spaces(ns) AS (
                SELECT pg_catalog.min(c.ns) FROM %1$s c
                UNION ALL
                SELECT (SELECT pg_catalog.min(c.ns) FROM %1$s c
                         WHERE c.ns OPERATOR(pg_catalog.>) s.ns)
                  FROM spaces s WHERE s.ns IS NOT NULL)
            SELECT s.ns FROM spaces s
             WHERE s.ns IS NOT NULL
               AND ($1 IS NULL OR s.ns OPERATOR(pg_catalog.=) $1)', rel)
            USING _purge_claims.ns
        LOOP
            EXIT WHEN budget OPERATOR(pg_catalog.<=) 0;
            -- The horizon is taken from this transaction's start: a claim
            -- younger than its namespace's retention is never deleted.  A
            -- retention that reaches before the first timestamp (stored
            -- before retentions were bounded) has nothing older than it.
            span := idem.retention_of(space);
            -- A retention with fields of both signs (0.1.0 took them, and
            -- its CHECK still does) is a span that depends on the date: one
            -- month less 31 days is nothing in December, and would purge
            -- claims made a moment ago.  Its claims are kept.
            IF idem._interval_mixed(span) THEN
                RAISE WARNING 'the claims of namespace "%" are not purged: its retention % mixes positive and negative fields',
                    space, span
                    USING HINT = 'Set it again with idem_set_retention().';
                CONTINUE;
            END IF;
            -- Counted in UTC: a day is 24 hours whatever the caller's time
            -- zone does (across a change to daylight saving time, a day of
            -- it is 23 hours, and claims would go an hour early).
            BEGIN
                cutoff := pg_catalog.timezone('UTC',
                    pg_catalog.timezone('UTC', pg_catalog.now()) OPERATOR(pg_catalog.-) span);
            EXCEPTION WHEN datetime_field_overflow THEN
                CONTINUE;
            END;
            -- Oldest first through claims_ns_claimed_at_idx, so that a call
            -- reads what it deletes.  Rows locked by someone else are
            -- skipped, never waited for.
            EXECUTE pg_catalog.format(
                'DELETE FROM %1$s c
                  WHERE c.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
                        SELECT v.ctid FROM %1$s v
                         WHERE v.ns OPERATOR(pg_catalog.=) $1
                           AND v.claimed_at OPERATOR(pg_catalog.<) $2
                         ORDER BY v.claimed_at
                         LIMIT $3
                           FOR UPDATE SKIP LOCKED))', rel)
                USING space, cutoff, budget;
            GET DIAGNOSTICS n = ROW_COUNT;
            total := total OPERATOR(pg_catalog.+) n;
            budget := budget OPERATOR(pg_catalog.-) n;
        END LOOP;
    END LOOP;
    RETURN total OPERATOR(pg_catalog.+) idem._purge_workers('idem.claims',
        pg_catalog.format('SELECT idem._purge_claims(%L, %s)', _purge_claims.ns, max_rows));
END;
$$;
COMMENT ON FUNCTION idem._purge_claims(pg_catalog.text, pg_catalog.int4) IS
    'what idem_purge does (internal)';
REVOKE ALL ON FUNCTION idem._purge_claims(pg_catalog.text, pg_catalog.int4) FROM PUBLIC;

CREATE OR REPLACE FUNCTION idem_purge(ns pg_catalog.text DEFAULT NULL, max_rows pg_catalog.int4 DEFAULT 10000)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN idem._purge_claims(ns, max_rows);
END;
$$;

-- Tokens: see idem_purge for the shards of a table Citus distributes.
CREATE OR REPLACE FUNCTION idem_token_purge(max_rows pg_catalog.int4 DEFAULT 10000)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN idem._purge_expired('idem.tokens', max_rows);
END;
$$;

-- Delete at most max_rows rows of tbl (tokens, requests) whose expires_at has
-- passed, oldest first, from the table or from this node's shards of it, and
-- on a Citus coordinator, on every worker too.
-- Expiry is judged at this transaction's start, as consumption and begin
-- judge it.  Rows locked by someone else are skipped, never waited for.
CREATE OR REPLACE FUNCTION idem._purge_expired(tbl pg_catalog.regclass, max_rows pg_catalog.int4)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    rel     pg_catalog.regclass;
    budget  pg_catalog.int8;
    n       pg_catalog.int8;
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
    budget := max_rows;
    FOR rel IN SELECT t FROM idem._purge_targets(tbl) t LOOP
        EXIT WHEN budget OPERATOR(pg_catalog.<=) 0;
        EXECUTE pg_catalog.format(
            'DELETE FROM %1$s t
              WHERE t.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
                    SELECT v.ctid FROM %1$s v
                     WHERE v.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                     ORDER BY v.expires_at
                     LIMIT $1
                       FOR UPDATE SKIP LOCKED))', rel)
            USING budget;
        GET DIAGNOSTICS n = ROW_COUNT;
        budget := budget OPERATOR(pg_catalog.-) n;
    END LOOP;
    RETURN max_rows OPERATOR(pg_catalog.-) budget OPERATOR(pg_catalog.+) idem._purge_workers(tbl,
        pg_catalog.format('SELECT idem._purge_expired(%L, %s)', tbl::pg_catalog.text, max_rows));
END;
$$;
COMMENT ON FUNCTION idem._purge_expired(pg_catalog.regclass, pg_catalog.int4) IS
    'delete expired rows of idem.tokens or idem.requests, at most max_rows on this node and on each Citus worker (internal)';
REVOKE ALL ON FUNCTION idem._purge_expired(pg_catalog.regclass, pg_catalog.int4) FROM PUBLIC;
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
        IF TG_TABLE_NAME OPERATOR(pg_catalog.=) 'initial_states' THEN
            RAISE EXCEPTION 'permission denied for table %', TG_TABLE_NAME
                USING ERRCODE = '42501',
                      DETAIL = 'Initial states are changed through idem_allow_initial and idem_disallow_initial, or by the owner of the table.',
                      HINT = 'Grant EXECUTE on idem_allow_initial and idem_disallow_initial to the role.';
        END IF;
        RAISE EXCEPTION 'permission denied for table %', TG_TABLE_NAME
            USING ERRCODE = '42501',
                  DETAIL = 'State machines are changed through idem_allow and idem_disallow, or by the owner of the table.',
                  HINT = 'Grant EXECUTE on idem_allow and idem_disallow to the role.';
    END IF;
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION idem._transitions_writer() IS
    'refuse writes to idem.transitions and idem.initial_states from roles without their owner''s rights (internal)';
REVOKE ALL ON FUNCTION idem._transitions_writer() FROM PUBLIC;
CREATE OR REPLACE TRIGGER transitions_writers
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON idem.transitions
    FOR EACH STATEMENT EXECUTE FUNCTION idem._transitions_writer();
-- ==== END transitions writers ====

-- ==== BEGIN outbox ====
-- The transactional outbox.  A message is a row of idem.outbox, written in
-- the sender's transaction and deleted when a relay acknowledges it.  The
-- columns id, aggregatetype (the topic), aggregateid (the key), type and
-- payload are those Debezium's outbox event router reads.  seq is the order
-- of sending; messages of one (topic, key) are delivered in that order.  The
-- id begins with a prefix of key_hash (a 64-bit hash of topic and key) and
-- then seq, so that the primary key keeps a key's messages together in that
-- order: the lease reads a key's oldest message there.  seq has 48 bits in
-- the id.
CREATE SEQUENCE IF NOT EXISTS idem.outbox_seq MAXVALUE 281474976710655;
COMMENT ON SEQUENCE idem.outbox_seq IS 'order of sending of outbox messages';
REVOKE ALL ON SEQUENCE idem.outbox_seq FROM PUBLIC;

-- The key_hash of idem.outbox, for the functions written in SQL and its
-- CHECK constraint.  These four compute and read nothing: every role may
-- run them, as a role that writes idem.outbox (pg_write_all_data, a grant)
-- must for the CHECK constraint (checked as the writer), and as the README
-- offers them for queries of a key's messages.
CREATE OR REPLACE FUNCTION idem._outbox_key_hash(topic pg_catalog.text, key pg_catalog.text)
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'idem_outbox_key_hash'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION idem._outbox_key_hash(pg_catalog.text, pg_catalog.text) IS
    'the key_hash of an outbox message of this topic and key';
GRANT EXECUTE ON FUNCTION idem._outbox_key_hash(pg_catalog.text, pg_catalog.text) TO PUBLIC;

-- A new id for a message of this topic, key and seq, as idem_outbox_send
-- makes it (with random bits of its own).
CREATE OR REPLACE FUNCTION idem._outbox_id(topic pg_catalog.text, key pg_catalog.text, seq pg_catalog.int8)
RETURNS pg_catalog.uuid
AS 'MODULE_PATHNAME', 'idem_outbox_id'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION idem._outbox_id(pg_catalog.text, pg_catalog.text, pg_catalog.int8) IS
    'a new id for an outbox message of this topic, key and seq';
GRANT EXECUTE ON FUNCTION idem._outbox_id(pg_catalog.text, pg_catalog.text, pg_catalog.int8) TO PUBLIC;

-- The first (or last) id a message of this topic and key can have: the ids
-- of a key's messages are between the two.
CREATE OR REPLACE FUNCTION idem._outbox_id_bound(topic pg_catalog.text, key pg_catalog.text, upper pg_catalog.bool)
RETURNS pg_catalog.uuid
AS 'MODULE_PATHNAME', 'idem_outbox_id_bound'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION idem._outbox_id_bound(pg_catalog.text, pg_catalog.text, pg_catalog.bool) IS
    'the first id (upper: the last) an outbox message of this topic and key can have';
GRANT EXECUTE ON FUNCTION idem._outbox_id_bound(pg_catalog.text, pg_catalog.text, pg_catalog.bool) TO PUBLIC;

-- Whether an id is one idem_outbox_send makes for this topic, key and seq
-- (whatever its random bits): the CHECK constraint of idem.outbox.
CREATE OR REPLACE FUNCTION idem._outbox_id_matches(id pg_catalog.uuid, topic pg_catalog.text, key pg_catalog.text,
                                                   seq pg_catalog.int8)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idem_outbox_id_matches'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION idem._outbox_id_matches(pg_catalog.uuid, pg_catalog.text, pg_catalog.text, pg_catalog.int8) IS
    'whether an outbox message''s id is one made for this topic, key and seq';
GRANT EXECUTE ON FUNCTION idem._outbox_id_matches(pg_catalog.uuid, pg_catalog.text, pg_catalog.text, pg_catalog.int8) TO PUBLIC;

CREATE TABLE IF NOT EXISTS idem.outbox (
    id              pg_catalog.uuid NOT NULL,
    aggregatetype   pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    aggregateid     pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    type            pg_catalog.text,
    payload         pg_catalog.jsonb NOT NULL,
    headers         pg_catalog.jsonb,
    seq             pg_catalog.int8 NOT NULL,
    created_at      pg_catalog.timestamptz NOT NULL,
    key_hash        pg_catalog.int8 NOT NULL,
    CONSTRAINT outbox_pkey PRIMARY KEY (id),
    -- idem_outbox_send writes rows that pass (without checking): a row
    -- written by hand whose id is not its key's would never be leased, and
    -- one whose id and seq disagree would be leased out of order
    CONSTRAINT outbox_id_of_key CHECK (
        key_hash OPERATOR(pg_catalog.=) idem._outbox_key_hash(aggregatetype, aggregateid)
        AND idem._outbox_id_matches(id, aggregatetype, aggregateid, seq))
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000,
        autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 50000);
COMMENT ON TABLE idem.outbox IS
    'transactional outbox: messages sent and not yet acknowledged (aggregatetype = topic, aggregateid = key)';
REVOKE ALL ON TABLE idem.outbox FROM PUBLIC;

-- One row per (topic, key) that has messages: the state of its head, the
-- oldest message not yet acknowledged.  Only the head of a key is ever
-- leased, so this row is the lease, the retry schedule and the dead letter
-- of the key.  Its updates change no indexed column and stay on their page
-- (HOT).
CREATE TABLE IF NOT EXISTS idem.outbox_keys (
    topic           pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    key             pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    dead            pg_catalog.bool NOT NULL,
    attempts        pg_catalog.int4 NOT NULL,
    available_at    pg_catalog.timestamptz NOT NULL,
    head_id         pg_catalog.uuid,
    leased_by       pg_catalog.text,
    last_error      pg_catalog.text,
    -- the seq of the last message of the key's last run (a lease of several
    -- consecutive messages, idem_outbox_lease's per_key): the messages up
    -- to it have been leased once, and a lease hands them out one at a time
    leased_through  pg_catalog.int8,
    -- the highest seq a lease ever handed out: a run never takes in a
    -- message up to it (one after a head whose sender committed late)
    leased_max      pg_catalog.int8,
    -- the attempts of messages that a head sent before them then came
    -- before (a sender that committed late, a run's message nacked while an
    -- earlier one was not acknowledged): pairs of seq and attempts, taken
    -- when each is the key's head again
    attempts_kept   pg_catalog.int8[],
    -- a message of the last run that a nack made dead while an earlier
    -- message of the run was still to be acknowledged: its seq and the
    -- nack's error; it is dead once it is the key's head
    dead_kept       pg_catalog.int8,
    error_kept      pg_catalog.text,
    CONSTRAINT outbox_keys_pkey PRIMARY KEY (topic, key)
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0,
        autovacuum_vacuum_threshold = 5000);
COMMENT ON TABLE idem.outbox_keys IS
    'transactional outbox: the lease, retry schedule and dead letter of each key''s oldest message';
REVOKE ALL ON TABLE idem.outbox_keys FROM PUBLIC;

-- A sender skips the look for its key's row once its session knows the row
-- exists.  Before any row of it is deleted (by idem_outbox_purge, by hand, or
-- by logical replication: ALWAYS, and a row trigger, which replication
-- fires), the deleter waits for the senders in flight and every session
-- forgets the keys it knew.
CREATE OR REPLACE FUNCTION idem._outbox_keys_deleted()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_outbox_keys_deleted'
LANGUAGE C;
COMMENT ON FUNCTION idem._outbox_keys_deleted() IS
    'before a key row of the outbox is deleted: wait for senders, and make every session forget which keys it knew to have a row';
REVOKE ALL ON FUNCTION idem._outbox_keys_deleted() FROM PUBLIC;
CREATE OR REPLACE TRIGGER outbox_keys_deleted
    BEFORE DELETE ON idem.outbox_keys
    FOR EACH ROW EXECUTE FUNCTION idem._outbox_keys_deleted();
ALTER TABLE idem.outbox_keys ENABLE ALWAYS TRIGGER outbox_keys_deleted;

-- Per-topic delivery settings; see idem_outbox_configure for the defaults.
CREATE TABLE IF NOT EXISTS idem.outbox_topics (
    topic           pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    max_attempts    pg_catalog.int4 NOT NULL,
    backoff_base    pg_catalog.interval NOT NULL,
    backoff_max     pg_catalog.interval NOT NULL,
    CONSTRAINT outbox_topics_pkey PRIMARY KEY (topic)
);
COMMENT ON TABLE idem.outbox_topics IS
    'transactional outbox: maximum attempts and backoff per topic (10, 1 second, 10 minutes without a row)';
REVOKE ALL ON TABLE idem.outbox_topics FROM PUBLIC;

SELECT pg_catalog.pg_extension_config_dump('idem.outbox', '')
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'idem'
                      AND 'idem.outbox'::pg_catalog.regclass OPERATOR(pg_catalog.=) ANY (e.extconfig));
SELECT pg_catalog.pg_extension_config_dump('idem.outbox_keys', '')
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'idem'
                      AND 'idem.outbox_keys'::pg_catalog.regclass OPERATOR(pg_catalog.=) ANY (e.extconfig));
SELECT pg_catalog.pg_extension_config_dump('idem.outbox_topics', '')
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'idem'
                      AND 'idem.outbox_topics'::pg_catalog.regclass OPERATOR(pg_catalog.=) ANY (e.extconfig));
SELECT pg_catalog.pg_extension_config_dump('idem.outbox_seq', '')
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'idem'
                      AND 'idem.outbox_seq'::pg_catalog.regclass OPERATOR(pg_catalog.=) ANY (e.extconfig));

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_type t
                    WHERE t.typname OPERATOR(pg_catalog.=) 'idem_outbox_message'
                      AND t.typnamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace
                      AND EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                                   WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
                                     AND d.objid OPERATOR(pg_catalog.=) t.oid
                                     AND d.deptype OPERATOR(pg_catalog.=) 'e'
                                     AND d.refobjid OPERATOR(pg_catalog.=)
                                         (SELECT x.oid FROM pg_catalog.pg_extension x
                                           WHERE x.extname OPERATOR(pg_catalog.=) 'idem'))) THEN
        CREATE TYPE @extschema@.idem_outbox_message AS (
            id          pg_catalog.uuid,
            topic       pg_catalog.text,
            key         pg_catalog.text,
            type        pg_catalog.text,
            payload     pg_catalog.jsonb,
            headers     pg_catalog.jsonb,
            attempt     pg_catalog.int4,
            created_at  pg_catalog.timestamptz);
    END IF;
END;
$$;
COMMENT ON TYPE idem_outbox_message IS 'a message leased by idem_outbox_lease';

CREATE OR REPLACE FUNCTION idem_outbox_send(topic pg_catalog.text, key pg_catalog.text,
                                            payload pg_catalog.jsonb,
                                            headers pg_catalog.jsonb DEFAULT NULL,
                                            type pg_catalog.text DEFAULT NULL)
RETURNS pg_catalog.uuid
AS 'MODULE_PATHNAME', 'idem_outbox_send'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_outbox_send(pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.jsonb, pg_catalog.text) IS
    'send a message in this transaction: delivered at least once if it commits, in order per (topic, key)';

CREATE OR REPLACE FUNCTION idem_outbox_lease(relay pg_catalog.text,
                                             max_messages pg_catalog.int4 DEFAULT 100,
                                             lease pg_catalog.interval DEFAULT '30 seconds',
                                             per_key pg_catalog.int4 DEFAULT 1,
                                             max_bytes pg_catalog.int8 DEFAULT NULL)
RETURNS SETOF idem_outbox_message
AS 'MODULE_PATHNAME', 'idem_outbox_lease'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 100;
COMMENT ON FUNCTION idem_outbox_lease(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.int4, pg_catalog.int8) IS
    'lease up to max_messages messages to deliver: the oldest of each key, and with per_key above 1 up to per_key consecutive messages of a key leased for the first time; none more once they weigh max_bytes';

CREATE OR REPLACE FUNCTION idem_outbox_ack(ids pg_catalog.uuid[])
RETURNS pg_catalog.int4
AS 'MODULE_PATHNAME', 'idem_outbox_ack'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_outbox_ack(pg_catalog.uuid[]) IS
    'acknowledge leased messages as delivered; returns how many were newly acknowledged';

CREATE OR REPLACE FUNCTION idem_outbox_nack(id pg_catalog.uuid, error pg_catalog.text,
                                            retry_after pg_catalog.interval DEFAULT NULL,
                                            relay pg_catalog.text DEFAULT NULL,
                                            permanent pg_catalog.bool DEFAULT false)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idem_outbox_nack'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_outbox_nack(pg_catalog.uuid, pg_catalog.text, pg_catalog.interval, pg_catalog.text, pg_catalog.bool) IS
    'report a failed delivery: retried after retry_after or a backoff, dead after the topic''s maximum attempts or at once when permanent';

CREATE OR REPLACE FUNCTION idem_outbox_configure(topic pg_catalog.text, max_attempts pg_catalog.int4,
                                                 backoff_base pg_catalog.interval,
                                                 backoff_max pg_catalog.interval)
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF topic IS NULL OR max_attempts IS NULL OR backoff_base IS NULL OR backoff_max IS NULL THEN
        RAISE EXCEPTION 'arguments of idem_outbox_configure must not be null'
            USING ERRCODE = '22004';
    END IF;
    -- as idem_outbox_send checks a topic
    IF topic OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'topic must not be empty'
            USING ERRCODE = '22023', HINT = 'Give a non-empty identifier.';
    END IF;
    IF pg_catalog.octet_length(topic) OPERATOR(pg_catalog.>) 255 THEN
        RAISE EXCEPTION 'topic is too long'
            USING ERRCODE = '22001',
                  DETAIL = pg_catalog.format('The topic is %s bytes long; the limit is 255 bytes.',
                                             pg_catalog.octet_length(topic));
    END IF;
    IF max_attempts OPERATOR(pg_catalog.<) 1 OR max_attempts OPERATOR(pg_catalog.>) 1000 THEN
        RAISE EXCEPTION 'max_attempts must be between 1 and 1000'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The value given was %s.', max_attempts);
    END IF;
    -- days and smaller units of one sign: a span must not depend on the date
    IF pg_catalog.date_part('epoch', backoff_base) OPERATOR(pg_catalog.<=) 0
       OR backoff_max OPERATOR(pg_catalog.<) backoff_base
       OR backoff_max OPERATOR(pg_catalog.>) '1 day'::pg_catalog.interval
       OR EXISTS (SELECT 1 FROM (VALUES (backoff_base), (backoff_max)) v(b),
                         (VALUES ('year'), ('month')) f(u)
                   WHERE pg_catalog.date_part(f.u, v.b) OPERATOR(pg_catalog.<>) 0)
       OR EXISTS (SELECT 1 FROM (VALUES (backoff_base), (backoff_max)) v(b),
                         (VALUES ('day'), ('hour'), ('minute'), ('second')) f(u)
                   WHERE pg_catalog.date_part(f.u, v.b) OPERATOR(pg_catalog.<) 0) THEN
        RAISE EXCEPTION 'backoff must be positive, at most one day, with backoff_base <= backoff_max'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The values given were %s and %s.', backoff_base, backoff_max);
    END IF;
    INSERT INTO idem.outbox_topics AS t (topic, max_attempts, backoff_base, backoff_max)
        VALUES (idem_outbox_configure.topic, idem_outbox_configure.max_attempts,
                idem_outbox_configure.backoff_base, idem_outbox_configure.backoff_max)
        ON CONFLICT ON CONSTRAINT outbox_topics_pkey
        DO UPDATE SET max_attempts = excluded.max_attempts,
                      backoff_base = excluded.backoff_base,
                      backoff_max = excluded.backoff_max;
END;
$$;
COMMENT ON FUNCTION idem_outbox_configure(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.interval) IS
    'set a topic''s maximum attempts (every lease counts) and the bounds of its exponential backoff';

-- The heads that are dead though no lease has marked them so yet (their
-- last lease ran out, their topic's maximum attempts were lowered, a nack of
-- their run made them dead), of a topic, a key or all: what
-- idem_outbox_stats counts them by.
CREATE OR REPLACE FUNCTION idem._outbox_dead_heads(topic pg_catalog.text, key pg_catalog.text)
RETURNS TABLE (topic pg_catalog.text, key pg_catalog.text, id pg_catalog.uuid)
AS 'MODULE_PATHNAME', 'idem_outbox_dead_heads'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem._outbox_dead_heads(pg_catalog.text, pg_catalog.text) IS
    'the heads of outbox keys that are dead though no lease has marked them so yet (internal)';
REVOKE ALL ON FUNCTION idem._outbox_dead_heads(pg_catalog.text, pg_catalog.text) FROM PUBLIC;

-- What idem_outbox_redrive does once its arguments are checked.
CREATE OR REPLACE FUNCTION idem._outbox_redrive(topic pg_catalog.text, key pg_catalog.text)
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'idem_outbox_redrive_keys'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem._outbox_redrive(pg_catalog.text, pg_catalog.text) IS
    'what idem_outbox_redrive does (internal)';
REVOKE ALL ON FUNCTION idem._outbox_redrive(pg_catalog.text, pg_catalog.text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION idem_outbox_redrive(topic pg_catalog.text DEFAULT NULL,
                                               key pg_catalog.text DEFAULT NULL)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF topic IS NULL AND key IS NOT NULL THEN
        RAISE EXCEPTION 'a key needs its topic'
            USING ERRCODE = '22004',
                  HINT = 'Give the topic with the key, or neither to redrive every dead message.';
    END IF;
    IF topic OPERATOR(pg_catalog.=) '' OR key OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION '% must not be empty', CASE WHEN topic OPERATOR(pg_catalog.=) '' THEN 'topic' ELSE 'key' END
            USING ERRCODE = '22023',
                  HINT = 'Give a non-empty identifier, or NULL for all.';
    END IF;
    -- dead messages, and the deaths no lease has written yet, back to
    -- pending, key by key in the order an ack locks them
    RETURN idem._outbox_redrive(idem_outbox_redrive.topic, idem_outbox_redrive.key);
END;
$$;
COMMENT ON FUNCTION idem_outbox_redrive(pg_catalog.text, pg_catalog.text) IS
    'put dead messages (of a topic, of a key, or all) back to pending with their attempts reset; returns how many';

CREATE OR REPLACE FUNCTION idem_outbox_stats()
RETURNS TABLE (topic pg_catalog.text, pending pg_catalog.int8, leased pg_catalog.int8,
               dead pg_catalog.int8, held_back pg_catalog.int8, oldest_pending_age pg_catalog.interval)
LANGUAGE sql VOLATILE PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT m.aggregatetype,
           pg_catalog.count(*) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'pending'),
           pg_catalog.count(*) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'leased'),
           pg_catalog.count(*) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'dead'),
           pg_catalog.count(*) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'held_back'),
           pg_catalog.now() OPERATOR(pg_catalog.-)
               pg_catalog.min(m.created_at) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'pending')
      FROM (SELECT o.aggregatetype, o.created_at,
                   CASE WHEN (k.dead AND k.head_id OPERATOR(pg_catalog.=) o.id)
                             OR d.id OPERATOR(pg_catalog.=) o.id
                             OR o.seq OPERATOR(pg_catalog.=) k.dead_kept THEN 'dead'
                        -- behind a dead message of its key: waits for its redrive
                        WHEN k.dead OR d.id IS NOT NULL
                             OR o.seq OPERATOR(pg_catalog.>) k.dead_kept THEN 'held_back'
                        -- the head, or a message of the run leased with it
                        WHEN (k.head_id OPERATOR(pg_catalog.=) o.id
                              OR (k.attempts OPERATOR(pg_catalog.=) 1
                                  AND o.seq OPERATOR(pg_catalog.<=) k.leased_through))
                             AND k.leased_by IS NOT NULL
                             AND k.available_at OPERATOR(pg_catalog.>) pg_catalog.now() THEN 'leased'
                        ELSE 'pending' END AS state
              FROM idem.outbox o
              LEFT JOIN (SELECT i.topic, i.key, i.dead, i.head_id, i.attempts, i.leased_through,
                                i.leased_by, i.available_at,
                                -- a message a nack of its run made dead, while it is there
                                -- (looked for only in the rare rows that name one)
                                CASE WHEN i.dead_kept IS NULL THEN NULL
                                     WHEN EXISTS (
                                         SELECT 1 FROM idem.outbox x
                                          WHERE x.id OPERATOR(pg_catalog.>=) idem._outbox_id_bound(i.topic, i.key, false)
                                            AND x.id OPERATOR(pg_catalog.<=) idem._outbox_id_bound(i.topic, i.key, true)
                                            AND x.aggregatetype OPERATOR(pg_catalog.=) i.topic
                                            AND x.aggregateid OPERATOR(pg_catalog.=) i.key
                                            AND x.seq OPERATOR(pg_catalog.=) i.dead_kept)
                                     THEN i.dead_kept END AS dead_kept
                           FROM idem.outbox_keys i) k
                ON k.topic OPERATOR(pg_catalog.=) o.aggregatetype
               AND k.key OPERATOR(pg_catalog.=) o.aggregateid
              -- heads dead though no lease has marked them so yet
              LEFT JOIN idem._outbox_dead_heads(NULL, NULL) d
                ON d.topic OPERATOR(pg_catalog.=) o.aggregatetype
               AND d.key OPERATOR(pg_catalog.=) o.aggregateid) m
     GROUP BY m.aggregatetype
     ORDER BY m.aggregatetype
$$;
COMMENT ON FUNCTION idem_outbox_stats() IS
    'per topic: messages pending, leased, dead and held back behind a dead one, and the age of the oldest pending one';

-- Keys whose messages were all delivered keep their row until this runs.
-- Senders hold ROW EXCLUSIVE on idem.outbox_keys until they commit; the
-- SHARE ROW EXCLUSIVE lock waits for them, so that a key row is never
-- removed under a message still being sent, and for another purge (with
-- SHARE, two purges could each wait for the other's DELETE).  It gives up at once when it cannot have the
-- lock within lock_wait, so that senders never queue behind it for long.
-- At most max_rows key rows go per call: the lock, which holds senders and
-- relays back, is held for a bounded time; call it again while it returns
-- max_rows.
-- The body is internal, for idem._maintenance (see idem._purge_claims).
CREATE OR REPLACE FUNCTION idem._outbox_purge(lock_wait pg_catalog.interval, max_rows pg_catalog.int4)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n pg_catalog.int8 := 0;
    old_timeout pg_catalog.text := pg_catalog.current_setting('lock_timeout');
    wait_ms pg_catalog.numeric;
BEGIN
    IF lock_wait IS NULL THEN
        RAISE EXCEPTION 'lock_wait must not be null'
            USING ERRCODE = '22004',
                  HINT = 'Give how long to wait for senders in flight, ''0'' not to wait.';
    END IF;
    -- judged in the milliseconds the wait will last (an interval's
    -- comparison counts a month as 30 days, its epoch as 30.4375)
    wait_ms := pg_catalog.ceil(pg_catalog.date_part('epoch', lock_wait)::pg_catalog.numeric
                               OPERATOR(pg_catalog.*) 1000);
    IF pg_catalog.date_part('epoch', lock_wait) OPERATOR(pg_catalog.<) 0
       OR wait_ms OPERATOR(pg_catalog.>) 60000 THEN
        RAISE EXCEPTION 'lock_wait must be between 0 and 1 minute'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('lock_wait was %s, %s seconds.', lock_wait,
                                             pg_catalog.date_part('epoch', lock_wait));
    END IF;
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
    -- the deletion's snapshot must be taken after the lock (READ UNCOMMITTED
    -- is READ COMMITTED in PostgreSQL)
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) ALL
       (ARRAY['read committed', 'read uncommitted']) THEN
        RAISE EXCEPTION 'idem_outbox_purge must run at the READ COMMITTED isolation level'
            USING ERRCODE = '25001';
    END IF;
    BEGIN
        -- a lock_timeout of 0 would wait for ever: 0 is NOWAIT, and a wait
        -- shorter than a millisecond is one millisecond
        IF wait_ms OPERATOR(pg_catalog.=) 0 THEN
            LOCK TABLE idem.outbox_keys IN SHARE ROW EXCLUSIVE MODE NOWAIT;
        ELSE
            PERFORM pg_catalog.set_config('lock_timeout',
                wait_ms::pg_catalog.int8::pg_catalog.text OPERATOR(pg_catalog.||) 'ms', true);
            LOCK TABLE idem.outbox_keys IN SHARE ROW EXCLUSIVE MODE;
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        RETURN 0;
    END;
    PERFORM pg_catalog.set_config('lock_timeout', old_timeout, true);
    -- the lock keeps every other session from changing the rows: the
    -- versions the subquery picks are the ones deleted
    DELETE FROM idem.outbox_keys k
     WHERE k.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
            SELECT i.ctid FROM idem.outbox_keys i
             WHERE NOT i.dead
               AND NOT EXISTS (SELECT 1 FROM idem.outbox o
                                WHERE o.id OPERATOR(pg_catalog.>=) idem._outbox_id_bound(i.topic, i.key, false)
                                  AND o.id OPERATOR(pg_catalog.<=) idem._outbox_id_bound(i.topic, i.key, true)
                                  AND o.aggregatetype OPERATOR(pg_catalog.=) i.topic
                                  AND o.aggregateid OPERATOR(pg_catalog.=) i.key)
             LIMIT max_rows));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;
COMMENT ON FUNCTION idem._outbox_purge(pg_catalog.interval, pg_catalog.int4) IS
    'what idem_outbox_purge does (internal)';
REVOKE ALL ON FUNCTION idem._outbox_purge(pg_catalog.interval, pg_catalog.int4) FROM PUBLIC;

CREATE OR REPLACE FUNCTION idem_outbox_purge(lock_wait pg_catalog.interval DEFAULT '1 second',
                                             max_rows pg_catalog.int4 DEFAULT 10000)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN idem._outbox_purge(lock_wait, max_rows);
END;
$$;
COMMENT ON FUNCTION idem_outbox_purge(pg_catalog.interval, pg_catalog.int4) IS
    'remove the rows of keys whose messages were all delivered, at most max_rows per call; gives up (returns 0) when senders hold the table longer than lock_wait';

REVOKE ALL ON FUNCTION idem_outbox_lease(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.int4, pg_catalog.int8) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_outbox_ack(pg_catalog.uuid[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_outbox_nack(pg_catalog.uuid, pg_catalog.text, pg_catalog.interval, pg_catalog.text, pg_catalog.bool) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_outbox_configure(pg_catalog.text, pg_catalog.int4, pg_catalog.interval, pg_catalog.interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_outbox_redrive(pg_catalog.text, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_outbox_stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_outbox_purge(pg_catalog.interval, pg_catalog.int4) FROM PUBLIC;
-- ==== END outbox ====

-- ==== BEGIN statistics ====
-- Counters of every capability's outcomes, in shared memory: they need idem
-- in shared_preload_libraries, and these functions fail with 55000 without.
CREATE OR REPLACE FUNCTION idem_stats_rows(
    OUT ns pg_catalog.text, OUT kind pg_catalog.text, OUT operations pg_catalog.int8,
    OUT duplicates pg_catalog.int8, OUT duplicate_rate pg_catalog.float8,
    OUT counters pg_catalog.jsonb, OUT stats_reset pg_catalog.timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats_rows'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION idem_stats_rows() IS
    'the rows of the view idem_stats: committed outcomes per namespace and kind, from shared memory';

CREATE OR REPLACE VIEW idem_stats AS
    SELECT s.ns, s.kind, s.operations, s.duplicates, s.duplicate_rate, s.counters, s.stats_reset
      FROM @extschema@.idem_stats_rows() s;
COMMENT ON VIEW idem_stats IS
    'committed outcomes per namespace and kind (claim, token, transition, request, outbox) since the last reset';

CREATE OR REPLACE FUNCTION idem_stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_stats_reset() IS
    'set every counter of idem_stats back to zero';

CREATE OR REPLACE FUNCTION idem_metrics()
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idem_metrics'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION idem_metrics() IS
    'the counters of idem_stats in the Prometheus text exposition format';

REVOKE ALL ON FUNCTION idem_stats_rows() FROM PUBLIC;
REVOKE ALL ON idem_stats FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_stats_reset() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_metrics() FROM PUBLIC;
-- monitoring roles read the counters
GRANT EXECUTE ON FUNCTION idem_stats_rows() TO pg_monitor;
GRANT SELECT ON idem_stats TO pg_monitor;
GRANT EXECUTE ON FUNCTION idem_metrics() TO pg_monitor;
-- ==== END statistics ====

-- ==== BEGIN maintenance ====
-- One round of the purges of every capability, each of at most max_rows
-- rows; what the maintenance worker runs (as a superuser: the body, and all
-- it calls, are in the schema idem, see idem._purge_claims), and what
-- pg_cron can schedule (idem_maintenance).  It runs as the extension's
-- owner, whoever calls it: the purges on Citus workers connect as that role.
CREATE OR REPLACE FUNCTION idem._maintenance(max_rows pg_catalog.int4)
RETURNS TABLE (kind pg_catalog.text, purged pg_catalog.int8)
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF max_rows IS NULL THEN
        RAISE EXCEPTION 'max_rows must not be null'
            USING ERRCODE = '22004',
                  HINT = 'Give the largest number of rows of each kind the round may purge.';
    END IF;
    IF max_rows OPERATOR(pg_catalog.<) 1 OR max_rows OPERATOR(pg_catalog.>) 1000000 THEN
        RAISE EXCEPTION 'max_rows must be between 1 and 1000000'
            USING ERRCODE = '22023';
    END IF;
    FOREACH kind IN ARRAY ARRAY['claims', 'tokens', 'requests'] LOOP
        BEGIN
            purged := CASE kind
                WHEN 'claims' THEN idem._purge_claims(NULL, max_rows)
                WHEN 'tokens' THEN idem._purge_expired('idem.tokens', max_rows)
                ELSE idem._purge_expired('idem.requests', max_rows) END;
        EXCEPTION WHEN serialization_failure THEN
            -- at REPEATABLE READ or SERIALIZABLE, a row changed since the
            -- snapshot cannot be locked: this kind waits for the next round,
            -- the others are purged
            RAISE NOTICE 'expired % are not purged: a row changed since the snapshot of this % transaction',
                kind, pg_catalog.upper(pg_catalog.current_setting('transaction_isolation'))
                USING HINT = 'Run idem_maintenance() at READ COMMITTED.';
            purged := 0;
        END;
        RETURN NEXT;
    END LOOP;
    -- idle keys of the outbox, only when no sender is in flight; that purge
    -- needs READ COMMITTED, and the others must not fail for its sake
    kind := 'outbox_keys';
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=)
           ANY (ARRAY['read committed', 'read uncommitted']) THEN
        purged := idem._outbox_purge('0'::pg_catalog.interval, max_rows);
    ELSE
        RAISE NOTICE 'idle outbox keys are not purged at the % isolation level',
            pg_catalog.upper(pg_catalog.current_setting('transaction_isolation'))
            USING HINT = 'Run idem_maintenance() at READ COMMITTED.';
        purged := 0;
    END IF;
    RETURN NEXT;
END;
$$;
COMMENT ON FUNCTION idem._maintenance(pg_catalog.int4) IS
    'what idem_maintenance does, and what the maintenance worker runs (internal)';
REVOKE ALL ON FUNCTION idem._maintenance(pg_catalog.int4) FROM PUBLIC;

CREATE OR REPLACE FUNCTION idem_maintenance(max_rows pg_catalog.int4 DEFAULT 10000)
RETURNS TABLE (kind pg_catalog.text, purged pg_catalog.int8)
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT m.kind, m.purged FROM idem._maintenance(max_rows) m;
END;
$$;
COMMENT ON FUNCTION idem_maintenance(pg_catalog.int4) IS
    'one round of every purge (expired claims, tokens and requests, idle outbox keys), at most max_rows of each';
REVOKE ALL ON FUNCTION idem_maintenance(pg_catalog.int4) FROM PUBLIC;
-- ==== END maintenance ====

-- ==== BEGIN ordered streams ====
-- Consumer offsets: one row per (consumer, stream, partition), the offset of
-- the last message applied.  Advances are HOT updates (no indexed column
-- changes); the fillfactor leaves them room on the page.
CREATE TABLE IF NOT EXISTS idem.offsets (
    consumer    pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    stream      pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    part        pg_catalog.int4 NOT NULL,
    "offset"    pg_catalog.int8 NOT NULL,
    updated_at  pg_catalog.timestamptz NOT NULL,
    CONSTRAINT offsets_pkey PRIMARY KEY (consumer, stream, part)
) WITH (fillfactor = 50);
COMMENT ON TABLE idem.offsets IS
    'ordered streams: the offset of the last message each consumer applied, per stream and partition';
REVOKE ALL ON TABLE idem.offsets FROM PUBLIC;

-- Producer sequences: one row per producer, the highest number accepted and
-- a bitmap of the last "window" numbers (bit i for high - i), of a fixed
-- length: the row's size never grows.
CREATE TABLE IF NOT EXISTS idem.producer_seqs (
    producer    pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    "window"    pg_catalog.int4 NOT NULL,
    high        pg_catalog.int8 NOT NULL,
    seen        pg_catalog.bytea NOT NULL,
    updated_at  pg_catalog.timestamptz NOT NULL,
    CONSTRAINT producer_seqs_pkey PRIMARY KEY (producer)
) WITH (fillfactor = 50);
COMMENT ON TABLE idem.producer_seqs IS
    'ordered streams: the high-water mark and the bitmap of the last window numbers of each producer';
REVOKE ALL ON TABLE idem.producer_seqs FROM PUBLIC;

SELECT pg_catalog.pg_extension_config_dump('idem.offsets', '')
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'idem'
                      AND 'idem.offsets'::pg_catalog.regclass OPERATOR(pg_catalog.=) ANY (e.extconfig));
SELECT pg_catalog.pg_extension_config_dump('idem.producer_seqs', '')
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'idem'
                      AND 'idem.producer_seqs'::pg_catalog.regclass OPERATOR(pg_catalog.=) ANY (e.extconfig));

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_type t
                    WHERE t.typname OPERATOR(pg_catalog.=) 'idem_seq_result'
                      AND t.typnamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace
                      AND EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                                   WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
                                     AND d.objid OPERATOR(pg_catalog.=) t.oid
                                     AND d.deptype OPERATOR(pg_catalog.=) 'e'
                                     AND d.refobjid OPERATOR(pg_catalog.=)
                                         (SELECT x.oid FROM pg_catalog.pg_extension x
                                           WHERE x.extname OPERATOR(pg_catalog.=) 'idem'))) THEN
        CREATE TYPE @extschema@.idem_seq_result AS ENUM ('accepted', 'duplicate', 'too_old');
    END IF;
END;
$$;
COMMENT ON TYPE idem_seq_result IS 'the answer of idem_seq_accept';

CREATE OR REPLACE FUNCTION idem_offset_advance(consumer pg_catalog.text, stream pg_catalog.text,
                                               part pg_catalog.int4, "offset" pg_catalog.int8)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idem_offset_advance'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_offset_advance(pg_catalog.text, pg_catalog.text, pg_catalog.int4, pg_catalog.int8) IS
    'true, and the offset stored, when it is beyond the stored one (apply the message); false at or below it (a replay)';

CREATE OR REPLACE FUNCTION idem_offset_get(consumer pg_catalog.text, stream pg_catalog.text,
                                           part pg_catalog.int4)
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'idem_offset_get'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL SAFE;
COMMENT ON FUNCTION idem_offset_get(pg_catalog.text, pg_catalog.text, pg_catalog.int4) IS
    'the offset of the last message applied (where to resume is the next one); NULL when none';

-- Moves an offset on purpose (backwards to reprocess, forwards to skip), or
-- forgets it with a NULL offset.  Returns the offset it replaced.
CREATE OR REPLACE FUNCTION idem_offset_reset(consumer pg_catalog.text, stream pg_catalog.text,
                                             part pg_catalog.int4, "offset" pg_catalog.int8)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    prev pg_catalog.int8;
BEGIN
    IF idem_offset_reset.consumer IS NULL THEN
        RAISE EXCEPTION 'consumer must not be null' USING ERRCODE = '22004';
    END IF;
    IF idem_offset_reset.stream IS NULL THEN
        RAISE EXCEPTION 'stream must not be null' USING ERRCODE = '22004';
    END IF;
    IF idem_offset_reset.part IS NULL THEN
        RAISE EXCEPTION 'part must not be null' USING ERRCODE = '22004';
    END IF;
    IF idem_offset_reset.consumer OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'consumer must not be empty' USING ERRCODE = '22023';
    END IF;
    IF idem_offset_reset.stream OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'stream must not be empty' USING ERRCODE = '22023';
    END IF;
    IF pg_catalog.octet_length(idem_offset_reset.consumer) OPERATOR(pg_catalog.>) 512 THEN
        RAISE EXCEPTION 'consumer is too long' USING ERRCODE = '22001';
    END IF;
    IF pg_catalog.octet_length(idem_offset_reset.stream) OPERATOR(pg_catalog.>) 512 THEN
        RAISE EXCEPTION 'stream is too long' USING ERRCODE = '22001';
    END IF;
    IF idem_offset_reset.part OPERATOR(pg_catalog.<) 0 THEN
        RAISE EXCEPTION 'part must not be negative' USING ERRCODE = '22023';
    END IF;
    IF idem_offset_reset."offset" OPERATOR(pg_catalog.<) 0 THEN
        RAISE EXCEPTION 'offset must not be negative' USING ERRCODE = '22023';
    END IF;
    -- The row as it stands, locked; when there is none, an insertion that
    -- conflicts waits for a row another transaction is inserting, and the
    -- row is then read again (reading first would miss that row: the
    -- reset would return NULL and overwrite it, or forget nothing).
    LOOP
        SELECT o."offset" INTO prev FROM idem.offsets o
         WHERE o.consumer OPERATOR(pg_catalog.=) idem_offset_reset.consumer
           AND o.stream OPERATOR(pg_catalog.=) idem_offset_reset.stream
           AND o.part OPERATOR(pg_catalog.=) idem_offset_reset.part
           FOR UPDATE;
        IF FOUND THEN
            IF idem_offset_reset."offset" IS NULL THEN
                DELETE FROM idem.offsets o
                 WHERE o.consumer OPERATOR(pg_catalog.=) idem_offset_reset.consumer
                   AND o.stream OPERATOR(pg_catalog.=) idem_offset_reset.stream
                   AND o.part OPERATOR(pg_catalog.=) idem_offset_reset.part;
            ELSE
                UPDATE idem.offsets o
                   SET "offset" = idem_offset_reset."offset", updated_at = pg_catalog.now()
                 WHERE o.consumer OPERATOR(pg_catalog.=) idem_offset_reset.consumer
                   AND o.stream OPERATOR(pg_catalog.=) idem_offset_reset.stream
                   AND o.part OPERATOR(pg_catalog.=) idem_offset_reset.part;
            END IF;
            RETURN prev;
        END IF;
        INSERT INTO idem.offsets AS o (consumer, stream, part, "offset", updated_at)
        VALUES (idem_offset_reset.consumer, idem_offset_reset.stream, idem_offset_reset.part,
                COALESCE(idem_offset_reset."offset", 0), pg_catalog.now())
        ON CONFLICT (consumer, stream, part) DO NOTHING;
        IF FOUND THEN
            -- there was none: forgetting leaves none
            IF idem_offset_reset."offset" IS NULL THEN
                DELETE FROM idem.offsets o
                 WHERE o.consumer OPERATOR(pg_catalog.=) idem_offset_reset.consumer
                   AND o.stream OPERATOR(pg_catalog.=) idem_offset_reset.stream
                   AND o.part OPERATOR(pg_catalog.=) idem_offset_reset.part;
            END IF;
            RETURN NULL;
        END IF;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION idem_offset_reset(pg_catalog.text, pg_catalog.text, pg_catalog.int4, pg_catalog.int8) IS
    'set the stored offset of a partition (forget it with NULL); returns the offset it replaced';
REVOKE ALL ON FUNCTION idem_offset_reset(pg_catalog.text, pg_catalog.text, pg_catalog.int4, pg_catalog.int8) FROM PUBLIC;

CREATE OR REPLACE VIEW idem_offsets AS
    SELECT o.consumer, o.stream, o.part, o."offset", o.updated_at
      FROM idem.offsets o;
COMMENT ON VIEW idem_offsets IS
    'the offset of the last message each consumer applied, per stream and partition';
REVOKE ALL ON idem_offsets FROM PUBLIC;
GRANT SELECT ON idem_offsets TO pg_monitor;

CREATE OR REPLACE FUNCTION idem_seq_accept(producer pg_catalog.text, seq pg_catalog.int8,
                                           "window" pg_catalog.int4 DEFAULT 64)
RETURNS idem_seq_result
AS 'MODULE_PATHNAME', 'idem_seq_accept'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_seq_accept(pg_catalog.text, pg_catalog.int8, pg_catalog.int4) IS
    'accepted once per sequence number of a producer; duplicate after; too_old below its window (1 to 1024 numbers)';
-- ==== END ordered streams ====

-- ==== BEGIN claims storage ====
-- Expired claims are deleted in batches (idem_purge, the maintenance
-- worker), oldest first.  autovacuum must follow those deletes closely: the
-- dead index entries they leave at the old end of claims_ns_claimed_at_idx
-- are read again by every later purge until a VACUUM removes them, and the
-- space of the deleted rows is reused only once vacuumed.  PostgreSQL's
-- default waits for 20% of a table to be dead, which on a table of 100M
-- claims is 20M rows; 2% is 2M.  Claims are never updated: the fillfactor
-- stays 100.
ALTER TABLE idem.claims SET (autovacuum_vacuum_scale_factor = 0.02);
-- ==== END claims storage ====

-- ==== BEGIN guard for real schemas ====
-- State names are limited to 63 bytes, as machine names are: idem_allow and
-- idem_disallow say so.  idem.transitions itself does not refuse a longer
-- one: 0.1.0 took them, the guard works with states of any length, and a
-- check on the table would make the dump of such a database fail to
-- restore (the restore's COPY of the table is checked).
CREATE OR REPLACE FUNCTION idem._check_transition(machine pg_catalog.text,
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
    IF pg_catalog.octet_length(from_state) OPERATOR(pg_catalog.>) 63 THEN
        RAISE EXCEPTION 'from_state is too long'
            USING ERRCODE = '22001',
                  DETAIL = pg_catalog.format('The state is %s bytes long; the limit is 63 bytes.',
                                             pg_catalog.octet_length(from_state));
    END IF;
    IF pg_catalog.octet_length(to_state) OPERATOR(pg_catalog.>) 63 THEN
        RAISE EXCEPTION 'to_state is too long'
            USING ERRCODE = '22001',
                  DETAIL = pg_catalog.format('The state is %s bytes long; the limit is 63 bytes.',
                                             pg_catalog.octet_length(to_state));
    END IF;
END;
$$;
COMMENT ON FUNCTION idem._check_transition(pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
    'check the arguments of idem_allow and idem_disallow';
REVOKE ALL ON FUNCTION idem._check_transition(pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;


-- Initial states: when a machine has any, a new row of a table it guards
-- (INSERT, COPY) must start in one of them.
CREATE TABLE IF NOT EXISTS idem.initial_states (
    machine     pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    state       pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    CONSTRAINT initial_states_pkey PRIMARY KEY (machine, state),
    CONSTRAINT initial_states_machine_check
        CHECK (pg_catalog.octet_length(machine) OPERATOR(pg_catalog.>=) 1
               AND pg_catalog.octet_length(machine) OPERATOR(pg_catalog.<=) 63),
    CONSTRAINT initial_states_state_check
        CHECK (pg_catalog.octet_length(state) OPERATOR(pg_catalog.<=) 63)
);
COMMENT ON TABLE idem.initial_states IS
    'state machines: the states a new row may start in, one row each (none: any state)';
REVOKE ALL ON TABLE idem.initial_states FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('idem.initial_states', '')
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension e
                   WHERE e.extname OPERATOR(pg_catalog.=) 'idem'
                     AND 'idem.initial_states'::pg_catalog.regclass OPERATOR(pg_catalog.=) ANY (e.extconfig));
CREATE OR REPLACE TRIGGER initial_states_changed
    AFTER INSERT OR UPDATE OR DELETE ON idem.initial_states
    FOR EACH ROW EXECUTE FUNCTION idem._transitions_changed();
CREATE OR REPLACE TRIGGER initial_states_truncated
    AFTER TRUNCATE ON idem.initial_states
    FOR EACH STATEMENT EXECUTE FUNCTION idem._transitions_changed();
ALTER TABLE idem.initial_states ENABLE ALWAYS TRIGGER initial_states_changed;
ALTER TABLE idem.initial_states ENABLE ALWAYS TRIGGER initial_states_truncated;
CREATE OR REPLACE TRIGGER initial_states_writers
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON idem.initial_states
    FOR EACH STATEMENT EXECUTE FUNCTION idem._transitions_writer();

CREATE OR REPLACE FUNCTION idem._check_initial(machine pg_catalog.text,
                                               state pg_catalog.text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE CALLED ON NULL INPUT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF machine IS NULL THEN
        RAISE EXCEPTION 'machine must not be null' USING ERRCODE = '22004';
    END IF;
    IF state IS NULL THEN
        RAISE EXCEPTION 'state must not be null' USING ERRCODE = '22004';
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
    IF pg_catalog.octet_length(state) OPERATOR(pg_catalog.>) 63 THEN
        RAISE EXCEPTION 'state is too long'
            USING ERRCODE = '22001',
                  DETAIL = pg_catalog.format('The state is %s bytes long; the limit is 63 bytes.',
                                             pg_catalog.octet_length(state));
    END IF;
END;
$$;
COMMENT ON FUNCTION idem._check_initial(pg_catalog.text, pg_catalog.text) IS
    'check the arguments of idem_allow_initial and idem_disallow_initial';
REVOKE ALL ON FUNCTION idem._check_initial(pg_catalog.text, pg_catalog.text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION idem_allow_initial(machine pg_catalog.text, state pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n pg_catalog.int8;
BEGIN
    PERFORM idem._check_initial(machine, state);
    INSERT INTO idem.initial_states AS i (machine, state)
        VALUES (idem_allow_initial.machine, idem_allow_initial.state)
        ON CONFLICT ON CONSTRAINT initial_states_pkey DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n OPERATOR(pg_catalog.>) 0;
END;
$$;
COMMENT ON FUNCTION idem_allow_initial(pg_catalog.text, pg_catalog.text) IS
    'let new rows of a state machine start in a state: true if they could not yet';
REVOKE ALL ON FUNCTION idem_allow_initial(pg_catalog.text, pg_catalog.text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION idem_disallow_initial(machine pg_catalog.text, state pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n pg_catalog.int8;
BEGIN
    PERFORM idem._check_initial(machine, state);
    DELETE FROM idem.initial_states i
     WHERE i.machine OPERATOR(pg_catalog.=) idem_disallow_initial.machine
       AND i.state OPERATOR(pg_catalog.=) idem_disallow_initial.state;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n OPERATOR(pg_catalog.>) 0;
END;
$$;
COMMENT ON FUNCTION idem_disallow_initial(pg_catalog.text, pg_catalog.text) IS
    'no longer let new rows of a state machine start in a state: true if they could';
REVOKE ALL ON FUNCTION idem_disallow_initial(pg_catalog.text, pg_catalog.text) FROM PUBLIC;

-- Composite primary keys, and partitioned tables found through the parent.
CREATE OR REPLACE FUNCTION idem_transition(tbl pg_catalog.regclass, key pg_catalog.text[],
                                           to_state pg_catalog.text,
                                           expected_version pg_catalog.int8 DEFAULT NULL)
RETURNS idem_transition_result
AS 'MODULE_PATHNAME', 'idem_transition_keys'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_transition(pg_catalog.regclass, pg_catalog.text[], pg_catalog.text, pg_catalog.int8) IS
    'move a row of a guarded table, found by the values of its primary key in order, to a state: applied, already, stale, illegal or not_found';

-- Every machine: its initial states (empty: a row may start in any state)
-- and its transitions, as {"from": ["to", ...], ...}.
CREATE OR REPLACE VIEW idem_machines AS
    SELECT m.machine,
           COALESCE((SELECT pg_catalog.array_agg(i.state ORDER BY i.state)
                       FROM idem.initial_states i
                      WHERE i.machine OPERATOR(pg_catalog.=) m.machine),
                    '{}'::pg_catalog.text[]) AS initial_states,
           COALESCE((SELECT pg_catalog.jsonb_object_agg(f.from_state, f.targets)
                       FROM (SELECT t.from_state,
                                    pg_catalog.jsonb_agg(t.to_state ORDER BY t.to_state) AS targets
                               FROM idem.transitions t
                              WHERE t.machine OPERATOR(pg_catalog.=) m.machine
                              GROUP BY t.from_state) f),
                    '{}'::pg_catalog.jsonb) AS transitions
      FROM (SELECT t.machine FROM idem.transitions t
            UNION
            SELECT i.machine FROM idem.initial_states i) m;
COMMENT ON VIEW idem_machines IS
    'every state machine: its initial states and its transitions';
REVOKE ALL ON idem_machines FROM PUBLIC;
GRANT SELECT ON idem_machines TO pg_monitor;

-- Why a guard fails where it fires, NULL if it works: the update below
-- warns of the guards it keeps that this version refuses.
CREATE OR REPLACE FUNCTION idem._guard_problem(tgoid pg_catalog.oid)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idem_guard_problem'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION idem._guard_problem(pg_catalog.oid) IS
    'why the guard of a trigger fails where it fires, or NULL (internal)';
REVOKE ALL ON FUNCTION idem._guard_problem(pg_catalog.oid) FROM PUBLIC;

-- Guards made by 0.1.0 are BEFORE UPDATE triggers: they would check no
-- INSERT once their machine has initial states.  Each becomes what
-- idem_guard makes now, with its name, arguments, and whether it is enabled
-- and its comment (on the table and on each partition, for a trigger cloned
-- on partitions); a second run finds none left.  The check of guard DDL lets
-- idem's scripts remake them even where it would refuse a new guard.  One
-- made by hand with a WHEN condition or for some columns only is left as it
-- is (it cannot be an INSERT trigger, and idem refuses it where it fires),
-- and so is one on a temporary table of another session, which no session
-- but its own can alter (it goes with that session).  Then it warns of the
-- guards it keeps that this version refuses where they fire.
DO $$
DECLARE
    g record;
    s record;
BEGIN
    -- guards this update leaves as they are, that fail where they fire and
    -- that a restore of a dump refuses (as CREATE TRIGGER refuses them now)
    FOR g IN
        SELECT t.tgname, t.tgrelid::pg_catalog.regclass AS tbl,
               c.relpersistence OPERATOR(pg_catalog.=) 't'
               AND c.relnamespace OPERATOR(pg_catalog.<>) pg_catalog.pg_my_temp_schema() AS other_session
          FROM pg_catalog.pg_trigger t
          JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.tgrelid
         WHERE t.tgfoid OPERATOR(pg_catalog.=) '@extschema@.idem_guard_trigger()'::pg_catalog.regprocedure
           AND t.tgparentid OPERATOR(pg_catalog.=) 0
           AND (t.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&) 4) OPERATOR(pg_catalog.=) 0
           AND (t.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.<>) 19    -- BEFORE UPDATE FOR EACH ROW
                OR t.tgqual IS NOT NULL
                OR pg_catalog.cardinality(t.tgattr::pg_catalog.int2[]) OPERATOR(pg_catalog.>) 0
                OR c.relpersistence OPERATOR(pg_catalog.=) 't'
                   AND c.relnamespace OPERATOR(pg_catalog.<>) pg_catalog.pg_my_temp_schema())
         ORDER BY t.tgrelid, t.tgname
    LOOP
        IF g.other_session THEN
            RAISE WARNING 'guard "%" of table % is left as it is', g.tgname, g.tbl
                USING DETAIL = 'It guards a temporary table of another session, which only that session can alter; the table goes with its session, and until then its guard checks its UPDATEs only, as before.';
        ELSE
            RAISE WARNING 'guard "%" of table % is left as it is', g.tgname, g.tbl
                USING DETAIL = 'It is not BEFORE UPDATE FOR EACH ROW, or has a WHEN condition or a column list: it fails where it fires (39P01), and a restore of a dump refuses it.',
                      HINT = 'Drop it and guard the table with idem_guard().';
        END IF;
    END LOOP;
    FOR g IN
        SELECT t.tgname, t.tgrelid::pg_catalog.regclass AS tbl,
               pg_catalog.pg_get_triggerdef(t.oid) AS def,
               (SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(p.relid::pg_catalog.regclass::pg_catalog.text,
                                                                         k.tgenabled::pg_catalog.text,
                                                                         pg_catalog.obj_description(k.oid, 'pg_trigger'))
                                            ORDER BY p.level, p.relid)
                  FROM (SELECT t.tgrelid AS relid, 0 AS level
                        UNION ALL
                        SELECT r.relid, r.level FROM pg_catalog.pg_partition_tree(t.tgrelid) r
                         WHERE r.level OPERATOR(pg_catalog.>) 0) p
                  JOIN pg_catalog.pg_trigger k ON k.tgrelid OPERATOR(pg_catalog.=) p.relid
                                              AND k.tgname OPERATOR(pg_catalog.=) t.tgname) AS states
          FROM pg_catalog.pg_trigger t
          JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.tgrelid
         WHERE t.tgfoid OPERATOR(pg_catalog.=) '@extschema@.idem_guard_trigger()'::pg_catalog.regprocedure
           AND (t.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&) 4) OPERATOR(pg_catalog.=) 0
           AND t.tgparentid OPERATOR(pg_catalog.=) 0
           AND t.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.=) 19
           AND t.tgqual IS NULL
           AND pg_catalog.cardinality(t.tgattr::pg_catalog.int2[]) OPERATOR(pg_catalog.=) 0
           AND NOT (c.relpersistence OPERATOR(pg_catalog.=) 't'
                    AND c.relnamespace OPERATOR(pg_catalog.<>) pg_catalog.pg_my_temp_schema())
    LOOP
        EXECUTE pg_catalog.format('DROP TRIGGER %I ON %s', g.tgname, g.tbl);
        EXECUTE pg_catalog.regexp_replace(g.def,
                    '^(CREATE TRIGGER ("([^"]|"")*"|[^ ]+)) BEFORE UPDATE ON ',
                    -- E'': a backslash whatever standard_conforming_strings says
                    E'\\1 BEFORE INSERT OR UPDATE ON ');
        -- the table first: its ALTER reaches its partitions
        FOR s IN SELECT e OPERATOR(pg_catalog.->>) 0 AS rel, e OPERATOR(pg_catalog.->>) 1 AS enabled,
                        e OPERATOR(pg_catalog.->>) 2 AS note
                   FROM pg_catalog.jsonb_array_elements(g.states) WITH ORDINALITY AS a(e, n)
                  ORDER BY a.n
        LOOP
            EXECUTE pg_catalog.format('ALTER TABLE %s %s TRIGGER %I', s.rel,
                        CASE s.enabled WHEN 'D' THEN 'DISABLE' WHEN 'R' THEN 'ENABLE REPLICA'
                                       WHEN 'A' THEN 'ENABLE ALWAYS' ELSE 'ENABLE' END,
                        g.tgname);
            IF s.note IS NOT NULL THEN
                EXECUTE pg_catalog.format('COMMENT ON TRIGGER %I ON %s IS %L', g.tgname, s.rel, s.note);
            END IF;
        END LOOP;
    END LOOP;
    -- the other guards this version refuses where they fire (0.1.0 checked
    -- no DDL: a version column that lost its NOT NULL, or that is in a key;
    -- a generated column; a guard made by hand for INSERT too but of another
    -- shape), also on a partition: every guard with INSERT among its events,
    -- the guards without it having been remade or warned of above
    FOR g IN
        SELECT t.tgname, t.tgrelid::pg_catalog.regclass AS tbl, idem._guard_problem(t.oid) AS problem
          FROM pg_catalog.pg_trigger t
          JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.tgrelid
         WHERE t.tgfoid OPERATOR(pg_catalog.=) '@extschema@.idem_guard_trigger()'::pg_catalog.regprocedure
           AND (t.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&) 4) OPERATOR(pg_catalog.<>) 0
           AND NOT (c.relpersistence OPERATOR(pg_catalog.=) 't'
                    AND c.relnamespace OPERATOR(pg_catalog.<>) pg_catalog.pg_my_temp_schema())
         ORDER BY t.tgrelid, t.tgname
    LOOP
        IF g.problem IS NOT NULL THEN
            RAISE WARNING 'guard "%" of table % fails where it fires: %', g.tgname, g.tbl, g.problem
                USING DETAIL = 'While it is enabled, every statement it fires for fails with the error above, and a restore of a dump refuses it.',
                      HINT = 'Change the table as the error says, or remove the guard with idem_unguard().';
        END IF;
    END LOOP;
END;
$$;
-- ==== END guard for real schemas ====

-- ==== BEGIN scale-out on Citus ====
-- idem_distribute(): on a Citus coordinator, distributes idem's keyed tables
-- and routes the calls of their functions to the node of the key.  The C
-- code finds a distributed table in pg_dist_partition and then goes through
-- SQL, which Citus routes; nothing changes for a table left alone.
CREATE OR REPLACE FUNCTION idem_distribute()
RETURNS SETOF pg_catalog.text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
    f record;
    w record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'Citus is not installed in this database'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Run CREATE EXTENSION citus on the coordinator first.';
    END IF;
    IF NOT pg_catalog.citus_is_coordinator() THEN
        RAISE EXCEPTION 'idem_distribute() must run on the Citus coordinator'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'This node is a worker.';
    END IF;
    -- the functions that read a table distributed below go through Citus,
    -- which runs no statement in parallel mode: no parallel plan may call
    -- them (a parallel query over a local table, force_parallel_mode), on
    -- any node.  Each node has them from its own CREATE EXTENSION (Citus
    -- makes no function of an extension anew, also on a node added later).
    -- The change of one Citus distributed (on a run after the first) is
    -- made here, always, and Citus passes it on to every worker (it refuses
    -- it on a worker); the others are changed here and on each worker.
    -- First, the distributed ones: Citus refuses to change a distributed
    -- function in a transaction that ran a parallel command.
    FOR f IN SELECT p.oid::pg_catalog.regprocedure::pg_catalog.text AS sig, p.proparallel,
                    EXISTS (SELECT 1 FROM pg_catalog.pg_dist_object o
                             WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                               AND o.objid OPERATOR(pg_catalog.=) p.oid) AS distributed
               FROM pg_catalog.pg_proc p
               JOIN pg_catalog.pg_depend d
                 ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                AND d.objid OPERATOR(pg_catalog.=) p.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'
               JOIN pg_catalog.pg_extension e
                 ON e.oid OPERATOR(pg_catalog.=) d.refobjid AND e.extname OPERATOR(pg_catalog.=) 'idem'
               JOIN (VALUES ('idem_claim_info', 'idem.claims'), ('idem_token_status', 'idem.tokens'),
                            ('idem_offset_get', 'idem.offsets')) AS v(fn, tab)
                 ON p.proname OPERATOR(pg_catalog.=) v.fn
              WHERE pg_catalog.to_regclass(v.tab) IS NOT NULL
              ORDER BY 3 DESC, 1 LOOP
        IF f.distributed OR f.proparallel OPERATOR(pg_catalog.<>) 'u' THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s PARALLEL UNSAFE', f.sig);
        END IF;
        CONTINUE WHEN f.distributed;
        FOR w IN SELECT * FROM pg_catalog.run_command_on_workers(
                     pg_catalog.format('ALTER FUNCTION %s PARALLEL UNSAFE', f.sig)) LOOP
            IF NOT w.success THEN
                RAISE WARNING 'could not make % PARALLEL UNSAFE on node %:%: %', f.sig, w.nodename, w.nodeport, w.result
                    USING HINT = 'Run idem_distribute() again once the node is reachable.';
            END IF;
        END LOOP;
    END LOOP;
    -- the tables: the first is the colocation group of the others whose
    -- distribution column is text; tokens are keyed by a digest (bytea)
    FOR t IN SELECT * FROM (VALUES
            (1, 'idem.claims', 'msg_id', 'default'),
            (2, 'idem.requests', 'key', 'idem.claims'),
            (3, 'idem.offsets', 'consumer', 'idem.claims'),
            (4, 'idem.producer_seqs', 'producer', 'idem.claims'),
            (5, 'idem.tokens', 'digest', 'none')) AS v(n, tab, col, colocate)
            ORDER BY n LOOP
        IF pg_catalog.to_regclass(t.tab) IS NULL THEN
            CONTINUE;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
                        WHERE logicalrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(t.tab)) THEN
            PERFORM pg_catalog.create_distributed_table(t.tab::pg_catalog.regclass, t.col,
                                                        colocate_with := t.colocate);
        END IF;
        RETURN NEXT t.tab;
    END LOOP;
    -- the functions whose first argument is the distribution column of
    -- their table: a call is run on the node of its key, also inside a
    -- transaction block (force_delegation)
    FOR f IN SELECT p.oid::pg_catalog.regprocedure::pg_catalog.text AS sig, v.tab
               FROM pg_catalog.pg_proc p
               JOIN pg_catalog.pg_depend d
                 ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                AND d.objid OPERATOR(pg_catalog.=) p.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'
               JOIN pg_catalog.pg_extension e
                 ON e.oid OPERATOR(pg_catalog.=) d.refobjid AND e.extname OPERATOR(pg_catalog.=) 'idem'
               JOIN (VALUES ('idem_claim', 'idem.claims'), ('idem_try_claim', 'idem.claims'),
                            ('idem_claim_info', 'idem.claims'), ('idem_release', 'idem.claims'),
                            ('idem_request_begin', 'idem.requests'),
                            ('idem_request_checkpoint', 'idem.requests'),
                            ('idem_request_finish', 'idem.requests'),
                            ('idem_offset_advance', 'idem.offsets'),
                            ('idem_offset_get', 'idem.offsets'),
                            ('idem_seq_accept', 'idem.producer_seqs')) AS v(fn, tab)
                 ON p.proname OPERATOR(pg_catalog.=) v.fn
              WHERE pg_catalog.to_regclass(v.tab) IS NOT NULL
              ORDER BY 1 LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_object o
                        WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                          AND o.objid OPERATOR(pg_catalog.=) f.sig::pg_catalog.regprocedure
                          AND o.distribution_argument_index IS NOT NULL) THEN
            PERFORM pg_catalog.create_distributed_function(f.sig::pg_catalog.regprocedure, '$1'::pg_catalog.text,
                                                           colocate_with := f.tab::pg_catalog.text,
                                                           force_delegation := true);
        END IF;
        RETURN NEXT f.sig;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION idem_distribute() IS
    'on a Citus coordinator: distributes idem''s keyed tables (colocated) and routes their functions to the node of the key; returns what is distributed; repeatable';
REVOKE ALL ON FUNCTION idem_distribute() FROM PUBLIC;

-- The probe of a key's shard, run on the node that holds it: a call made on
-- a node without the shard sends it there in a statement on the table that
-- names the key, which Citus routes to the shard (see store.c).
CREATE OR REPLACE FUNCTION idem._shard_probe(tbl pg_catalog.text, wait pg_catalog.bool,
                                             VARIADIC keys "any")
RETURNS pg_catalog.int4
AS 'MODULE_PATHNAME', 'idem_shard_probe'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION idem._shard_probe(pg_catalog.text, pg_catalog.bool, "any") IS
    'on a Citus node: probes the local shard of one of idem''s keyed tables for a key, waiting for its inserter when asked (internal)';
REVOKE ALL ON FUNCTION idem._shard_probe(pg_catalog.text, pg_catalog.bool, "any") FROM PUBLIC;
-- ==== END scale-out on Citus ====

-- ==== BEGIN privileges granted before the update ====
-- A GRANT or REVOKE in an update script records the object's whole ACL as
-- its initial privileges (pg_init_privs), which pg_dump leaves out of a
-- dump: what an administrator granted on an object of 0.1.0 (EXECUTE on
-- idem_release to an operators' role, say) would be lost by a dump and
-- restore.  The initial privileges keep only what idem grants: the owner's,
-- PUBLIC's and pg_monitor's.
UPDATE pg_catalog.pg_init_privs ip
   SET initprivs = ARRAY(SELECT a.item
                           FROM pg_catalog.unnest(ip.initprivs) WITH ORDINALITY AS a(item, n)
                          WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.aclexplode(ARRAY[a.item]) AS x
                                             WHERE x.grantee OPERATOR(pg_catalog.<>) x.grantor
                                               AND x.grantee OPERATOR(pg_catalog.<>) 0
                                               AND x.grantee OPERATOR(pg_catalog.<>)
                                                   'pg_monitor'::pg_catalog.regrole)
                          ORDER BY a.n)
 WHERE ip.privtype OPERATOR(pg_catalog.=) 'e'
   AND EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
               WHERE d.classid OPERATOR(pg_catalog.=) ip.classoid
                 AND d.objid OPERATOR(pg_catalog.=) ip.objoid
                 AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                 AND d.deptype OPERATOR(pg_catalog.=) 'e'
                 AND e.extname OPERATOR(pg_catalog.=) 'idem');
-- ==== END privileges granted before the update ====
