-- The functions that run as the extension's owner (the purges,
-- idem_maintenance, and what the maintenance worker runs) call nothing by the
-- name of the extension's schema: a role with CREATE on that schema (here
-- its owner, as a database's owner owns public) could otherwise put a
-- function of the same name there, or rename the schema and make another,
-- and have it run as a superuser.
CREATE ROLE regress_idem_dbo;
CREATE SCHEMA regress_idem_log;
CREATE TABLE regress_idem_log.hijacked (who text, fn text);
GRANT USAGE ON SCHEMA regress_idem_log TO PUBLIC;
GRANT INSERT ON regress_idem_log.hijacked TO PUBLIC;
ALTER SCHEMA public OWNER TO regress_idem_dbo;
-- as a database's owner may (to rename a schema, and make one)
SELECT current_database() AS db \gset
GRANT CREATE ON DATABASE :"db" TO regress_idem_dbo;

-- an overload that an untyped literal in a call would pick
SET ROLE regress_idem_dbo;
CREATE FUNCTION public.idem_outbox_purge(text, int) RETURNS bigint LANGUAGE sql
    AS $$ INSERT INTO regress_idem_log.hijacked VALUES (current_user, 'overload') RETURNING 0::bigint $$;
RESET ROLE;
SELECT kind, purged FROM idem_maintenance(10);
SELECT * FROM regress_idem_log.hijacked;
DROP FUNCTION public.idem_outbox_purge(text, int);

-- the schema renamed, and another of its name with functions of the names
-- and argument types of idem's
SET ROLE regress_idem_dbo;
ALTER SCHEMA public RENAME TO regress_public_old;
CREATE SCHEMA public;
CREATE FUNCTION public.idem_purge(text, int) RETURNS bigint LANGUAGE sql
    AS $$ INSERT INTO regress_idem_log.hijacked VALUES (current_user, 'idem_purge') RETURNING 0::bigint $$;
CREATE FUNCTION public.idem_token_purge(int) RETURNS bigint LANGUAGE sql
    AS $$ INSERT INTO regress_idem_log.hijacked VALUES (current_user, 'idem_token_purge') RETURNING 0::bigint $$;
CREATE FUNCTION public.idem_request_purge(int) RETURNS bigint LANGUAGE sql
    AS $$ INSERT INTO regress_idem_log.hijacked VALUES (current_user, 'idem_request_purge') RETURNING 0::bigint $$;
CREATE FUNCTION public.idem_outbox_purge(interval, int) RETURNS bigint LANGUAGE sql
    AS $$ INSERT INTO regress_idem_log.hijacked VALUES (current_user, 'idem_outbox_purge') RETURNING 0::bigint $$;
CREATE FUNCTION public.idem_maintenance(int) RETURNS TABLE (kind text, purged bigint) LANGUAGE sql
    AS $$ INSERT INTO regress_idem_log.hijacked VALUES (current_user, 'idem_maintenance') RETURNING 'x', 0::bigint $$;
RESET ROLE;
SELECT kind, purged FROM regress_public_old.idem_maintenance(10);
SELECT regress_public_old.idem_purge(NULL, 10) AS claims,
       regress_public_old.idem_token_purge(10) AS tokens,
       regress_public_old.idem_request_purge(10) AS requests,
       regress_public_old.idem_outbox_purge('0', 10) AS outbox_keys;
-- what the maintenance worker runs
SELECT kind, purged FROM idem._maintenance(10);
SELECT * FROM regress_idem_log.hijacked;

-- back as it was
DROP SCHEMA public CASCADE;
ALTER SCHEMA regress_public_old RENAME TO public;
ALTER SCHEMA public OWNER TO pg_database_owner;
DROP SCHEMA regress_idem_log CASCADE;
REVOKE CREATE ON DATABASE :"db" FROM regress_idem_dbo;
DROP ROLE regress_idem_dbo;
