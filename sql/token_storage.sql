-- single-use tokens: what is stored, expiry and purge, HOT and non-HOT
-- consumption, an unlogged table
\set VERBOSITY terse
CREATE EXTENSION amcheck;
TRUNCATE idem.tokens;

-- the table holds the SHA-256 digest of the token's secret (its first 43
-- characters), and nothing equal to the token or to the random bytes it
-- encodes
SELECT idem_token_issue('store') AS t \gset
SELECT digest = sha256(convert_to(left(:'t', 43), 'UTF8')) AS digest_is_sha256,
       length(digest) AS digest_bytes
  FROM idem.tokens WHERE scope = 'store';
SELECT count(*) AS rows_holding_the_token
  FROM idem.tokens k
 WHERE strpos(k::text, :'t') > 0
    OR k.digest = convert_to(:'t', 'UTF8')
    OR position(convert_to(:'t', 'UTF8') IN k.digest) > 0
    OR position(convert_to(left(:'t', 43), 'UTF8') IN k.digest) > 0
    OR k.digest = decode(translate(left(:'t', 43), '-_', '+/') || '=', 'base64');
-- the digest is not a token: given as one, it is unknown
SELECT encode(digest, 'base64') AS digest_b64 FROM idem.tokens
 WHERE scope = 'store' \gset
SELECT idem_token_status(rtrim(translate(:'digest_b64', '+/', '-_'), '=') || right(:'t', 8), 'store'),
       idem_token_consume(rtrim(translate(:'digest_b64', '+/', '-_'), '=') || right(:'t', 8), 'store');
SELECT idem_token_status(:'t', 'store');

-- the table is kept by pg_dump with the extension
SELECT 'idem.tokens'::regclass = ANY (extconfig) AS dumped
  FROM pg_extension WHERE extname = 'idem';

-- expiry and purge: consumed tokens are kept until their expiry, so that
-- their status stays 'consumed'; then they go in batches
TRUNCATE idem.tokens;
SELECT idem_token_issue('purge', '2 seconds') AS p1 \gset
SELECT idem_token_issue('purge', '2 seconds') AS p2 \gset
SELECT idem_token_issue('purge', '2 seconds') AS p3 \gset
SELECT idem_token_issue('purge', '1 hour') AS p4 \gset
SELECT idem_token_consume(:'p3', 'purge'), idem_token_consume(:'p4', 'purge');
SELECT idem_token_purge();
SELECT pg_sleep(2.1);
SELECT idem_token_status(:'p1', 'purge') AS p1, idem_token_status(:'p2', 'purge') AS p2,
       idem_token_status(:'p3', 'purge') AS p3, idem_token_status(:'p4', 'purge') AS p4;
SELECT idem_token_purge(2);
SELECT idem_token_purge();
SELECT idem_token_purge();
SELECT idem_token_status(:'p1', 'purge') AS p1, idem_token_status(:'p2', 'purge') AS p2,
       idem_token_status(:'p3', 'purge') AS p3, idem_token_status(:'p4', 'purge') AS p4;
SELECT count(*) AS rows_left FROM idem.tokens;

-- consumption is a HOT update: the table leaves room on its pages
TRUNCATE idem.tokens;
CREATE TEMP TABLE hot AS
    SELECT idem_token_issue('hot') AS t FROM generate_series(1, 300);
SELECT h.t AS hot_token
  FROM hot h JOIN idem.tokens k
    ON k.scope = 'hot' AND k.digest = sha256(convert_to(left(h.t, 43), 'UTF8'))
 WHERE (k.ctid::text::point)[0] = 0
 LIMIT 1 \gset
BEGIN;
SELECT pg_stat_get_xact_tuples_updated('idem.tokens'::regclass) AS upd0,
       pg_stat_get_xact_tuples_hot_updated('idem.tokens'::regclass) AS hot0 \gset
SELECT idem_token_consume(:'hot_token', 'hot');
SELECT pg_stat_get_xact_tuples_updated('idem.tokens'::regclass) - :upd0 AS updated,
       pg_stat_get_xact_tuples_hot_updated('idem.tokens'::regclass) - :hot0 AS hot_updated;
COMMIT;
SELECT idem_token_status(:'hot_token', 'hot'), idem_token_consume(:'hot_token', 'hot');

-- on a full page the new version goes elsewhere and needs index entries
TRUNCATE idem.tokens;
ALTER TABLE idem.tokens SET (fillfactor = 100);
CREATE TEMP TABLE full_page AS
    SELECT idem_token_issue('full') AS t FROM generate_series(1, 300);
SELECT h.t AS full_token
  FROM full_page h JOIN idem.tokens k
    ON k.scope = 'full' AND k.digest = sha256(convert_to(left(h.t, 43), 'UTF8'))
 WHERE (k.ctid::text::point)[0] = 0
 LIMIT 1 \gset
BEGIN;
SELECT pg_stat_get_xact_tuples_updated('idem.tokens'::regclass) AS upd0,
       pg_stat_get_xact_tuples_hot_updated('idem.tokens'::regclass) AS hot0 \gset
SELECT idem_token_consume(:'full_token', 'full');
SELECT pg_stat_get_xact_tuples_updated('idem.tokens'::regclass) - :upd0 AS updated,
       pg_stat_get_xact_tuples_hot_updated('idem.tokens'::regclass) - :hot0 AS hot_updated;
