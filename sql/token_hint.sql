-- single-use tokens: the hint (the last 8 characters of a token) says where
-- the token's row is, hidden by the key in idem.token_key.  It saves the
-- descent of the primary key and never changes an answer.
\set VERBOSITY terse
TRUNCATE idem.tokens;

-- descents of the primary key made so far in this session
CREATE FUNCTION pk_scans() RETURNS bigint LANGUAGE sql
AS $$ SELECT pg_stat_get_xact_numscans('idem.tokens_pkey'::regclass) $$;

-- the 48 bits that hide the hint of a token: the first 6 bytes of
-- SHA-256(key || digest of the secret)
CREATE FUNCTION hint_pad(token text) RETURNS int8 LANGUAGE sql
AS $$
    SELECT ('x' || encode(substr(sha256(k.key || sha256(convert_to(left(token, 43), 'UTF8'))), 1, 6), 'hex'))::bit(48)::int8
      FROM idem.token_key k
$$;
-- the row address a token's hint stands for
CREATE FUNCTION hint_tid(token text) RETURNS tid LANGUAGE sql
AS $$
    SELECT format('(%s,%s)', v >> 16, v & 65535)::tid
      FROM (SELECT ('x' || encode(decode(translate(right(token, 8), '-_', '+/'), 'base64'), 'hex'))::bit(48)::int8
                   # hint_pad(token) AS v) s
$$;
-- the token with its hint made to point at (blk, off)
CREATE FUNCTION with_hint(token text, blk int8, off int) RETURNS text LANGUAGE sql
AS $$
    SELECT left(token, 43) ||
           translate(encode(substr(int8send(((blk << 16) | off) # hint_pad(token)), 3, 6), 'base64'), '+/', '-_')
$$;

-- the hint of an issued token is the address of its row, and does not show it
SELECT idem_token_issue('h') AS t1, idem_token_issue('h') AS t2 \gset
SELECT hint_tid(:'t1') = k.ctid AS hint_is_row_address
  FROM idem.tokens k
 WHERE k.scope = 'h' AND k.digest = sha256(convert_to(left(:'t1', 43), 'UTF8'));
CREATE TEMP TABLE issued AS
SELECT n, idem_token_issue('many') AS t FROM generate_series(1, 50) n;
SELECT count(*) AS tokens,
       count(*) FILTER (WHERE hint_tid(t) = k.ctid) AS hints_decoded,
       count(*) FILTER (WHERE right(t, 8) = translate(encode(substr(int8send(
           (((k.ctid::text::point)[0])::int8 << 16) | ((k.ctid::text::point)[1])::int8), 3, 6),
           'base64'), '+/', '-_')) AS hints_in_clear
  FROM issued i JOIN idem.tokens k
    ON k.scope = 'many' AND k.digest = sha256(convert_to(left(i.t, 43), 'UTF8'));
-- consecutive rows, yet the hints of consecutive tokens do not follow
SELECT count(*) FILTER (WHERE right(a.t, 8) < right(b.t, 8)) < 49 AS hints_not_ordered
  FROM issued a JOIN issued b ON b.n = a.n + 1;

-- consumption and status read the row at the hint: no descent of the index
BEGIN;
SELECT pk_scans() AS s0 \gset
SELECT idem_token_status(:'t1', 'h') AS status, idem_token_consume(:'t1', 'h') AS consumed,
       idem_token_consume(:'t1', 'h') AS again, idem_token_status(:'t1', 'h') AS status_after;
SELECT pk_scans() - :s0 AS index_descents;
COMMIT;
-- the consumed row, pruned or not, is still found at the hint
BEGIN;
SELECT pk_scans() AS s0 \gset
SELECT idem_token_status(:'t1', 'h'), idem_token_consume(:'t1', 'h');
SELECT pk_scans() - :s0 AS index_descents;
COMMIT;
-- a hint for another scope's look-up: the row is not that scope's
SELECT idem_token_status(:'t2', 'other'), idem_token_consume(:'t2', 'other');

-- an altered hint is the same token: the index finds it, once
BEGIN;
SELECT pk_scans() AS s0 \gset
SELECT idem_token_consume(with_hint(:'t2', 0, 0), 'h') AS consumed_with_offset_0,
       idem_token_consume(:'t2', 'h') AS again_with_its_hint,
       idem_token_status(with_hint(:'t2', 4294967295, 65535), 'h') AS status_with_last_address;
SELECT pk_scans() - :s0 AS index_descents;
COMMIT;

-- hints pointing at other rows, past the end of the table, at unused
-- offsets: every answer is the one the index gives
SELECT n, t, with_hint(t, b.blk, b.off) AS forged
  INTO TEMP forged
  FROM issued,
       LATERAL (SELECT (n * 7919) % 3 AS blk, (n * 31) % 300 AS off) b
 WHERE n <= 40;
INSERT INTO forged
SELECT 100 + n, t, with_hint(t, x.blk, x.off)
  FROM issued, (VALUES (4294967295::int8, 1), (1000000, 1), (0, 65535), (0, 291), (2147483648, 7)) x(blk, off)
 WHERE n BETWEEN 41 AND 45;
SELECT count(*) AS forged,
       count(*) FILTER (WHERE idem_token_status(forged, 'many') = 'valid') AS valid_before,
       count(*) FILTER (WHERE idem_token_consume(forged, 'many')) AS consumed,
       count(*) FILTER (WHERE idem_token_status(forged, 'many') = 'consumed') AS consumed_after
  FROM forged;
-- each was consumed once, and no other token with it
SELECT count(*) FILTER (WHERE idem_token_consume(t, 'many')) AS consumed_again,
       count(*) FILTER (WHERE idem_token_status(t, 'many') = 'consumed') AS consumed
  FROM issued WHERE n <= 40;
SELECT count(*) AS untouched FROM issued
 WHERE n > 45 AND idem_token_status(t, 'many') = 'valid';

-- rows moved by VACUUM FULL: the hints point at the wrong places, the
-- answers stay right
SELECT idem_token_issue('moved') AS m1 \gset
SELECT idem_token_issue('moved') AS m2 \gset
SELECT idem_token_consume(:'m1', 'moved');
DELETE FROM idem.tokens WHERE scope = 'many';
VACUUM FULL idem.tokens;
SELECT hint_tid(:'m2') <> k.ctid AS row_moved
  FROM idem.tokens k
 WHERE k.scope = 'moved' AND k.digest = sha256(convert_to(left(:'m2', 43), 'UTF8'));
BEGIN;
SELECT pk_scans() AS s0 \gset
SELECT idem_token_status(:'m1', 'moved') AS m1, idem_token_status(:'m2', 'moved') AS m2,
       idem_token_consume(:'m1', 'moved') AS m1_consumed,
       idem_token_consume(:'m2', 'moved') AS m2_consumed,
       idem_token_consume(:'m2', 'moved') AS m2_again;
SELECT pk_scans() - :s0 > 0 AS index_descended;
COMMIT;

-- a new key (or none) leaves every answer as it was; sessions read the
-- key once, so a new session sees the change
SELECT idem_token_issue('key') AS k1, idem_token_issue('key') AS k2 \gset
UPDATE idem.token_key SET key = sha256('another key');
\c
SELECT idem_token_status(:'k1', 'key'), idem_token_consume(:'k1', 'key'),
       idem_token_consume(:'k1', 'key');
SELECT idem_token_issue('key') AS k3 \gset
DELETE FROM idem.token_key;
\c
SELECT idem_token_status(:'k2', 'key'), idem_token_status(:'k3', 'key');
SELECT idem_token_issue('key') AS k4 \gset
SELECT idem_token_consume(:'k2', 'key'), idem_token_consume(:'k3', 'key'),
       idem_token_consume(:'k4', 'key'), idem_token_consume(:'k4', 'key');
-- a key of the wrong length is not used either
INSERT INTO idem.token_key VALUES (true, sha256('k'));
ALTER TABLE idem.token_key DROP CONSTRAINT token_key_key_check;
UPDATE idem.token_key SET key = '\x0102';
\c
SELECT idem_token_issue('key') AS k5 \gset
SELECT idem_token_consume(:'k5', 'key'), idem_token_consume(:'k5', 'key');
UPDATE idem.token_key SET key = sha256('k');
ALTER TABLE idem.token_key ADD CONSTRAINT token_key_key_check CHECK (octet_length(key) = 32);

-- a parallel worker reads the key for itself, with the query's snapshot
\c
SET force_parallel_mode = on;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
EXPLAIN (COSTS OFF) SELECT idem_token_status(:'k4', 'key');
SELECT idem_token_status(:'k4', 'key') AS k4, idem_token_status(:'k5', 'key') AS k5,
       idem_token_status(:'k2', 'key') AS k2;
RESET force_parallel_mode;
RESET parallel_setup_cost;
RESET parallel_tuple_cost;

-- without the key table at all, tokens still work
ALTER EXTENSION idem DROP TABLE idem.token_key;
ALTER TABLE idem.token_key RENAME TO token_key_away;
\c
SELECT idem_token_issue('nokey') AS n1 \gset
SELECT idem_token_status(:'n1', 'nokey'), idem_token_consume(:'n1', 'nokey'),
       idem_token_consume(:'n1', 'nokey');
ALTER TABLE idem.token_key_away RENAME TO token_key;
ALTER EXTENSION idem ADD TABLE idem.token_key;
\c
SELECT idem_token_status(:'n1', 'nokey') AS n1_with_the_key_back;
