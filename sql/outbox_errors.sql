-- SQLSTATEs of the outbox that must be those the README lists
\set VERBOSITY terse

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;

-- a topic over 255 bytes is 22001 for idem_outbox_configure as for
-- idem_outbox_send, an empty one 22023 for both
SELECT pg_temp.err($$SELECT idem_outbox_send(repeat('t', 256), 'k', '{}')$$);
SELECT pg_temp.err($$SELECT idem_outbox_configure(repeat('t', 256), 3, '1 second', '1 minute')$$);
SELECT pg_temp.err($$SELECT idem_outbox_send('', 'k', '{}')$$);
SELECT pg_temp.err($$SELECT idem_outbox_configure('', 3, '1 second', '1 minute')$$);
SELECT count(*) AS settings FROM idem.outbox_topics WHERE topic = repeat('t', 256);

-- one of the outbox's relations is missing: 42P01, as for idem's tables
BEGIN;
ALTER TABLE idem.outbox DROP CONSTRAINT outbox_pkey;
SELECT pg_temp.err($$SELECT count(*) FROM idem_outbox_lease('relay')$$);
ROLLBACK;