COMMIT;
-- the new version is found through the primary key, and every index
-- holds every row
SELECT idem_token_status(:'full_token', 'full'), idem_token_consume(:'full_token', 'full');
SELECT (ctid::text::point)[0] > 0 AS moved_off_page_0, consumed_at IS NOT NULL AS consumed
  FROM idem.tokens
 WHERE scope = 'full' AND digest = sha256(convert_to(left(:'full_token', 43), 'UTF8'));
SELECT bt_index_check('idem.tokens_pkey', true),
       bt_index_check('idem.tokens_expires_at_idx', true);
SELECT count(*) FILTER (WHERE idem_token_consume(t, 'full')) AS consumed,
       count(*) FILTER (WHERE idem_token_status(t, 'full') = 'consumed') AS status_consumed
  FROM full_page;
SELECT bt_index_check('idem.tokens_pkey', true),
       bt_index_check('idem.tokens_expires_at_idx', true);
ALTER TABLE idem.tokens SET (fillfactor = 80);

-- with the table's fillfactor, consuming every token of a page, each in a
-- transaction of its own, leaves every version on its page: all HOT
-- updates (a version that does not fit goes to another page), pruned as
-- they go.  Rows of the default scope are the smallest, so the most of them
-- share a page.
TRUNCATE idem.tokens;
-- pruning needs no other snapshot of the database to see the old versions:
-- no autovacuum ANALYZE of the test's tables, none running now
CREATE TABLE pages WITH (autovacuum_enabled = off) AS
    SELECT n, idem_token_issue(s.scope) AS t
      FROM generate_series(1, 400) n,
           LATERAL (SELECT CASE WHEN n % 2 = 0 THEN '' ELSE 'tenant:' || n % 7 END AS scope) s;
CREATE TABLE page_rows WITH (autovacuum_enabled = off) AS
    SELECT p.n, p.t, k.scope, (k.ctid::text::point)[0] AS blk
      FROM pages p JOIN idem.tokens k
        ON k.digest = sha256(convert_to(left(p.t, 43), 'UTF8'));
SELECT count(*) AS tokens, count(DISTINCT blk) AS pages,
       min(c) AS fewest_rows_on_a_page
  FROM page_rows, LATERAL (SELECT count(*) AS c FROM page_rows r WHERE r.blk = page_rows.blk) x;
CREATE PROCEDURE consume_each() LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT t, scope FROM page_rows ORDER BY n LOOP
        IF NOT idem_token_consume(r.t, r.scope) THEN
            RAISE EXCEPTION 'token % not consumed', r.t;
        END IF;
        COMMIT;
    END LOOP;
END;
$$;
DO $$
BEGIN
	FOR i IN 1 .. 6000 LOOP
		PERFORM pg_stat_clear_snapshot();
		EXIT WHEN NOT EXISTS (SELECT FROM pg_stat_activity
							   WHERE datname = current_database()
								 AND pid <> pg_backend_pid()
								 AND backend_xmin IS NOT NULL);
		PERFORM pg_sleep(0.01);
	END LOOP;
END
$$;
CALL consume_each();
SELECT count(*) AS consumed,
       count(*) FILTER (WHERE (k.ctid::text::point)[0] = r.blk) AS on_their_page
  FROM page_rows r JOIN idem.tokens k
    ON k.scope = r.scope AND k.digest = sha256(convert_to(left(r.t, 43), 'UTF8'))
 WHERE k.consumed_at IS NOT NULL;
DROP PROCEDURE consume_each();
DROP TABLE pages, page_rows;

-- an unlogged table works the same way
SELECT idem_token_issue('unlogged') AS before_unlogged \gset
ALTER TABLE idem.tokens SET UNLOGGED;
SELECT c.relname, c.relpersistence
  FROM pg_class c
 WHERE c.oid = 'idem.tokens'::regclass
    OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'idem.tokens'::regclass)
 ORDER BY c.relname;
SELECT idem_token_issue('unlogged') AS u \gset
SELECT idem_token_status(:'u', 'unlogged'), idem_token_consume(:'u', 'unlogged'),
       idem_token_consume(:'u', 'unlogged'), idem_token_status(:'u', 'unlogged');
SELECT idem_token_consume(:'before_unlogged', 'unlogged');
SELECT idem_token_issue('unlogged') AS u2 \gset
BEGIN;
SELECT idem_token_consume(:'u2', 'unlogged');
ROLLBACK;
SELECT idem_token_status(:'u2', 'unlogged');
SELECT idem_token_issue('unlogged', '1 second') AS u3 \gset
SELECT pg_sleep(1.2);
SELECT idem_token_status(:'u3', 'unlogged');
SELECT idem_token_purge();
ALTER TABLE idem.tokens SET LOGGED;
SELECT relpersistence FROM pg_class WHERE oid = 'idem.tokens'::regclass;
SELECT idem_token_status(:'u', 'unlogged'), idem_token_status(:'u2', 'unlogged'),
       idem_token_consume(:'u2', 'unlogged'), idem_token_status(:'u3', 'unlogged');

DROP EXTENSION amcheck;
