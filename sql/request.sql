-- request idempotency keys: every status of idem_request_begin, replay of
-- the stored result, checkpoints, release, expiry and purge
\set VERBOSITY terse

-- err(query): the SQLSTATE and message of the error the query raises
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;
-- row(key, ns): the stored row, without times
CREATE FUNCTION pg_temp.row(k text, n text DEFAULT 'default') RETURNS text LANGUAGE sql AS $$
    SELECT format('fp=%s owner=%s lease=%s point=%s data=%s code=%s body=%s attempts=%s finished=%s expires=%s',
                  left(fingerprint, 8), owner_pid = pg_backend_pid(), lease, recovery_point, recovery_data,
                  response_code, response_body, attempts, finished_at IS NOT NULL, expires_at IS NOT NULL)
      FROM idem.requests WHERE ns = n AND key = k;
$$;

-- the fingerprint of a payload: key order, whitespace and number notation do not matter
SELECT idem_request_fingerprint('{"amount": 100, "currency": "EUR"}') =
       idem_request_fingerprint('{ "currency":"EUR","amount":1.00e2 }') AS same_payload,
       idem_request_fingerprint('{"amount": 100, "currency": "EUR"}') =
       idem_request_fingerprint('{"amount": 101, "currency": "EUR"}') AS other_amount,
       idem_request_fingerprint('[1, 2]') = idem_request_fingerprint('[2, 1]') AS array_order,
       idem_request_fingerprint('"1"') = idem_request_fingerprint('1') AS string_number,
       idem_request_fingerprint('[1]') = idem_request_fingerprint('1') AS array_scalar,
       idem_request_fingerprint('{"a": "bc"}') = idem_request_fingerprint('{"ab": "c"}') AS split_strings,
       idem_request_fingerprint('{"a": null}') = idem_request_fingerprint('{}') AS null_member,
       length(idem_request_fingerprint('null')) AS length;
-- a fixed value: the digest must not change between versions
SELECT idem_request_fingerprint('{"b": [true, false, null, 1.50, "x"], "a": {}}');

-- new, then the same request again from this session: resume
SELECT status, response_code, response_body, recovery_point, attempts, created_at = now() AS now
  FROM idem_request_begin('k1', 'fp-1');
SELECT pg_temp.row('k1');
SELECT status, attempts FROM idem_request_begin('k1', 'fp-1');
-- another fingerprint: mismatch, and nothing is written
SELECT status, response_code, attempts FROM idem_request_begin('k1', 'fp-2');
SELECT pg_temp.row('k1');
-- a checkpoint, then the owner finishes
SELECT idem_request_checkpoint('k1', 'charged', '{"charge": "ch_1"}');
SELECT pg_temp.row('k1');
SELECT idem_request_finish('k1', 201, '{"id": 7, "amount": 100.50, "tags": ["a", "b"]}');
SELECT pg_temp.row('k1');
-- replay: the stored result, exactly
SELECT status, response_code, response_body, recovery_point, recovery_data, attempts
  FROM idem_request_begin('k1', 'fp-1');
SELECT (idem_request_begin('k1', 'fp-1')).response_body::text =
       '{"id": 7, "tags": ["a", "b"], "amount": 100.50}' AS exact_body;
SELECT status FROM idem_request_begin('k1', 'fp-2');
-- a finished request cannot be checkpointed or finished again
SELECT pg_temp.err($$SELECT idem_request_checkpoint('k1', 'again')$$);
SELECT pg_temp.err($$SELECT idem_request_finish('k1', 200)$$);

-- namespaces separate keys
SELECT status FROM idem_request_begin('k1', 'fp-9', 'other');
SELECT status FROM idem_request_begin('k1', 'fp-1');

-- cache => false releases the key: the next attempt runs anew, with any payload
SELECT status FROM idem_request_begin('k2', 'fp-1');
SELECT idem_request_finish('k2', 503, '{"error": "upstream"}', cache => false);
SELECT pg_temp.row('k2');
SELECT status, response_code, attempts FROM idem_request_begin('k2', 'fp-other');
SELECT pg_temp.row('k2');
SELECT pg_temp.err($$SELECT idem_request_finish('k2', 200)$$) AS owner_may_finish;
SELECT status, response_code, response_body FROM idem_request_begin('k2', 'fp-other');

