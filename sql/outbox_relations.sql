-- the outbox's tables and indexes altered by their owner: refused with
-- 55000, never scanned with keys of the wrong types (a crash, or wrong
-- answers); each change is rolled back
\set VERBOSITY terse

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;

SELECT idem_outbox_send('relations', 'k', '{"n": 1}') IS NOT NULL AS sent;
SELECT idem_outbox_configure('relations', 3, '1 second', '1 minute');

-- (leases show the messages of this test only: other tests leave some)

-- the primary key, which also gives each key's head, on other columns
BEGIN;
ALTER TABLE idem.outbox DROP CONSTRAINT outbox_pkey;
ALTER TABLE idem.outbox ADD CONSTRAINT outbox_pkey PRIMARY KEY (seq);
SELECT pg_temp.err($$SELECT count(*) FROM idem_outbox_lease('relay')$$);
ROLLBACK;
BEGIN;
ALTER TABLE idem.outbox DROP CONSTRAINT outbox_pkey;
CREATE UNIQUE INDEX outbox_pkey ON idem.outbox ((id::text));
SELECT pg_temp.err($$SELECT count(*) FROM idem_outbox_lease('relay')$$);
ROLLBACK;
-- not unique: a send through the executor (with an index a user added)
-- would check nothing
BEGIN;
ALTER TABLE idem.outbox DROP CONSTRAINT outbox_pkey;
CREATE INDEX outbox_pkey ON idem.outbox (id);
SELECT pg_temp.err($$SELECT count(*) FROM idem_outbox_lease('relay')$$);
ROLLBACK;
-- partial: it would hide the messages of a key from the lease
BEGIN;
ALTER TABLE idem.outbox DROP CONSTRAINT outbox_pkey;
CREATE UNIQUE INDEX outbox_pkey ON idem.outbox (id) WHERE aggregatetype <> 'relations';
SELECT pg_temp.err($$SELECT count(*) FROM idem_outbox_lease('relay')$$);
ROLLBACK;
-- in descending order: it would hand a key's later message out first
BEGIN;
ALTER TABLE idem.outbox DROP CONSTRAINT outbox_pkey;
CREATE UNIQUE INDEX outbox_pkey ON idem.outbox (id DESC);
SELECT pg_temp.err($$SELECT count(*) FROM idem_outbox_lease('relay')$$);
ROLLBACK;
-- in the order of another operator family (here the reverse): the same
BEGIN;
CREATE FUNCTION public.uuid_cmp_reversed(uuid, uuid) RETURNS int4
    LANGUAGE sql IMMUTABLE STRICT AS 'SELECT pg_catalog.uuid_cmp($2, $1)';
CREATE OPERATOR CLASS public.uuid_reversed_ops FOR TYPE uuid USING btree AS
    OPERATOR 1 >, OPERATOR 2 >=, OPERATOR 3 =, OPERATOR 4 <=, OPERATOR 5 <,
    FUNCTION 1 public.uuid_cmp_reversed(uuid, uuid);
