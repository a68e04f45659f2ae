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

-- a message whose payload and headers take more than 256 MB as text is
-- refused (54000), nothing written: its lease would fail for every relay,
-- past 1 GB, and hold back every key.  The text is measured, not the
-- jsonb: a number such as 1e131071 takes 14 bytes and prints 131,072 digits
SELECT pg_temp.err($$SELECT idem_outbox_send('big', 'k',
    (SELECT jsonb_agg('1e131071'::numeric) FROM generate_series(1, 2100)))$$);
SELECT count(*) AS big_messages FROM idem.outbox WHERE aggregatetype = 'big';
-- the payload and the headers count together: 144 MB of each
SELECT pg_temp.err($$SELECT idem_outbox_send('big', 'k',
    (SELECT jsonb_agg('1e131071'::numeric) FROM generate_series(1, 1100)),
    (SELECT jsonb_build_object('h', jsonb_agg('1e131071'::numeric)) FROM generate_series(1, 1100)))$$);
SELECT count(*) AS big_messages FROM idem.outbox WHERE aggregatetype = 'big';
-- under the limit (249 MB as text), measured too: sent
SELECT pg_temp.err($$SELECT idem_outbox_send('big', 'k',
    (SELECT jsonb_agg('1e131071'::numeric) FROM generate_series(1, 1900)))$$);
SELECT count(*) AS big_messages FROM idem.outbox WHERE aggregatetype = 'big';
DELETE FROM idem.outbox WHERE aggregatetype = 'big';
DELETE FROM idem.outbox_keys WHERE topic = 'big';
