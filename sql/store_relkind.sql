-- idem reaches its own tables by name, through the table and index access
-- methods.  A relation that carries one of those names but is not an
-- ordinary table (a partitioned table has no access method of its own) is
-- refused with 55000, or (the hint key) ignored, never scanned: each case
-- runs in a transaction that is rolled back.
\set VERBOSITY terse

CREATE FUNCTION err(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text;
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    RETURN st || ': ' || msg;
END;
$$;

-- the claims, partitioned
SELECT idem_claim('sr_before');
BEGIN;
ALTER EXTENSION idem DROP TABLE idem.claims;
DROP TABLE idem.claims;
CREATE TABLE idem.claims (ns text COLLATE "C", msg_id text COLLATE "C",
                          claimed_at timestamptz NOT NULL DEFAULT now(),
                          PRIMARY KEY (ns, msg_id)) PARTITION BY LIST (ns);
CREATE TABLE idem.claims_default PARTITION OF idem.claims DEFAULT;
SELECT err($$SELECT idem_claim('sr_1')$$);
SELECT err($$SELECT idem_try_claim('sr_1')$$);
SELECT err($$SELECT idem_claim_batch(ARRAY['sr_1', 'sr_2'])$$);
SELECT err($$SELECT idem_claim_info('sr_1')$$);
SELECT 1 AS still_here;
ROLLBACK;
SELECT idem_claim('sr_before') AS first, idem_claim('sr_after') AS first;

-- the tokens, partitioned
SELECT length(idem_token_issue()) AS issued;
BEGIN;
ALTER EXTENSION idem DROP TABLE idem.tokens;
DROP TABLE idem.tokens;
CREATE TABLE idem.tokens (scope text COLLATE "C", digest bytea,
                          expires_at timestamptz NOT NULL, consumed_at timestamptz,
                          PRIMARY KEY (scope, digest)) PARTITION BY LIST (scope);
CREATE TABLE idem.tokens_default PARTITION OF idem.tokens DEFAULT;
SELECT err($$SELECT idem_token_issue()$$);
SELECT err($$SELECT idem_token_consume(repeat('A', 51))$$);
SELECT 1 AS still_here;
ROLLBACK;

-- the hint key, a view in a new session: tokens still work, hints unhidden
\c
BEGIN;
ALTER EXTENSION idem DROP TABLE idem.token_key;
ALTER TABLE idem.token_key RENAME TO token_key_table;
CREATE VIEW idem.token_key AS SELECT * FROM idem.token_key_table;
SELECT idem_token_consume(idem_token_issue()) AS consumed;
ROLLBACK;

-- the claims, an index: refused the same way, not by the open of a table
BEGIN;
ALTER EXTENSION idem DROP TABLE idem.claims;
ALTER TABLE idem.claims RENAME TO claims_table;
CREATE INDEX claims ON idem.claims_table (claimed_at);
SELECT err($$SELECT idem_claim('sr_1')$$);
SELECT err($$SELECT idem_claim_info('sr_1')$$);
ROLLBACK;

-- the hint key, an index, then a composite type, in new sessions: ignored
\c
BEGIN;
ALTER EXTENSION idem DROP TABLE idem.token_key;
ALTER TABLE idem.token_key RENAME TO token_key_table;
CREATE INDEX token_key ON idem.tokens (expires_at);
SELECT idem_token_consume(idem_token_issue()) AS consumed;
ROLLBACK;
\c
BEGIN;
ALTER EXTENSION idem DROP TABLE idem.token_key;
ALTER TABLE idem.token_key RENAME TO token_key_table;
CREATE TYPE idem.token_key AS (k bytea);
SELECT idem_token_consume(idem_token_issue()) AS consumed;
ROLLBACK;

-- the request retentions, a composite type: the default retention
BEGIN;
ALTER EXTENSION idem DROP TABLE idem.request_retention;
ALTER TABLE idem.request_retention RENAME TO request_retention_table;
CREATE TYPE idem.request_retention AS (ns text, retention interval);
SELECT status FROM idem_request_begin('sr-req', 'fp');
SELECT idem_request_finish('sr-req', 200, '{}'::jsonb) AS finished;
ROLLBACK;

-- the machines, partitioned
SELECT idem_allow('sr', 'new', 'paid');
CREATE TABLE sr_orders (id integer PRIMARY KEY, status text NOT NULL);
INSERT INTO sr_orders VALUES (1, 'new');
\c
BEGIN;
ALTER EXTENSION idem DROP TABLE idem.transitions;
ALTER TABLE idem.transitions RENAME TO transitions_table;
CREATE TABLE idem.transitions (machine text, from_state text, to_state text)
    PARTITION BY LIST (machine);
CREATE TABLE idem.transitions_default PARTITION OF idem.transitions DEFAULT;
SELECT err($$SELECT idem_guard('sr_orders', 'sr', 'status')$$);
SELECT 1 AS still_here;
ROLLBACK;
SELECT idem_guard('sr_orders', 'sr', 'status');
SELECT idem_transition('sr_orders', '1', 'paid');

-- a label of one of idem's result types renamed: 55000, not an internal error,
-- also in a session that knew the labels before (and forgets them)
SELECT idem_try_claim('sr_enum_before');
BEGIN;
ALTER TYPE idem_claim_result RENAME VALUE 'claimed' TO 'won';
SELECT err($$SELECT idem_try_claim('sr_enum')$$);
ROLLBACK;
SELECT idem_try_claim('sr_enum'), idem_try_claim('sr_enum');
SELECT idem_release('sr_enum'), idem_release('sr_enum_before');

-- a request retention written by hand past what a timestamp can hold: the
-- request is kept for ever, not refused at its finish
BEGIN;
INSERT INTO idem.request_retention VALUES ('sr-long', '1000000 years');
SELECT status FROM idem_request_begin('sr-long-1', 'fp', 'sr-long');
SELECT idem_request_finish('sr-long-1', 200, '{}'::jsonb, 'sr-long');
SELECT expires_at FROM idem.requests WHERE ns = 'sr-long';
ROLLBACK;
BEGIN;
INSERT INTO idem.request_retention VALUES ('sr-mixed', '-1000000 months 31000000 days');
SELECT status FROM idem_request_begin('sr-mixed-1', 'fp', 'sr-mixed');
SELECT idem_request_finish('sr-mixed-1', 200, '{}'::jsonb, 'sr-mixed');
SELECT expires_at FROM idem.requests WHERE ns = 'sr-mixed';
ROLLBACK;

DROP TABLE sr_orders;
DROP FUNCTION err(text);
DELETE FROM idem.claims WHERE msg_id LIKE 'sr\_%';
DELETE FROM idem.transitions;