-- a response without a body
SELECT status FROM idem_request_begin('k3', 'fp');
SELECT idem_request_finish('k3', 204);
SELECT status, response_code, response_body IS NULL AS no_body FROM idem_request_begin('k3', 'fp');

-- rollback: begin, checkpoint and finish go with the transaction
BEGIN;
SELECT status FROM idem_request_begin('k4', 'fp');
SELECT idem_request_finish('k4', 200, '{"ok": true}');
ROLLBACK;
SELECT pg_temp.row('k4') IS NULL AS nothing_kept;
SELECT status FROM idem_request_begin('k4', 'fp');
BEGIN;
SELECT idem_request_finish('k4', 200, '{"ok": true}');
SAVEPOINT s;
SELECT pg_temp.err($$SELECT idem_request_finish('k4', 500)$$);
ROLLBACK TO s;
COMMIT;
SELECT status, response_code FROM idem_request_begin('k4', 'fp');

-- an abandoned request: its owner's session is gone.  Make this session's
-- row look like another, gone, session's (pid 0 is no backend).
SELECT status FROM idem_request_begin('k5', 'fp');
SELECT idem_request_checkpoint('k5', 'step-2', '{"n": 2}');
UPDATE idem.requests SET owner_pid = 0 WHERE key = 'k5';
SELECT status, recovery_point, recovery_data, attempts FROM idem_request_begin('k5', 'fp');
SELECT pg_temp.row('k5');
-- a live owner, another session (the autovacuum launcher's pid and start
-- time): in flight while its lease lasts, resumed once it ran out
SELECT pid AS live_pid, backend_start AS live_started
  FROM pg_stat_activity WHERE backend_type = 'autovacuum launcher' \gset
UPDATE idem.requests SET owner_pid = :live_pid, owner_started = :'live_started',
                         lease_until = clock_timestamp() + interval '1 hour' WHERE key = 'k5';
SELECT status, attempts FROM idem_request_begin('k5', 'fp');
UPDATE idem.requests SET lease_until = clock_timestamp() - interval '1 second' WHERE key = 'k5';
SELECT status, attempts FROM idem_request_begin('k5', 'fp');
SELECT owner_pid = pg_backend_pid() AS taken_over FROM idem.requests WHERE key = 'k5';
-- a reused pid is not the owner: this session's own pid with another start
-- time is a session that is gone, resumed whatever its lease
UPDATE idem.requests SET owner_started = owner_started - interval '1 hour',
                         lease_until = clock_timestamp() + interval '1 hour' WHERE key = 'k5';
SELECT status, attempts FROM idem_request_begin('k5', 'fp');
SELECT pg_temp.err($$SELECT idem_request_finish('k5', 200)$$);
-- checkpoint and finish by a session that is not the owner are refused
UPDATE idem.requests SET owner_pid = 0 WHERE key = 'k5';
SELECT pg_temp.err($$SELECT idem_request_checkpoint('k5', 'x')$$);
SELECT pg_temp.err($$SELECT idem_request_finish('k5', 200)$$);
SELECT pg_temp.row('k5');

-- the count of attempts stops at the largest int4 instead of wrapping to a
-- negative count: a resumed attempt and a released one
SELECT status FROM idem_request_begin('k5b', 'fp');
UPDATE idem.requests SET owner_pid = 0, attempts = 2147483647 WHERE key = 'k5b';
SELECT status, attempts FROM idem_request_begin('k5b', 'fp');
SELECT idem_request_finish('k5b', 503, cache => false);
UPDATE idem.requests SET attempts = 2147483647 WHERE key = 'k5b';
SELECT status, attempts FROM idem_request_begin('k5b', 'fp');

