-- idem's tables altered by their owner: every function that reads one
-- checks the names, types, NOT NULL and collations of the columns it relies
-- on, and refuses a table that no longer has them with 55000, instead of
-- reading a value with the wrong type (which crashed the server).  Each
-- change is made by a superuser and rolled back; the server answers all
-- along, and idem works again afterwards.
\set VERBOSITY terse

-- shape(change, call): make the change, run the call, undo both; the
-- call's outcome, or its SQLSTATE, message and detail
CREATE FUNCTION shape(change text, call text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text; det text; result text;
BEGIN
    BEGIN
        EXECUTE change;
        BEGIN
            EXECUTE call;
            result := 'ok';
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                                    det = PG_EXCEPTION_DETAIL;
            result := st || ': ' || msg || coalesce(' | ' || nullif(det, ''), '');
        END;
        RAISE EXCEPTION 'undo' USING ERRCODE = 'IDEM0';
    EXCEPTION WHEN SQLSTATE 'IDEM0' THEN
        NULL;
    END;
    RETURN result;
END;
$$;

SELECT idem_claim('before');
SELECT idem_token_issue('s') AS tok \gset
SELECT idem_allow('shape', 'new', 'paid');
CREATE TABLE shaped (id integer PRIMARY KEY, status text NOT NULL);
INSERT INTO shaped VALUES (1, 'new');
SELECT idem_guard('shaped', 'shape', 'status');

-- claims
SELECT shape($$ALTER TABLE idem.claims ALTER COLUMN claimed_at TYPE text$$,
             $$SELECT idem_claim('x')$$);
SELECT shape($$ALTER TABLE idem.claims ALTER COLUMN claimed_at TYPE text$$,
             $$SELECT idem_claim_info('before')$$);
SELECT shape($$ALTER TABLE idem.claims ALTER COLUMN claimed_at TYPE timestamp$$,
             $$SELECT idem_try_claim('x')$$);
SELECT shape($$ALTER TABLE idem.claims ALTER COLUMN msg_id TYPE varchar$$,
             $$SELECT idem_claim_batch(ARRAY['x', 'y'])$$);
SELECT shape($$ALTER TABLE idem.claims ALTER COLUMN ns TYPE bytea USING convert_to(ns, 'UTF8')$$,
             $$SELECT idem_release('before')$$);
SELECT shape($$ALTER TABLE idem.claims ALTER COLUMN msg_id TYPE text COLLATE "POSIX"$$,
             $$SELECT idem_claim('x')$$);
SELECT shape($$ALTER TABLE idem.claims RENAME COLUMN msg_id TO id$$,
             $$SELECT idem_claim('x')$$);
SELECT shape($$ALTER TABLE idem.claims DROP COLUMN claimed_at;
               ALTER TABLE idem.claims ADD COLUMN claimed_at timestamptz$$,
             $$SELECT idem_claim('x')$$);
SELECT shape($$ALTER TABLE idem.claims ADD COLUMN extra integer$$,
             $$SELECT idem_claim('x')$$);
SELECT shape($$ALTER TABLE idem.claims DROP CONSTRAINT claims_pkey;
               ALTER TABLE idem.claims ADD PRIMARY KEY (msg_id, ns)$$,
             $$SELECT idem_claim('x')$$);
-- a change that keeps what idem reads is fine
SELECT shape($$ALTER TABLE idem.claims ALTER COLUMN claimed_at DROP NOT NULL$$,
             $$SELECT idem_claim('x')$$);

-- tokens
SELECT shape($$ALTER TABLE idem.tokens ALTER COLUMN expires_at TYPE timestamp$$,
             $$SELECT idem_token_issue('s')$$);
SELECT shape($$ALTER TABLE idem.tokens ALTER COLUMN consumed_at TYPE text$$,
             format('SELECT idem_token_consume(%L, %L)', :'tok', 's'));
SELECT shape($$ALTER TABLE idem.tokens ALTER COLUMN digest TYPE text USING encode(digest, 'hex')$$,
             format('SELECT idem_token_status(%L, %L)', :'tok', 's'));

-- transitions and initial states, read by the guard (the view idem_machines
-- and the checks of the states' length read them too: they go first)
\set noview 'ALTER EXTENSION idem DROP VIEW idem_machines; DROP VIEW idem_machines; '
SELECT shape(:'noview' || $$ALTER TABLE idem.transitions ALTER COLUMN to_state TYPE integer USING length(to_state)$$,
             $$UPDATE shaped SET status = 'paid'$$);
SELECT shape(:'noview' || $$ALTER TABLE idem.transitions ALTER COLUMN from_state TYPE integer USING length(from_state)$$,
             $$SELECT idem_transition('shaped', '1', 'paid')$$);
SELECT shape(:'noview' || $$ALTER TABLE idem.transitions ALTER COLUMN machine TYPE varchar$$,
             $$SELECT idem_transition('shaped', '1', 'paid')$$);
SELECT shape(:'noview' || $$ALTER TABLE idem.initial_states DROP CONSTRAINT initial_states_state_check; ALTER TABLE idem.initial_states ALTER COLUMN state TYPE integer USING length(state)$$,
             $$INSERT INTO shaped VALUES (2, 'new')$$);

-- the request retention, read when a request is finished (its namespace's
-- type changed crashed the server; an added column or a primary key on the
-- other column made every namespace's retention the default, or XX000)
SELECT idem_request_set_retention('shaped', '1 hour');
SELECT status FROM idem_request_begin('shaped-req', 'f', 'shaped');
SELECT shape($$DELETE FROM idem.request_retention WHERE ns <> 'shaped'; ALTER TABLE idem.request_retention ALTER COLUMN ns TYPE integer USING 7$$,
             $$SELECT idem_request_finish('shaped-req', 200, NULL, 'shaped')$$);
SELECT shape($$ALTER TABLE idem.request_retention ADD COLUMN note text$$,
             $$SELECT idem_request_finish('shaped-req', 200, NULL, 'shaped')$$);
SELECT shape($$DELETE FROM idem.request_retention WHERE ns <> 'shaped'; ALTER TABLE idem.request_retention DROP CONSTRAINT request_retention_pkey; ALTER TABLE idem.request_retention ADD PRIMARY KEY (retention)$$,
             $$SELECT idem_request_finish('shaped-req', 200, NULL, 'shaped')$$);
SELECT shape($$ALTER TABLE idem.request_retention DROP CONSTRAINT request_retention_pkey$$,
             $$SELECT idem_request_finish('shaped-req', 200, NULL, 'shaped')$$);
-- as it was: the namespace's hour
SELECT idem_request_finish('shaped-req', 200, NULL, 'shaped');
SELECT expires_at - finished_at AS retention FROM idem.requests WHERE key = 'shaped-req';
DELETE FROM idem.requests WHERE key = 'shaped-req';
DELETE FROM idem.request_retention WHERE ns = 'shaped';

-- the server answered all along, and everything works again
SELECT idem_claim('after'), idem_claim('before'), idem_claim_info('before') IS NOT NULL AS info;
SELECT idem_token_status(:'tok', 's'), idem_token_consume(:'tok', 's');
SELECT idem_transition('shaped', '1', 'paid');
SELECT * FROM shaped;

DROP TABLE shaped;
DELETE FROM idem.transitions;
SELECT idem_release('before'), idem_release('after');
DROP FUNCTION shape(text, text);
