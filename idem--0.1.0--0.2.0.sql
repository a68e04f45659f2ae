/* idem--0.1.0--0.2.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idem UPDATE TO '0.2.0'" to load this file. \quit

-- Every statement of this script can run twice: Citus runs an extension's
-- update script on every node, where it meets objects it already changed.
-- CREATE OR REPLACE, IF NOT EXISTS, GRANT and REVOKE repeat as they are;
-- any other DDL on idem's tables goes through a catalog check.

-- ==== BEGIN secure defaults ====
-- idem_release makes any namespace's message be processed again: it is an
-- administration function, granted like the others.
REVOKE ALL ON FUNCTION idem_release(pg_catalog.text, pg_catalog.text) FROM PUBLIC;
-- Internal functions are called by idem's own functions, as their owner.
REVOKE ALL ON FUNCTION idem.retention_of(pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem._check_ns(pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem._transitions_changed() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem._check_transition(pg_catalog.text, pg_catalog.text, pg_catalog.text) FROM PUBLIC;
-- ==== END secure defaults ====

-- ==== BEGIN token key ====
-- The key that hides the hints of tokens is 256 bits from the server's
-- strong random source.  0.1.0 made it from two gen_random_uuid() values,
-- whose version and variant bits (12 of the 256) are fixed: such a key is
-- replaced.  A new key only costs the tokens issued before it the page their
-- hint saves (they are found through the primary key); no answer changes.
CREATE OR REPLACE FUNCTION idem._random_key()
RETURNS pg_catalog.bytea
AS 'MODULE_PATHNAME', 'idem_random_key'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION idem._random_key() IS
    'a new key for idem.token_key: 32 bytes from pg_strong_random (internal)';
REVOKE ALL ON FUNCTION idem._random_key() FROM PUBLIC;

UPDATE idem.token_key k
   SET key = idem._random_key()
 WHERE pg_catalog.octet_length(k.key) OPERATOR(pg_catalog.=) 32
   AND (pg_catalog.get_byte(k.key, 6) OPERATOR(pg_catalog.>>) 4) OPERATOR(pg_catalog.=) 4
   AND (pg_catalog.get_byte(k.key, 8) OPERATOR(pg_catalog.>>) 6) OPERATOR(pg_catalog.=) 2
   AND (pg_catalog.get_byte(k.key, 22) OPERATOR(pg_catalog.>>) 4) OPERATOR(pg_catalog.=) 4
   AND (pg_catalog.get_byte(k.key, 24) OPERATOR(pg_catalog.>>) 6) OPERATOR(pg_catalog.=) 2;
INSERT INTO idem.token_key AS k (only_row, key)
    VALUES (true, idem._random_key())
    ON CONFLICT (only_row) DO NOTHING;
COMMENT ON TABLE idem.token_key IS
    'key hiding the row address carried by each token (32 bytes from pg_strong_random, made at CREATE EXTENSION, not dumped); changing it slows the consumption of outstanding tokens, never changes an answer';
-- ==== END token key ====