-- a row restored from a Citus cluster names its owner's node: no session of
-- this server owns it, and off a cluster that session is not connected here,
-- so the attempt is resumed
SELECT status FROM idem_request_begin('k5c', 'fp');
UPDATE idem.requests SET owner_node = 2 WHERE key = 'k5c';
SELECT pg_temp.err($$SELECT idem_request_checkpoint('k5c', 'x')$$);
SELECT status, attempts FROM idem_request_begin('k5c', 'fp');
SELECT owner_node IS NULL AS no_node, owner_pid = pg_backend_pid() AS mine
  FROM idem.requests WHERE key = 'k5c';

-- expiry: a finished request is replayed until expires_at, then new
SELECT status FROM idem_request_begin('k6', 'fp');
SELECT idem_request_finish('k6', 200, '{"v": 1}');
SELECT expires_at - finished_at AS retention FROM idem.requests WHERE key = 'k6';
-- (in one transaction, whose now() stands still)
BEGIN;
UPDATE idem.requests SET expires_at = now() + interval '1 microsecond' WHERE key = 'k6';
SELECT status, response_code FROM idem_request_begin('k6', 'fp');
SELECT status FROM idem_request_begin('k6', 'fp-new');
UPDATE idem.requests SET expires_at = now() WHERE key = 'k6';
SELECT status, response_code, attempts FROM idem_request_begin('k6', 'fp-new');
SELECT pg_temp.row('k6');
COMMIT;

-- per-namespace retention
SELECT idem_request_set_retention('short', '10 minutes');
SELECT status FROM idem_request_begin('r1', 'fp', 'short');
SELECT idem_request_finish('r1', 200, NULL, 'short');
SELECT expires_at - finished_at AS retention FROM idem.requests WHERE ns = 'short' AND key = 'r1';
SELECT pg_temp.err($$SELECT idem_request_set_retention('short', '0')$$);
SELECT pg_temp.err($$SELECT idem_request_set_retention('short', '2 years')$$);
-- one year is 12 months, 366 days, or a mix of the two that adds up to no
-- more, a month counting as 30.4375 days (an interval compares it as 30)
SELECT pg_temp.err($$SELECT idem_request_set_retention('year', '1 year')$$) AS one_year,
       pg_temp.err($$SELECT idem_request_set_retention('year', '365 days')$$) AS days_365,
       pg_temp.err($$SELECT idem_request_set_retention('year', '8784 hours')$$) AS hours_8784,
       pg_temp.err($$SELECT idem_request_set_retention('year', '11 months 5 days')$$) AS months_and_days,
       pg_temp.err($$SELECT idem_request_set_retention('year', '11 months 31 days')$$) AS months_and_31_days,
       pg_temp.err($$SELECT idem_request_set_retention('year', '11 months 32 days')$$) AS months_and_32_days;
SELECT pg_temp.err($$SELECT idem_request_set_retention('year', '367 days')$$);
SELECT pg_temp.err($$SELECT idem_request_set_retention('year', '1 year 1 day')$$);
SELECT pg_temp.err($$SELECT idem_request_set_retention('year', '8784:00:01')$$);
SELECT pg_temp.err($$SELECT idem_request_set_retention('short', NULL)$$);
SELECT pg_temp.err($$SELECT idem_request_set_retention(NULL, '1 day')$$);

-- purge: only what expired, never inside its retention, never unfinished
SELECT status FROM idem_request_begin('p1', 'fp', 'purge');
SELECT idem_request_finish('p1', 200, NULL, 'purge');
SELECT status FROM idem_request_begin('p2', 'fp', 'purge');
SELECT idem_request_finish('p2', 200, NULL, 'purge');
SELECT status FROM idem_request_begin('p3', 'fp', 'purge');
BEGIN;
UPDATE idem.requests SET expires_at = now() WHERE ns = 'purge' AND key = 'p1';
UPDATE idem.requests SET expires_at = now() + interval '1 microsecond' WHERE ns = 'purge' AND key = 'p2';
SELECT idem_request_purge();
SELECT key FROM idem.requests WHERE ns = 'purge' ORDER BY key;
COMMIT;
SELECT status FROM idem_request_begin('p1', 'fp-new', 'purge');
SELECT pg_temp.err($$SELECT idem_request_purge(0)$$);
SELECT pg_temp.err($$SELECT idem_request_purge(NULL)$$);

