-- state-transition guard: machine names at the limit of 63 bytes, counted
-- in bytes (not characters), through every function that takes one; a guard
-- whose trigger names a longer machine (made by hand) is refused, and fails
-- where it fires, even when its first 63 bytes name a machine that exists.  The machines and
-- tables of this file start with "gb" (or are made of "m" and "é").
\set VERBOSITY terse

CREATE FUNCTION gb_err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END;
$$;

-- 63 bytes: in ASCII, and in two-byte characters (32 characters)
SELECT octet_length(repeat('m', 63)) AS ascii_bytes,
       octet_length(repeat('é', 31) || 'm') AS utf8_bytes,
       char_length(repeat('é', 31) || 'm') AS utf8_chars;
SELECT idem_allow(repeat('m', 63), 'new', 'paid') AS ascii,
       idem_allow(repeat('é', 31) || 'm', 'new', 'paid') AS utf8;
CREATE TABLE gb_ascii (id integer PRIMARY KEY, status text NOT NULL,
                       version integer NOT NULL DEFAULT 0);
CREATE TABLE gb_utf8 (LIKE gb_ascii INCLUDING ALL);
INSERT INTO gb_ascii (id, status) VALUES (1, 'new'), (2, 'new'), (3, 'new');
INSERT INTO gb_utf8 (id, status) VALUES (1, 'new'), (2, 'new'), (3, 'new');
SELECT idem_guard('gb_ascii', repeat('m', 63), 'status', 'version');
SELECT idem_guard('gb_utf8', repeat('é', 31) || 'm', 'status', 'version');
SELECT t, idem_transition(t, '1', 'paid') AS applied,
       idem_transition(t, '1', 'paid') AS retry,
       idem_transition(t, '2', 'shipped') AS illegal,
       gb_err(format($$UPDATE %I SET status = 'paid' WHERE id = 3$$, t)) AS by_update,
       gb_err(format($$UPDATE %I SET status = 'new' WHERE id = 3$$, t)) AS back
  FROM unnest(ARRAY['gb_ascii', 'gb_utf8']::regclass[]) t;
SELECT 'ascii' AS t, * FROM gb_ascii UNION ALL SELECT 'utf8', * FROM gb_utf8 ORDER BY 1, 2;
SELECT idem_disallow(repeat('m', 63), 'new', 'paid') AS ascii,
       idem_disallow(repeat('é', 31) || 'm', 'new', 'paid') AS utf8;

-- 64 bytes in 32 characters is too long, wherever a machine is named
SELECT gb_err($$SELECT idem_allow(repeat('é', 32), 'new', 'paid')$$) AS allow,
       gb_err($$SELECT idem_disallow(repeat('é', 32), 'new', 'paid')$$) AS disallow,
       gb_err($$SELECT idem_guard('gb_ascii', repeat('é', 32), 'status')$$) AS guard,
       gb_err($$SELECT idem_allow(repeat('m', 63) || 'é', 'new', 'paid')$$) AS allow_65;
SELECT count(*) AS stored FROM idem.transitions
 WHERE machine LIKE 'mmm%' OR machine LIKE 'ééé%';

-- a guard made by hand whose machine is 70 bytes long (its first 63 bytes
-- name a machine that allows new -> paid): refused when it is made, as
-- idem_guard refuses such a machine; made where event triggers do not fire,
-- it fails wherever it fires, and its first 63 bytes are never taken for a
-- machine
SELECT idem_allow(repeat('m', 63), 'new', 'paid');
SELECT idem_unguard('gb_ascii');
UPDATE gb_ascii SET status = 'new', version = 0;
SELECT gb_err(format('CREATE TRIGGER idem_guard BEFORE UPDATE ON gb_ascii FOR EACH ROW
                      EXECUTE FUNCTION idem_guard_trigger(%L, %L, %L)',
                     repeat('m', 70), 'status', 'version')) AS made;
SET session_replication_role = replica;
DO $$
BEGIN
    EXECUTE format('CREATE TRIGGER idem_guard BEFORE UPDATE ON gb_ascii FOR EACH ROW
                    EXECUTE FUNCTION idem_guard_trigger(%L, %L, %L)',
                   repeat('m', 70), 'status', 'version');
END;
$$;
RESET session_replication_role;
SELECT gb_err($$UPDATE gb_ascii SET status = 'paid' WHERE id = 1$$) AS by_update,
       gb_err($$SELECT idem_transition('gb_ascii', '2', 'paid')$$) AS by_transition,
       gb_err($$UPDATE gb_ascii SET version = version WHERE id = 3$$) AS to_same_state;
SELECT * FROM gb_ascii ORDER BY id;

DROP TABLE gb_ascii, gb_utf8;
DROP FUNCTION gb_err(text);
SELECT idem_disallow(repeat('m', 63), 'new', 'paid');