ALTER TABLE idem.outbox DROP CONSTRAINT outbox_pkey;
CREATE UNIQUE INDEX outbox_pkey ON idem.outbox (id public.uuid_reversed_ops);
SELECT pg_temp.err($$SELECT count(*) FROM idem_outbox_lease('relay')$$);
SELECT pg_temp.err($$SELECT idem_outbox_send('relations', 'k', '{}')$$);
ROLLBACK;
-- not valid, as a CREATE INDEX CONCURRENTLY that failed leaves it
BEGIN;
UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'idem.outbox_pkey'::regclass;
SELECT pg_temp.err($$SELECT count(*) FROM idem_outbox_lease('relay')$$);
ROLLBACK;
-- a seq out of the 48 bits an id has for it (the sequence's range changed)
BEGIN;
ALTER SEQUENCE idem.outbox_seq NO MAXVALUE RESTART WITH 281474976710656;
SELECT pg_temp.err($$SELECT idem_outbox_send('relations', 'k', '{}')$$);
ROLLBACK;
-- settings of the sequence that would give a later message a smaller seq
-- (55000): values cached ahead by a backend, a decreasing sequence, one
-- that starts again
BEGIN;
ALTER SEQUENCE idem.outbox_seq CACHE 10;
SELECT pg_temp.err($$SELECT idem_outbox_send('relations-seq', 'k', '{}')$$);
ROLLBACK;
BEGIN;
ALTER SEQUENCE idem.outbox_seq INCREMENT BY -1 MINVALUE 0;
SELECT pg_temp.err($$SELECT idem_outbox_send('relations-seq', 'k', '{}')$$);
ROLLBACK;
BEGIN;
ALTER SEQUENCE idem.outbox_seq CYCLE;
SELECT pg_temp.err($$SELECT idem_outbox_send('relations-seq', 'k', '{}')$$);
ROLLBACK;
-- an UNLOGGED sequence, which a crash would set back (55000)
BEGIN;
ALTER SEQUENCE idem.outbox_seq SET UNLOGGED;
SELECT pg_temp.err($$SELECT idem_outbox_send('relations-seq', 'k', '{}')$$);
ROLLBACK;
-- a refused send leaves the sequence where it was: its step would not be
-- undone by the rollback, and a decreasing sequence would have stepped
-- back under the seqs of messages still waiting once it is put right
SELECT last_value AS seq_before FROM idem.outbox_seq \gset
ALTER SEQUENCE idem.outbox_seq INCREMENT BY -1 MINVALUE 0;
SELECT pg_temp.err($$SELECT idem_outbox_send('relations-seq', 'k', '{}')$$);
SELECT pg_temp.err($$SELECT idem_outbox_send('relations-seq', 'k', '{}')$$);
ALTER SEQUENCE idem.outbox_seq INCREMENT BY 1 MINVALUE 1;
SELECT last_value = :seq_before AS seq_unmoved FROM idem.outbox_seq;
SELECT count(*) AS refused_sent FROM idem.outbox WHERE aggregatetype = 'relations-seq';
SELECT count(*) AS messages FROM idem.outbox WHERE aggregatetype = 'relations';
-- a row written by hand must belong to its key: its id made for its key
-- and seq, and its key_hash the key's (23514), or it would never be leased
SELECT pg_temp.err($$INSERT INTO idem.outbox (id, aggregatetype, aggregateid, payload, seq, created_at, key_hash)
    VALUES (gen_random_uuid(), 'relations', 'k', '{}', 1, now(), idem._outbox_key_hash('relations', 'k'))$$);
SELECT pg_temp.err($$INSERT INTO idem.outbox (id, aggregatetype, aggregateid, payload, seq, created_at, key_hash)
    VALUES (idem._outbox_id('relations', 'k', 1), 'relations', 'k', '{}', 1, now(), 0)$$);
SELECT pg_temp.err($$UPDATE idem.outbox SET aggregateid = 'k2' WHERE aggregatetype = 'relations'$$);
-- an id of its key but of another seq: the lease orders a key's messages by
-- id, runs and acks by seq
SELECT pg_temp.err($$INSERT INTO idem.outbox (id, aggregatetype, aggregateid, payload, seq, created_at, key_hash)
    VALUES (idem._outbox_id('relations', 'k', 150), 'relations', 'k', '{}', 50, now(),
            idem._outbox_key_hash('relations', 'k'))$$);
-- an id in the key's range with other version bits
SELECT pg_temp.err($$INSERT INTO idem.outbox (id, aggregatetype, aggregateid, payload, seq, created_at, key_hash)
    VALUES (overlay(idem._outbox_id('relations', 'k', 50)::text placing '9' from 15)::uuid, 'relations', 'k', '{}', 50,
            now(), idem._outbox_key_hash('relations', 'k'))$$);
SELECT pg_temp.err($$UPDATE idem.outbox SET seq = seq + 1 WHERE aggregatetype = 'relations'$$);
BEGIN;
INSERT INTO idem.outbox (id, aggregatetype, aggregateid, payload, seq, created_at, key_hash)
    VALUES (idem._outbox_id('relations', 'k', 0), 'relations', 'k', '{"by": "hand"}', 0, now(),
            idem._outbox_key_hash('relations', 'k'));
-- (seq 0 comes before every sent message: it is the key's head)
SELECT payload FROM idem_outbox_lease('relay') WHERE topic = 'relations';
ROLLBACK;

-- a column renamed after this session has sent (and found the tables as
-- idem made them): the next send hears of it
BEGIN;
ALTER TABLE idem.outbox RENAME type TO kind;
SELECT pg_temp.err($$SELECT idem_outbox_send('relations', 'k', '{}')$$);
ROLLBACK;
BEGIN;
ALTER TABLE idem.outbox_keys RENAME last_error TO error;
SELECT pg_temp.err($$SELECT idem_outbox_send('relations', 'k', '{}')$$);
ROLLBACK;

-- the primary key on another column
BEGIN;
DELETE FROM idem.outbox WHERE aggregatetype <> 'relations';
ALTER TABLE idem.outbox DROP CONSTRAINT outbox_pkey;
ALTER TABLE idem.outbox ADD CONSTRAINT outbox_pkey UNIQUE (aggregatetype);
SELECT pg_temp.err($$SELECT idem_outbox_ack(ARRAY[gen_random_uuid()])$$);
ROLLBACK;

-- a topic that is not text, or a column added: refused, not taken for the
-- defaults of every topic
BEGIN;
DELETE FROM idem.outbox_topics WHERE topic <> 'relations';
ALTER TABLE idem.outbox_topics ALTER topic TYPE int USING 0;
SELECT pg_temp.err($$SELECT topic, key, attempt FROM idem_outbox_lease('relay')$$);
ROLLBACK;
BEGIN;
ALTER TABLE idem.outbox_topics ADD COLUMN note text;
SELECT pg_temp.err($$SELECT topic, key, attempt FROM idem_outbox_lease('relay')$$);
ROLLBACK;

-- as they were
SELECT topic, key, attempt FROM idem_outbox_lease('relay') WHERE topic = 'relations';
SELECT idem_outbox_ack(array_agg(id)) AS acked FROM idem.outbox WHERE aggregatetype = 'relations';
DELETE FROM idem.outbox_topics WHERE topic = 'relations';
DELETE FROM idem.outbox_keys WHERE topic = 'relations';

-- key_hash is the same on every machine (FNV-1a over bytes, not words in the
-- machine's order): a dump restored elsewhere finds its keys.  The values
-- are those of a byte-by-byte computation.
SELECT idem._outbox_key_hash('orders', '4711') = -4442275746889381727 AS same_everywhere,
       idem._outbox_key_hash('t', 'é') = -2507858991602339648 AS utf8_bytes,
       idem._outbox_key_hash('ab', 'c') <> idem._outbox_key_hash('a', 'bc') AS split_matters;