-- bad input: clear errors, nothing written
SELECT pg_temp.err($$SELECT idem_request_begin(NULL, 'fp')$$);
SELECT pg_temp.err($$SELECT idem_request_begin('', 'fp')$$);
SELECT pg_temp.err($$SELECT idem_request_begin(repeat('k', 256), 'fp')$$);
SELECT (idem_request_begin(repeat('k', 255), 'fp')).status AS key_of_255_bytes;
SELECT pg_temp.err($$SELECT idem_request_begin('b1', NULL)$$);
SELECT pg_temp.err($$SELECT idem_request_begin('b1', '')$$);
SELECT pg_temp.err($$SELECT idem_request_begin('b1', repeat('f', 513))$$);
SELECT pg_temp.err($$SELECT idem_request_begin('b1', 'fp', NULL)$$);
SELECT pg_temp.err($$SELECT idem_request_begin('b1', 'fp', '')$$);
SELECT pg_temp.err($$SELECT idem_request_begin('b1', 'fp', repeat('n', 64))$$);
SELECT pg_temp.err($$SELECT idem_request_begin('b1', 'fp', 'default', NULL)$$);
SELECT pg_temp.err($$SELECT idem_request_begin('b1', 'fp', 'default', '0')$$);
SELECT pg_temp.err($$SELECT idem_request_begin('b1', 'fp', 'default', '-1 minute')$$);
SELECT pg_temp.err($$SELECT idem_request_begin('b1', 'fp', 'default', '1 day 1 second')$$);
-- months and mixed signs are refused: "at most a day" must not depend on the date
SELECT pg_temp.err($$SELECT idem_request_begin('b1', 'fp', 'default', '-1 month 31 days')$$);
SELECT pg_temp.err($$SELECT idem_request_begin('b1', 'fp', 'default', '1 day -1 second')$$);
SELECT pg_temp.err($$SELECT idem_request_begin('b1', 'fp', 'default', '1 month')$$);
SELECT (idem_request_begin('b3', 'fp', 'default', '23:59:59.999999')).status AS lease_under_a_day;
SELECT (idem_request_begin('b2', 'fp', 'default', '1 day')).status AS lease_of_a_day;
SELECT pg_temp.err($$SELECT idem_request_checkpoint('never', 'p')$$);
SELECT pg_temp.err($$SELECT idem_request_checkpoint('b2', NULL)$$);
SELECT pg_temp.err($$SELECT idem_request_checkpoint('b2', '')$$);
SELECT pg_temp.err($$SELECT idem_request_checkpoint('b2', repeat('p', 256))$$);
SELECT pg_temp.err($$SELECT idem_request_finish('never', 200)$$);
SELECT pg_temp.err($$SELECT idem_request_finish('b2', NULL)$$);
SELECT pg_temp.err($$SELECT idem_request_finish('b2', 99)$$);
SELECT pg_temp.err($$SELECT idem_request_finish('b2', 600)$$);
SELECT pg_temp.err($$SELECT idem_request_finish('b2', 200, NULL, 'default', NULL)$$);
SELECT pg_temp.err($$SELECT idem_request_fingerprint(NULL)$$);
SELECT count(*) FROM idem.requests WHERE key IN ('b1', 'never');
-- a request in flight has no entry in the purge's index
SELECT count(*) FILTER (WHERE expires_at IS NULL) > 0 AS in_flight_rows,
       pg_get_indexdef('idem.requests_expires_at_idx'::regclass) LIKE '%WHERE (expires_at IS NOT NULL)' AS partial
  FROM idem.requests;
SELECT pg_temp.row('b2');

