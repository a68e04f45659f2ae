-- The catalogue of bad input: every call below is run and the SQLSTATE it
-- gives is compared with the one expected ('00000': the call must succeed).
-- Adding a case is adding one line to an INSERT below.
\set VERBOSITY terse

-- err(query): the SQLSTATE and message of the error the query raises
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

CREATE TEMP TABLE cases (
    id                  serial PRIMARY KEY,
    fn                  text NOT NULL,
    call                text NOT NULL,
    expected_sqlstate   text NOT NULL CHECK (expected_sqlstate ~ '^[0-9A-Z]{5}$')
);

--
-- consumer dedup (the keys of this file start with "bi_")
--
INSERT INTO cases (fn, call, expected_sqlstate) VALUES
('idem_claim',       $$SELECT idem_claim(NULL)$$,                                  '22004'),
('idem_claim',       $$SELECT idem_claim(NULL::text, NULL::text)$$,                '22004'),
('idem_claim',       $$SELECT idem_claim('bi_1', NULL)$$,                          '22004'),
('idem_claim',       $$SELECT idem_claim('')$$,                                    '22023'),
('idem_claim',       $$SELECT idem_claim('bi_1', '')$$,                            '22023'),
('idem_claim',       $$SELECT idem_claim(repeat('x', 513))$$,                      '22001'),
('idem_claim',       $$SELECT idem_claim(repeat('x', 1024 * 1024))$$,              '22001'),
('idem_claim',       $$SELECT idem_claim(repeat('é', 257))$$,                      '22001'),
('idem_claim',       $$SELECT idem_claim('bi_1', repeat('n', 64))$$,               '22001'),
('idem_claim',       $$SELECT idem_claim('bi_1', repeat('n', 1024 * 1024))$$,      '22001'),
('idem_claim',       $$SELECT idem_claim(1::int)$$,                                '42883'),
('idem_claim',       $$SELECT idem_claim('bi_1', 2::int)$$,                        '42883'),
('idem_claim',       $$SELECT idem_claim(ARRAY['bi_1'])$$,                         '42883'),
('idem_claim',       $$SELECT idem_claim()$$,                                      '42883'),
('idem_try_claim',   $$SELECT idem_try_claim(NULL)$$,                              '22004'),
('idem_try_claim',   $$SELECT idem_try_claim('bi_1', NULL)$$,                      '22004'),
('idem_try_claim',   $$SELECT idem_try_claim('')$$,                                '22023'),
('idem_try_claim',   $$SELECT idem_try_claim('bi_1', '')$$,                        '22023'),
('idem_try_claim',   $$SELECT idem_try_claim(repeat('x', 513))$$,                  '22001'),
('idem_try_claim',   $$SELECT idem_try_claim('bi_1', repeat('n', 64))$$,           '22001'),
('idem_try_claim',   $$SELECT idem_try_claim(1::int)$$,                            '42883'),
('idem_claim_batch', $$SELECT idem_claim_batch(NULL)$$,                            '22004'),
('idem_claim_batch', $$SELECT idem_claim_batch(ARRAY['bi_1', NULL])$$,             '22004'),
('idem_claim_batch', $$SELECT idem_claim_batch(ARRAY[NULL, 'bi_1'])$$,             '22004'),
('idem_claim_batch', $$SELECT idem_claim_batch(ARRAY['bi_1'], NULL)$$,             '22004'),
('idem_claim_batch', $$SELECT idem_claim_batch(ARRAY['bi_1', ''])$$,               '22023'),
('idem_claim_batch', $$SELECT idem_claim_batch(ARRAY['bi_1'], '')$$,               '22023'),
('idem_claim_batch', $$SELECT idem_claim_batch(ARRAY['bi_1', repeat('x', 513)])$$, '22001'),
('idem_claim_batch', $$SELECT idem_claim_batch(ARRAY[repeat('x', 1024 * 1024)])$$, '22001'),
('idem_claim_batch', $$SELECT idem_claim_batch(ARRAY['bi_1'], repeat('n', 64))$$,  '22001'),
('idem_claim_batch', $$SELECT idem_claim_batch(ARRAY[['bi_1'], ['bi_2']])$$,       '2202E'),
('idem_claim_batch', $$SELECT idem_claim_batch('{{bi_1,bi_2}}'::text[])$$,         '2202E'),
('idem_claim_batch', $$SELECT idem_claim_batch('bi_1')$$,                          '22P02'),
('idem_claim_batch', $$SELECT idem_claim_batch(ARRAY[1, 2])$$,                     '42883'),
('idem_claim_batch', $$SELECT idem_claim_batch('bi_1'::text)$$,                    '42883'),
('idem_claim_info',  $$SELECT idem_claim_info(NULL)$$,                             '22004'),
('idem_claim_info',  $$SELECT idem_claim_info('bi_1', NULL)$$,                     '22004'),
('idem_claim_info',  $$SELECT idem_claim_info('')$$,                               '22023'),
('idem_claim_info',  $$SELECT idem_claim_info(repeat('x', 513))$$,                 '22001'),
('idem_claim_info',  $$SELECT idem_claim_info('bi_1', repeat('n', 64))$$,          '22001'),
('idem_release',     $$SELECT idem_release(NULL)$$,                                '22004'),
('idem_release',     $$SELECT idem_release('bi_1', NULL)$$,                        '22004'),
('idem_release',     $$SELECT idem_release('', 'bi')$$,                            '22023'),
('idem_release',     $$SELECT idem_release(repeat('x', 513))$$,                    '22001'),
('idem_release',     $$SELECT idem_release('bi_1', repeat('n', 64))$$,             '22001'),
-- odd keys are keys like any other: these must succeed
('idem_claim',       $$SELECT idem_claim('bi_''; DROP TABLE cases; --')$$,        '00000'),
('idem_claim',       $$SELECT idem_claim('bi_1', '''; DROP TABLE cases; --')$$,   '00000'),
('idem_claim',       $$SELECT idem_claim(E'bi_\\')$$,                              '00000'),
('idem_claim',       $$SELECT idem_claim('bi_"quoted"', '"ns"')$$,                 '00000'),
('idem_claim',       $$SELECT idem_claim('bi_🎉🎉', '🎉')$$,                        '00000'),
('idem_claim',       $$SELECT idem_claim(E'bi_\t\n\r', E' \t')$$,                  '00000'),
('idem_claim',       $$SELECT idem_claim('bi_%_*?[]{}', '%')$$,                    '00000'),
('idem_claim',       $$SELECT idem_claim(' ', ' ')$$,                              '00000'),
('idem_claim',       $$SELECT idem_claim(repeat('x', 512), repeat('b', 63))$$,     '00000'),
('idem_try_claim',   $$SELECT idem_try_claim('bi_$$ || chr(1) || $$')$$,          '00000'),
('idem_claim_batch', $$SELECT idem_claim_batch('{}')$$,                            '00000'),
('idem_claim_batch', $$SELECT idem_claim_batch(ARRAY['bi_,', 'bi_{', 'bi_NULL'])$$, '00000'),
('idem_claim_info',  $$SELECT idem_claim_info('bi_''; DROP TABLE cases; --')$$,   '00000'),
('idem_release',     $$SELECT idem_release(E'bi_\\')$$,                            '00000');

--
-- retention (run as a superuser)
--
INSERT INTO cases (fn, call, expected_sqlstate) VALUES
('idem_set_retention', $$SELECT idem_set_retention(NULL, '1 day')$$,               '22004'),
('idem_set_retention', $$SELECT idem_set_retention('bi', NULL)$$,                  '22004'),
('idem_set_retention', $$SELECT idem_set_retention('', '1 day')$$,                 '22023'),
('idem_set_retention', $$SELECT idem_set_retention(repeat('n', 64), '1 day')$$,    '22001'),
('idem_set_retention', $$SELECT idem_set_retention('bi', '0')$$,                   '22023'),
('idem_set_retention', $$SELECT idem_set_retention('bi', '-1 day')$$,              '22023'),
('idem_set_retention', $$SELECT idem_set_retention('bi', '1 mon -29 days')$$,      '22023'),
('idem_set_retention', $$SELECT idem_set_retention('bi', '-1 mon 40 days')$$,      '22023'),
('idem_set_retention', $$SELECT idem_set_retention('bi', '1 day -00:00:01')$$,     '22023'),
('idem_set_retention', $$SELECT idem_set_retention('bi', 'soon')$$,                '22007'),
('idem_purge',         $$SELECT idem_purge('bi', NULL)$$,                          '22004'),
('idem_purge',         $$SELECT idem_purge('bi', 0)$$,                             '22023'),
('idem_purge',         $$SELECT idem_purge('bi', -1)$$,                            '22023'),
('idem_purge',         $$SELECT idem_purge('')$$,                                  '22023'),
('idem_purge',         $$SELECT idem_purge(repeat('n', 64))$$,                     '22001'),
('idem_purge',         $$SELECT idem_purge('bi', 1e10::bigint)$$,                  '42883'),
('idem_purge',         $$SELECT idem_purge('bi_never_used')$$,                     '00000');

--
-- single-use tokens
--
INSERT INTO cases (fn, call, expected_sqlstate) VALUES
('idem_token_issue',   $$SELECT idem_token_issue(NULL)$$,                          '22004'),
('idem_token_issue',   $$SELECT idem_token_issue('', NULL)$$,                      '22004'),
('idem_token_issue',   $$SELECT idem_token_issue('', '0 seconds')$$,               '22023'),
('idem_token_issue',   $$SELECT idem_token_issue('', '-1 minute')$$,               '22023'),
('idem_token_issue',   $$SELECT idem_token_issue('', '2 years')$$,                 '22023'),
('idem_token_issue',   $$SELECT idem_token_issue('', '100000 years')$$,            '22023'),
('idem_token_issue',   $$SELECT idem_token_issue(repeat('s', 64))$$,               '22001'),
('idem_token_issue',   $$SELECT idem_token_issue(repeat('s', 1024 * 1024))$$,      '22001'),
('idem_token_issue',   $$SELECT idem_token_issue('', 'soon')$$,                    '22007'),
('idem_token_issue',   $$SELECT idem_token_issue(1)$$,                             '42883'),
('idem_token_issue',   $$SELECT idem_token_issue('bi_''; DROP TABLE cases; --')$$, '00000'),
('idem_token_consume', $$SELECT idem_token_consume(NULL)$$,                        '22004'),
('idem_token_consume', $$SELECT idem_token_consume('x', NULL)$$,                   '22004'),
('idem_token_consume', $$SELECT idem_token_consume('x', repeat('s', 64))$$,        '22001'),
('idem_token_consume', $$SELECT idem_token_consume('')$$,                          '00000'),
('idem_token_consume', $$SELECT idem_token_consume(repeat('A', 43))$$,             '00000'),
('idem_token_consume', $$SELECT idem_token_consume(repeat('x', 1024 * 1024))$$,    '00000'),
('idem_token_consume', $$SELECT idem_token_consume('é€😀')$$,                     '00000'),
('idem_token_consume', $q$SELECT idem_token_consume('$$;DROP TABLE cases;--')$q$,  '00000'),
('idem_token_consume', $$SELECT idem_token_consume(42)$$,                          '42883'),
('idem_token_status',  $$SELECT idem_token_status(NULL)$$,                         '22004'),
('idem_token_status',  $$SELECT idem_token_status('x', NULL)$$,                    '22004'),
('idem_token_status',  $$SELECT idem_token_status('', '')$$,                       '00000'),
('idem_token_purge',   $$SELECT idem_token_purge(NULL)$$,                          '22004'),
('idem_token_purge',   $$SELECT idem_token_purge(0)$$,                             '22023'),
('idem_token_purge',   $$SELECT idem_token_purge(-5)$$,                            '22023'),
-- invalid UTF-8 never reaches idem: the server refuses it on the way in
('idem_claim',         $$SELECT idem_claim(convert_from('\xc328'::bytea, 'UTF8'))$$, '22021'),
('idem_claim',         $$SELECT idem_claim(E'bi_\xff')$$,                          '22021'),
('idem_token_consume', $$SELECT idem_token_consume(convert_from('\xff'::bytea, 'UTF8'))$$, '22021');

--
-- state-transition guard
--
SELECT idem_allow('bi_m', 'new', 'paid');
CREATE TABLE bi_orders (id bigint PRIMARY KEY, status text NOT NULL,
                        version bigint NOT NULL DEFAULT 0, payload text);
CREATE TABLE bi_plain (id bigint PRIMARY KEY, status text NOT NULL);
CREATE TABLE bi_nover (id bigint PRIMARY KEY, status text NOT NULL);
-- generated columns are computed after the guard's trigger: never guarded
CREATE TABLE bi_gen (id bigint PRIMARY KEY, raw text NOT NULL,
                     status text GENERATED ALWAYS AS (upper(raw)) STORED,
                     version bigint GENERATED ALWAYS AS (id * 2) STORED NOT NULL,
                     st text NOT NULL DEFAULT 'new');
CREATE TABLE bi_excl (id bigint PRIMARY KEY, status text NOT NULL, version bigint NOT NULL,
                      EXCLUDE USING btree (version WITH =));
CREATE VIEW bi_view AS SELECT * FROM bi_orders;
INSERT INTO bi_orders VALUES (1, 'new', 0, 'p');
INSERT INTO bi_nover VALUES (1, 'new');
SELECT idem_guard('bi_orders', 'bi_m', 'status', 'version');
SELECT idem_guard('bi_nover', 'bi_m', 'status');
INSERT INTO cases (fn, call, expected_sqlstate) VALUES
('idem_allow',         $$SELECT idem_allow(NULL, 'a', 'b')$$,                      '22004'),
('idem_allow',         $$SELECT idem_allow('bi_m', NULL, 'b')$$,                   '22004'),
('idem_allow',         $$SELECT idem_allow('bi_m', 'a', NULL)$$,                   '22004'),
('idem_allow',         $$SELECT idem_allow('', 'a', 'b')$$,                        '22023'),
('idem_allow',         $$SELECT idem_allow(repeat('m', 64), 'a', 'b')$$,           '22001'),
('idem_disallow',      $$SELECT idem_disallow(NULL, 'a', 'b')$$,                   '22004'),
('idem_disallow',      $$SELECT idem_disallow('', 'a', 'b')$$,                     '22023'),
('idem_guard',         $$SELECT idem_guard(NULL, 'bi_m', 'status')$$,              '22004'),
('idem_guard',         $$SELECT idem_guard('bi_plain', NULL, 'status')$$,          '22004'),
('idem_guard',         $$SELECT idem_guard('bi_plain', 'bi_m', NULL)$$,            '22004'),
('idem_guard',         $$SELECT idem_guard('bi_no_such_table', 'bi_m', 'status')$$, '42P01'),
('idem_guard',         $$SELECT idem_guard('bi_plain"; DROP TABLE cases; --', 'bi_m', 'status')$$, '42602'),
('idem_guard',         $$SELECT idem_guard('bi_plain', 'bi_m', 'nope')$$,          '42703'),
('idem_guard',         $$SELECT idem_guard('bi_plain', 'bi_m', 'status"; --')$$,   '42703'),
('idem_guard',         $$SELECT idem_guard('bi_plain', 'bi_m', 'status', 'status')$$, '22023'),
('idem_guard',         $$SELECT idem_guard('bi_orders', 'bi_m', 'status', 'payload')$$, '42804'),
('idem_guard',         $$SELECT idem_guard('bi_plain', 'bi_undefined', 'status')$$, '42704'),
('idem_guard',         $$SELECT idem_guard('bi_view', 'bi_m', 'status')$$,         '42809'),
('idem_guard',         $$SELECT idem_guard(0, 'bi_m', 'status')$$,                 '42P01'),
('idem_guard',         $$SELECT idem_guard('bi_excl', 'bi_m', 'status', 'version')$$, '55000'),
('ALTER TABLE',        $$ALTER TABLE bi_orders ADD EXCLUDE USING btree (version WITH =)$$, '2BP01'),
('idem_guard',         $$SELECT idem_guard('bi_gen', 'bi_m', 'status')$$,          '55000'),
('idem_guard',         $$SELECT idem_guard('bi_gen', 'bi_m', 'st', 'version')$$,   '55000'),
('CREATE TRIGGER',     $$CREATE TRIGGER bi_g BEFORE INSERT OR UPDATE ON bi_gen FOR EACH ROW EXECUTE FUNCTION idem_guard_trigger('bi_m', 'status')$$, '55000'),
('idem_unguard',       $$SELECT idem_unguard(NULL)$$,                              '22004'),
('idem_transition',    $$SELECT idem_transition(NULL, '1', 'paid')$$,              '22004'),
('idem_transition',    $$SELECT idem_transition('bi_orders', NULL, 'paid')$$,      '22004'),
('idem_transition',    $$SELECT idem_transition('bi_orders', '1', NULL)$$,         '22004'),
('idem_transition',    $$SELECT idem_transition('bi_orders', 'abc', 'paid')$$,     '22P02'),
('idem_transition',    $$SELECT idem_transition('bi_orders', '1; DROP TABLE cases', 'paid')$$, '22P02'),
('idem_transition',    $$SELECT idem_transition('bi_orders', '99999999999999999999', 'paid')$$, '22003'),
('idem_transition',    $$SELECT idem_transition('bi_plain', '1', 'paid')$$,        '55000'),
('idem_transition',    $$SELECT idem_transition('bi_nover', '1', 'paid', 0)$$,     '22023'),
('idem_transition',    $$SELECT idem_transition('bi_no_such_table', '1', 'paid')$$, '42P01'),
('idem_transition',    $$SELECT idem_transition('bi_orders', '99999', 'paid')$$,   '00000'),
('idem_transition',    $$SELECT idem_transition('bi_orders', '1', 'paid''; --')$$, '00000');

--
-- request idempotency keys
--
INSERT INTO cases (fn, call, expected_sqlstate) VALUES
('idem_request_begin',      $$SELECT idem_request_begin(NULL, 'fp')$$,                        '22004'),
('idem_request_begin',      $$SELECT idem_request_begin('', 'fp')$$,                          '22023'),
('idem_request_begin',      $$SELECT idem_request_begin(repeat('k', 256), 'fp')$$,            '22001'),
('idem_request_begin',      $$SELECT idem_request_begin(repeat('é', 128), 'fp')$$,            '22001'),
('idem_request_begin',      $$SELECT idem_request_begin('bi_r', NULL)$$,                      '22004'),
('idem_request_begin',      $$SELECT idem_request_begin('bi_r', '')$$,                        '22023'),
('idem_request_begin',      $$SELECT idem_request_begin('bi_r', repeat('f', 513))$$,          '22001'),
('idem_request_begin',      $$SELECT idem_request_begin('bi_r', 'fp', NULL)$$,                '22004'),
('idem_request_begin',      $$SELECT idem_request_begin('bi_r', 'fp', '')$$,                  '22023'),
('idem_request_begin',      $$SELECT idem_request_begin('bi_r', 'fp', repeat('n', 64))$$,     '22001'),
('idem_request_begin',      $$SELECT idem_request_begin('bi_r', 'fp', 'bi', NULL)$$,          '22004'),
('idem_request_begin',      $$SELECT idem_request_begin('bi_r', 'fp', 'bi', '0')$$,           '22023'),
('idem_request_begin',      $$SELECT idem_request_begin('bi_r', 'fp', 'bi', '2 days')$$,      '22023'),
('idem_request_begin',      $$SELECT idem_request_begin('bi_r', 'fp', 'bi', '1000000 years')$$, '22023'),
('idem_request_begin',      $$SELECT idem_request_begin('bi_r', 'fp', 'bi')$$,                '00000'),
('idem_request_checkpoint', $$SELECT idem_request_checkpoint('bi_never', 'p', NULL, 'bi')$$,  '55000'),
('idem_request_checkpoint', $$SELECT idem_request_checkpoint('bi_r', NULL, NULL, 'bi')$$,     '22004'),
('idem_request_checkpoint', $$SELECT idem_request_checkpoint('bi_r', '', NULL, 'bi')$$,       '22023'),
('idem_request_checkpoint', $$SELECT idem_request_checkpoint('bi_r', repeat('p', 256), NULL, 'bi')$$, '22001'),
('idem_request_checkpoint', $$SELECT idem_request_checkpoint(NULL, 'p')$$,                    '22004'),
('idem_request_checkpoint', $$SELECT idem_request_checkpoint('bi_r', 'p', 'x', 'bi')$$,       '22P02'),
('idem_request_finish',     $$SELECT idem_request_finish('bi_never', 200, NULL, 'bi')$$,      '55000'),
('idem_request_finish',     $$SELECT idem_request_finish('bi_r', NULL, NULL, 'bi')$$,         '22004'),
('idem_request_finish',     $$SELECT idem_request_finish('bi_r', 99, NULL, 'bi')$$,           '22023'),
('idem_request_finish',     $$SELECT idem_request_finish('bi_r', 600, NULL, 'bi')$$,          '22023'),
('idem_request_finish',     $$SELECT idem_request_finish('bi_r', -1, NULL, 'bi')$$,           '22023'),
('idem_request_finish',     $$SELECT idem_request_finish('bi_r', 200, NULL, 'bi', NULL)$$,    '22004'),
('idem_request_finish',     $$SELECT idem_request_finish(NULL, 200)$$,                        '22004'),
('idem_request_finish',     $$SELECT idem_request_finish('bi_r', 200, NULL, 'bi')$$,          '00000'),
('idem_request_finish',     $$SELECT idem_request_finish('bi_r', 200, NULL, 'bi')$$,          '55000'),
('idem_request_fingerprint', $$SELECT idem_request_fingerprint(NULL)$$,                       '22004'),
('idem_request_fingerprint', $$SELECT idem_request_fingerprint('{')$$,                        '22P02'),
('idem_request_set_retention', $$SELECT idem_request_set_retention('bi', NULL)$$,             '22004'),
('idem_request_set_retention', $$SELECT idem_request_set_retention('bi', '-1 day')$$,         '22023'),
('idem_request_set_retention', $$SELECT idem_request_set_retention('bi', '1 day -1 hour')$$,  '22023'),
('idem_request_set_retention', $$SELECT idem_request_set_retention('bi', '23:00')$$,           '00000'),
('idem_request_purge',      $$SELECT idem_request_purge(0)$$,                                 '22023'),
('idem_request_purge',      $$SELECT idem_request_purge(NULL)$$,                              '22004');

--
-- outbox and maintenance (administration, run as a superuser)
--
INSERT INTO cases (fn, call, expected_sqlstate) VALUES
('idem_outbox_purge',       $$SELECT idem_outbox_purge(NULL, 1)$$,                            '22004'),
('idem_outbox_purge',       $$SELECT idem_outbox_purge('-1 second', 1)$$,                     '22023'),
('idem_outbox_redrive',     $$SELECT idem_outbox_redrive('')$$,                               '22023'),
('idem_outbox_redrive',     $$SELECT idem_outbox_redrive('bi', '')$$,                         '22023'),
('idem_outbox_redrive',     $$SELECT idem_outbox_redrive(NULL, 'k')$$,                        '22004'),
('idem_outbox_purge',       $$SELECT idem_outbox_purge('2 minutes', 1)$$,                     '22023'),
('idem_outbox_purge',       $$SELECT idem_outbox_purge('1 minute 1 microsecond', 1)$$,        '22023'),
('idem_outbox_purge',       $$SELECT idem_outbox_purge('1 year -360 days 1 second', 1)$$,     '22023'),
('idem_outbox_purge',       $$SELECT idem_outbox_purge('-1 year 360 days 30 seconds', 1)$$,   '22023'),
('idem_outbox_purge',       $$SELECT idem_outbox_purge('-1 microsecond', 1)$$,                '22023'),
('idem_outbox_purge',       $$SELECT idem_outbox_purge('1 year -365 days -6 hours 30 seconds', 1)$$, '00000'),
('idem_outbox_lease',       $$SELECT * FROM idem_outbox_lease(repeat('r', 256))$$,            '22001'),
('idem_outbox_lease',       $$SELECT * FROM idem_outbox_lease(repeat('é', 128))$$,            '22001'),
('idem_outbox_nack',        $$SELECT idem_outbox_nack(gen_random_uuid(), 'e', NULL, '')$$,    '22023'),
('idem_outbox_nack',        $$SELECT idem_outbox_nack(gen_random_uuid(), 'e', NULL, repeat('r', 256))$$, '22001'),
('idem_outbox_nack',        $$SELECT idem_outbox_nack(gen_random_uuid(), 'e', NULL, repeat('r', 255))$$, '00000'),
('idem_outbox_nack',        $$SELECT idem_outbox_nack(gen_random_uuid(), 'e', '1 month')$$,   '22023'),
('idem_outbox_nack',        $$SELECT idem_outbox_nack(gen_random_uuid(), 'e', '1 day -1 hour')$$, '22023'),
('idem_outbox_nack',        $$SELECT idem_outbox_nack(gen_random_uuid(), 'e', '-1 day 1 hour')$$, '22023'),
('idem_outbox_configure',   $$SELECT idem_outbox_configure('bi', NULL, '1 second', '1 minute')$$, '22004'),
('idem_outbox_configure',   $$SELECT idem_outbox_configure('bi', 3, NULL, '1 minute')$$,      '22004'),
('idem_outbox_configure',   $$SELECT idem_outbox_configure('bi', 3, '1 second', NULL)$$,      '22004'),
('idem_maintenance',        $$SELECT * FROM idem_maintenance(NULL)$$,                         '22004'),
('idem_maintenance',        $$SELECT * FROM idem_maintenance(0)$$,                            '22023'),
('idem_maintenance',        $$SELECT * FROM idem_maintenance(1000001)$$,                      '22023');

-- Run every case once, in order, and keep what it gave: got is the SQLSTATE
-- ('00000' when the call succeeded).
CREATE TEMP TABLE outcomes AS
SELECT id, fn, expected_sqlstate AS expected,
       CASE WHEN r = 'no error' THEN '00000' ELSE left(r, 5) END AS got,
       CASE WHEN r = 'no error' THEN '' ELSE substr(r, 8) END AS message
  FROM (SELECT c.*, pg_temp.err(c.call) AS r FROM cases c ORDER BY c.id) s;

SELECT id, fn, expected, got,
       CASE WHEN got = expected THEN 'ok' ELSE 'MISMATCH' END AS result, message
  FROM outcomes ORDER BY id;

-- must be 0, and every case must have run
SELECT count(*) FILTER (WHERE got <> expected) AS mismatches,
       count(*) = (SELECT count(*) FROM cases) AS all_ran
  FROM outcomes;

-- the odd keys were claimed as given, byte for byte (E'bi_\\' was claimed,
-- then released), and the cases table is still there
SELECT to_json(left(ns, 20)) AS ns, to_json(left(msg_id, 20)) AS msg_id, octet_length(msg_id) AS bytes
  FROM idem.claims c
 WHERE c.msg_id LIKE 'bi\_%' OR c.msg_id = ' ' OR c.ns = repeat('b', 63)
 ORDER BY c.ns, c.msg_id;
SELECT idem_claim('bi_''; DROP TABLE cases; --') AS again,
       to_regclass('pg_temp.cases') IS NOT NULL AS cases_exists;

-- the guarded tables go, so that the extension can be dropped by later files
SELECT idem_unguard('bi_orders'), idem_unguard('bi_nover');
DROP VIEW bi_view;
DROP TABLE bi_orders, bi_plain, bi_nover, bi_gen, bi_excl;
SELECT idem_disallow('bi_m', 'new', 'paid');
