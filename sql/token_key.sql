-- single-use tokens: the key that hides the hints is 256 random bits from
-- pg_strong_random, with no bit fixed (a key made from UUIDs has 12)
\set VERBOSITY terse

SELECT octet_length(key) AS key_bytes FROM idem.token_key;

-- 256 new keys: all different, and each of the 256 bit positions is set in
-- some and clear in others (a fixed bit would be set in all or none; by
-- chance that happens to one position with probability 2^-247)
CREATE TEMP TABLE keys AS SELECT idem._random_key() AS k FROM generate_series(1, 256);
SELECT count(*) AS keys, count(DISTINCT k) AS distinct_keys,
       min(octet_length(k)) AS min_bytes, max(octet_length(k)) AS max_bytes
  FROM keys;
SELECT count(*) AS fixed_bits
  FROM generate_series(0, 255) b
 WHERE (SELECT count(*) FROM keys WHERE get_bit(k, b) = 1) IN (0, 256);
-- the version and variant bits of two UUIDs (bytes 6 and 8, 22 and 24)
-- come out as often as chance has them, not in every key
SELECT count(*) FILTER (WHERE get_byte(k, 6) >> 4 = 4 AND get_byte(k, 8) >> 6 = 2
                          AND get_byte(k, 22) >> 4 = 4 AND get_byte(k, 24) >> 6 = 2) < 8
       AS uuid_shaped_by_chance_only
  FROM keys;

-- an internal function: not for PUBLIC
CREATE ROLE idem_key_app;
GRANT USAGE ON SCHEMA idem TO idem_key_app;
SET ROLE idem_key_app;
SELECT idem._random_key();
RESET ROLE;
REVOKE USAGE ON SCHEMA idem FROM idem_key_app;
DROP ROLE idem_key_app;

-- the hint of a token is its row's place hidden by the key: decoded with
-- the committed key, it gives the row's ctid.  A session keeps the key only
-- once it read it from a committed row: a key its own transaction wrote and
-- rolled back, or none seen (a deleted row), is not kept for later tokens.
CREATE FUNCTION tk_hint_is_row(tok text, s text) RETURNS boolean LANGUAGE sql AS $$
    SELECT (SELECT ctid FROM idem.tokens WHERE scope = s) =
           format('(%s,%s)',
                  ((get_byte(h, 0) # get_byte(p, 0))::bigint << 24) + ((get_byte(h, 1) # get_byte(p, 1)) << 16)
                  + ((get_byte(h, 2) # get_byte(p, 2)) << 8) + (get_byte(h, 3) # get_byte(p, 3)),
                  ((get_byte(h, 4) # get_byte(p, 4)) << 8) + (get_byte(h, 5) # get_byte(p, 5)))::tid
      FROM (SELECT decode(translate(right(tok, 8), '-_', '+/'), 'base64') AS h,
                   sha256((SELECT key FROM idem.token_key)
                          || (SELECT digest FROM idem.tokens WHERE scope = s)) AS p) x
$$;
\c
SELECT tk_hint_is_row(idem_token_issue('tk_hint_1'), 'tk_hint_1') AS hint_of_committed_key;
\c
-- the first token of this session in a transaction that changes the key
BEGIN;
UPDATE idem.token_key SET key = idem._random_key();
SELECT tk_hint_is_row(idem_token_issue('tk_hint_2'), 'tk_hint_2') AS hint_of_own_key;
ROLLBACK;
SELECT tk_hint_is_row(idem_token_issue('tk_hint_3'), 'tk_hint_3') AS hint_of_committed_key_after_rollback;
\c
-- and in one that deleted the key row
BEGIN;
DELETE FROM idem.token_key;
SELECT length(idem_token_issue('tk_hint_4')) AS token_without_key;
ROLLBACK;
SELECT tk_hint_is_row(idem_token_issue('tk_hint_5'), 'tk_hint_5') AS hint_of_committed_key_after_rollback;
DROP FUNCTION tk_hint_is_row(text, text);
DELETE FROM idem.tokens WHERE scope LIKE 'tk\_hint\_%';