-- leases and retentions count from the call that sets them, not from the
-- start of its transaction: a transaction longer than the lease must not
-- commit a lease already over, nor one longer than the retention a response
-- that is never replayed
BEGIN;
SELECT pg_sleep(0.1);
SELECT status FROM idem_request_begin('t1', 'fp', lease => '1 minute');
SELECT lease_until > now() + interval '1 minute' AS lease_from_begin FROM idem.requests WHERE key = 't1';
SELECT pg_sleep(0.1);
SELECT (SELECT lease_until FROM idem.requests WHERE key = 't1') AS before \gset
SELECT idem_request_checkpoint('t1', 'step-1');
SELECT lease_until > :'before' AS lease_renewed FROM idem.requests WHERE key = 't1';
SELECT idem_request_finish('t1', 201);
SELECT finished_at > now() AS finished_at_the_call, expires_at - finished_at AS retention
  FROM idem.requests WHERE key = 't1';
COMMIT;

-- a lease of a day is 24 hours, also when daylight saving time begins
-- within it in the session's time zone (here: at the hour 12 hours from now)
DO $$
DECLARE
    t timestamp := (clock_timestamp() AT TIME ZONE 'UTC') + interval '12 hours';
BEGIN
    EXECUTE format('SET TimeZone = %L', format('XST0XDT,%s/%s,%s/0',
        extract(doy FROM t)::int - 1, extract(hour FROM t)::int,
        (extract(doy FROM t)::int + 99) % 365));
END $$;
SELECT extract(epoch FROM (c + interval '1 day') - c) / 3600 AS calendar_day_hours
  FROM (SELECT clock_timestamp() AS c) AS t;
SELECT extract(epoch FROM clock_timestamp()) AS t0 \gset
SELECT status FROM idem_request_begin('dst', 'fp', lease => '1 day');
SELECT extract(epoch FROM lease_until) - :t0 BETWEEN 86400 AND 86460 AS lease_of_24_hours
  FROM idem.requests WHERE key = 'dst';
SELECT extract(epoch FROM clock_timestamp()) AS t0 \gset
SELECT idem_request_checkpoint('dst', 'step-1');
SELECT extract(epoch FROM lease_until) - :t0 BETWEEN 86400 AND 86460 AS renewed_for_24_hours
  FROM idem.requests WHERE key = 'dst';
SELECT idem_request_finish('dst', 200);
RESET TimeZone;
SELECT idem_request_set_retention('brief', '1 second');
BEGIN;
SELECT status FROM idem_request_begin('t2', 'fp', 'brief');
SELECT pg_sleep(1.1);
SELECT idem_request_finish('t2', 201, '{"id": 2}', 'brief');
SELECT expires_at > clock_timestamp() AS replayed_after_commit FROM idem.requests WHERE key = 't2';
COMMIT;

-- a lock of the caller's own transaction on the row (FOR KEY SHARE, FOR
-- UPDATE) is no other transaction's: begin answers as without it
BEGIN;
SELECT status FROM idem_request_begin('own-1', 'fp');
SELECT status, attempts FROM idem_request_begin('own-1', 'fp');
SELECT status FROM idem_request_begin('own-2', 'fp');
SELECT key FROM idem.requests WHERE key = 'own-2' FOR KEY SHARE;
SELECT status, attempts FROM idem_request_begin('own-2', 'fp');
SELECT status FROM idem_request_begin('own-3', 'fp');
SELECT key FROM idem.requests WHERE key = 'own-3' FOR UPDATE;
SELECT status, attempts FROM idem_request_begin('own-3', 'fp');
COMMIT;

-- under REPEATABLE READ, a request this transaction deleted, even in the
-- same command as the begin, is no concurrent deletion: new, not 40001
SELECT status FROM idem_request_begin('selfdel', 'fp');
SELECT idem_request_finish('selfdel', 503, NULL, cache => false);
BEGIN ISOLATION LEVEL REPEATABLE READ;
WITH d AS (DELETE FROM idem.requests WHERE key = 'selfdel' RETURNING key)
SELECT d.key, b.status FROM d, idem_request_begin('selfdel', 'fp') b;
ROLLBACK;
BEGIN ISOLATION LEVEL REPEATABLE READ;
DELETE FROM idem.requests WHERE key = 'selfdel';
SELECT status FROM idem_request_begin('selfdel', 'fp');
ROLLBACK;
