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
