-- what members of the predefined roles pg_read_all_data and
-- pg_write_all_data can do with idem's tables, as the README states it:
-- they read and write them as any table, except that idem.transitions takes
-- writes only from its owner (idem_allow and idem_disallow run as it), so
-- that the state machines bind them too
\set VERBOSITY terse

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
GRANT EXECUTE ON FUNCTION pg_temp.err(text) TO PUBLIC;

CREATE ROLE regress_idem_reader IN ROLE pg_read_all_data;
CREATE ROLE regress_idem_writer IN ROLE pg_write_all_data;
CREATE ROLE regress_idem_granted;
GRANT USAGE ON SCHEMA idem TO regress_idem_granted;
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON idem.transitions TO regress_idem_granted;

SELECT idem_claim('pb1', 'pb'), length(idem_token_issue('pb')), idem_allow('pb', 'new', 'paid');
CREATE TABLE pb_orders (id int PRIMARY KEY, status text NOT NULL);
INSERT INTO pb_orders VALUES (1, 'new');
SELECT idem_guard('pb_orders', 'pb', 'status');
GRANT SELECT, UPDATE ON pb_orders TO regress_idem_writer;

-- pg_read_all_data reads every table of idem, token digests and the key
-- that hides hints included; it writes none
SET ROLE regress_idem_reader;
SELECT (SELECT count(*) FROM idem.claims WHERE ns = 'pb') AS claims,
       (SELECT count(*) FROM idem.tokens WHERE scope = 'pb' AND octet_length(digest) = 32) AS token_digests,
       (SELECT octet_length(key) FROM idem.token_key) AS key_bytes,
       (SELECT count(*) FROM idem.transitions WHERE machine = 'pb') AS transitions;
SELECT pg_temp.err($$INSERT INTO idem.claims VALUES ('pb', 'pb2', now())$$);
RESET ROLE;

-- pg_write_all_data inserts, updates and deletes rows of idem's tables as
-- of any table (it does not read them): it may pre-claim a message, or
-- store the digest of a token it made up, which is then valid
SET ROLE regress_idem_writer;
SELECT pg_temp.err($$INSERT INTO idem.claims VALUES ('pb', 'pb2', now())$$);
SELECT pg_temp.err($$INSERT INTO idem.tokens VALUES ('pb', sha256(convert_to(repeat('A', 43), 'UTF8')), now() + '1 day', NULL)$$);
SELECT pg_temp.err($$SELECT count(*) FROM idem.claims$$);
RESET ROLE;
SELECT idem_claim('pb2', 'pb') AS pb2_claimable,
       idem_token_consume(repeat('A', 43) || 'AAAAAAAA', 'pb') AS made_up_token_consumed;

-- the outbox's as well: its CHECK constraint, which runs as the writer (its
-- functions are every role's), refuses a row whose id is not one a send
-- makes for its topic, key and seq (23514), and takes one made by
-- idem._outbox_id
SET ROLE regress_idem_writer;
SELECT pg_temp.err($$INSERT INTO idem.outbox (id, aggregatetype, aggregateid, payload, seq, created_at, key_hash)
    VALUES (gen_random_uuid(), 'pb', 'k', '{}', 1, now(), idem._outbox_key_hash('pb', 'k'))$$);
SELECT pg_temp.err($$INSERT INTO idem.outbox (id, aggregatetype, aggregateid, payload, seq, created_at, key_hash)
    VALUES (idem._outbox_id('pb', 'k', 1), 'pb', 'k', '{}', 1, now(), idem._outbox_key_hash('pb', 'k'))$$);
RESET ROLE;
SELECT aggregateid, seq, id BETWEEN idem._outbox_id_bound('pb', 'k', false)
                                AND idem._outbox_id_bound('pb', 'k', true) AS id_of_key
  FROM idem.outbox WHERE aggregatetype = 'pb';
DELETE FROM idem.outbox WHERE aggregatetype = 'pb';

-- but not the state machines: every write is refused, so a guarded table
-- it may UPDATE keeps its machine
SET ROLE regress_idem_writer;
SELECT pg_temp.err($$INSERT INTO idem.transitions VALUES ('pb', 'paid', 'new')$$);
SELECT pg_temp.err($$UPDATE idem.transitions SET to_state = 'shipped'$$);
SELECT pg_temp.err($$DELETE FROM idem.transitions$$);
SELECT pg_temp.err($$TRUNCATE idem.transitions$$);
SELECT pg_temp.err($$SELECT idem_allow('pb', 'paid', 'new')$$);
SELECT pg_temp.err($$UPDATE pb_orders SET status = 'paid' WHERE id = 1$$);
SELECT pg_temp.err($$UPDATE pb_orders SET status = 'new' WHERE id = 1$$);
RESET ROLE;
-- nor does a grant on the table get round it
SET ROLE regress_idem_granted;
SELECT pg_temp.err($$INSERT INTO idem.transitions VALUES ('pb', 'paid', 'new')$$);
SELECT pg_temp.err($$DELETE FROM idem.transitions WHERE machine = 'pb'$$);
SELECT pg_temp.err($$TRUNCATE idem.transitions$$);
RESET ROLE;
SELECT from_state, to_state FROM idem.transitions WHERE machine = 'pb' ORDER BY 1, 2;

-- the way in is idem_allow and idem_disallow, granted: they run as the owner
GRANT EXECUTE ON FUNCTION idem_allow(text, text, text), idem_disallow(text, text, text) TO regress_idem_writer;
SET ROLE regress_idem_writer;
SELECT idem_allow('pb', 'paid', 'new') AS allowed;
SELECT pg_temp.err($$UPDATE pb_orders SET status = 'new' WHERE id = 1$$);
SELECT idem_disallow('pb', 'paid', 'new') AS disallowed;
RESET ROLE;
-- and the owner (a superuser here) writes the table directly
INSERT INTO idem.transitions VALUES ('pb', 'paid', 'shipped');
DELETE FROM idem.transitions WHERE machine = 'pb' AND to_state = 'shipped';
SELECT from_state, to_state FROM idem.transitions WHERE machine = 'pb' ORDER BY 1, 2;

SELECT idem_unguard('pb_orders');
DROP TABLE pb_orders;
DELETE FROM idem.transitions WHERE machine = 'pb';
DELETE FROM idem.claims WHERE ns = 'pb';
DELETE FROM idem.tokens WHERE scope = 'pb';
REVOKE ALL ON idem.transitions FROM regress_idem_granted;
REVOKE USAGE ON SCHEMA idem FROM regress_idem_granted;
REVOKE EXECUTE ON FUNCTION idem_allow(text, text, text), idem_disallow(text, text, text) FROM regress_idem_writer;
DROP ROLE regress_idem_reader, regress_idem_writer, regress_idem_granted;
