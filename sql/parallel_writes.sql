-- functions that write, called in parallel mode: through a function of the
-- user's wrongly marked PARALLEL SAFE, the planner puts the call under a
-- Gather (force_parallel_mode), in a parallel worker.  Every one of them
-- fails with 25000 naming itself (not an internal error, not an insertion
-- the worker cannot make), and writes nothing.  The same wrappers outside
-- parallel mode work.
\set VERBOSITY terse

-- err(query): the SQLSTATE and message of the error the query raises
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

CREATE TABLE pw_one (i int);
INSERT INTO pw_one VALUES (1);
SELECT idem_allow('pw', 'new', 'paid');
CREATE TABLE pw_orders (id int PRIMARY KEY, status text NOT NULL, version int NOT NULL DEFAULT 0);
INSERT INTO pw_orders VALUES (1, 'new');
SELECT idem_guard('pw_orders', 'pw', 'status', 'version');
SELECT status FROM idem_request_begin('pw-finish', 'fp', 'pw');

CREATE FUNCTION pw_claim(text) RETURNS boolean LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT idem_claim($1, 'pw') $$;
CREATE FUNCTION pw_try_claim(text) RETURNS idem_claim_result LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT idem_try_claim($1, 'pw') $$;
CREATE FUNCTION pw_claim_batch(text[]) RETURNS boolean[] LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT idem_claim_batch($1, 'pw') $$;
CREATE FUNCTION pw_token_issue() RETURNS text LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT idem_token_issue('pw') $$;
CREATE FUNCTION pw_token_consume(text) RETURNS boolean LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT idem_token_consume($1, 'pw') $$;
CREATE FUNCTION pw_offset_advance(bigint) RETURNS boolean LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT idem_offset_advance('pw', 'pw', 0, $1) $$;
CREATE FUNCTION pw_seq_accept(bigint) RETURNS idem_seq_result LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT idem_seq_accept('pw', $1) $$;
CREATE FUNCTION pw_request_begin(text) RETURNS text LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT status::text FROM idem_request_begin($1, 'fp', 'pw') $$;
CREATE FUNCTION pw_request_finish(text) RETURNS void LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT idem_request_finish($1, 200, NULL, 'pw') $$;
CREATE FUNCTION pw_transition(text) RETURNS idem_transition_result LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT idem_transition('pw_orders', '1', $1) $$;
CREATE FUNCTION pw_outbox_send(text) RETURNS uuid LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT idem_outbox_send('pw', $1, jsonb_build_array(1)) $$;

SET force_parallel_mode = on;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
-- the call runs under a Gather, in a worker
EXPLAIN (COSTS OFF) SELECT pw_claim('m1') FROM pw_one;
SELECT pg_temp.err($$SELECT pw_claim('m1') FROM pw_one$$) AS claim;
SELECT pg_temp.err($$SELECT pw_try_claim('m1') FROM pw_one$$) AS try_claim;
SELECT pg_temp.err($$SELECT pw_claim_batch(ARRAY['m1', 'm2']) FROM pw_one$$) AS claim_batch;
SELECT pg_temp.err($$SELECT pw_token_issue() FROM pw_one$$) AS token_issue;
SELECT pg_temp.err($$SELECT pw_token_consume('not-a-token') FROM pw_one$$) AS token_consume;
SELECT pg_temp.err($$SELECT pw_offset_advance(1) FROM pw_one$$) AS offset_advance;
SELECT pg_temp.err($$SELECT pw_seq_accept(1) FROM pw_one$$) AS seq_accept;
SELECT pg_temp.err($$SELECT pw_request_begin('pw-1') FROM pw_one$$) AS request_begin;
SELECT pg_temp.err($$SELECT pw_request_finish('pw-finish') FROM pw_one$$) AS request_finish;
SELECT pg_temp.err($$SELECT pw_transition('paid') FROM pw_one$$) AS transition;
SELECT pg_temp.err($$SELECT pw_outbox_send('k') FROM pw_one$$) AS outbox_send;
RESET force_parallel_mode;
RESET parallel_setup_cost;
RESET parallel_tuple_cost;

-- nothing was written
SELECT (SELECT count(*) FROM idem.claims WHERE ns = 'pw') AS claims,
       (SELECT count(*) FROM idem.tokens WHERE scope = 'pw') AS tokens,
       (SELECT count(*) FROM idem.offsets WHERE consumer = 'pw') AS offsets,
       (SELECT count(*) FROM idem.producer_seqs WHERE producer = 'pw') AS producers,
       (SELECT count(*) FROM idem.requests WHERE ns = 'pw' AND key = 'pw-1') AS requests,
       (SELECT count(*) FROM idem.requests WHERE ns = 'pw' AND finished_at IS NOT NULL) AS finished,
       (SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'pw') AS messages,
       (SELECT status || ' ' || version FROM pw_orders WHERE id = 1) AS row1;

-- outside parallel mode the same wrappers work
SELECT pw_claim('m1'), pw_try_claim('m2'), pw_claim_batch(ARRAY['m1', 'm3']),
       length(pw_token_issue()) AS token_length, pw_token_consume('not-a-token'),
       pw_offset_advance(1), pw_seq_accept(1), pw_request_begin('pw-1'),
       pw_transition('paid'), pw_outbox_send('k') IS NOT NULL AS sent
  FROM pw_one;
SELECT pw_request_finish('pw-finish') FROM pw_one;

SELECT idem_unguard('pw_orders');
DROP TABLE pw_orders, pw_one;
DROP FUNCTION pw_claim(text), pw_try_claim(text), pw_claim_batch(text[]), pw_token_issue(),
    pw_token_consume(text), pw_offset_advance(bigint), pw_seq_accept(bigint), pw_request_begin(text),
    pw_request_finish(text), pw_transition(text), pw_outbox_send(text);
DELETE FROM idem.transitions WHERE machine = 'pw';
DELETE FROM idem.claims WHERE ns = 'pw';
DELETE FROM idem.namespaces WHERE ns = 'pw';
DELETE FROM idem.tokens WHERE scope = 'pw';
DELETE FROM idem.offsets WHERE consumer = 'pw';
DELETE FROM idem.producer_seqs WHERE producer = 'pw';
DELETE FROM idem.requests WHERE ns = 'pw';
DELETE FROM idem.outbox WHERE aggregatetype = 'pw';
DELETE FROM idem.outbox_keys WHERE topic = 'pw';
