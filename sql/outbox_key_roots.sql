-- A lease that finds keys through their messages reads each key's row where
-- the primary key of idem.outbox_keys last said its chain of versions
-- begins, and takes what it finds there only when it is that key's row.
-- Here a key's row is removed (idem_outbox_purge, then VACUUM) and another
-- key's row takes its place: the lease must not take it for the first
-- key's, and finds the first key's new row through the primary key.  In a
-- database of its own, so that the table is new and the places are known.
\set VERBOSITY terse
SET client_min_messages = warning;
SELECT current_database() AS regress_db \gset
DROP DATABASE IF EXISTS idem_key_roots;
CREATE DATABASE idem_key_roots;
\c idem_key_roots
SET client_min_messages = warning;
CREATE EXTENSION idem;

SELECT idem_outbox_send('roots', 'a', '{"n": 1}') IS NOT NULL AS sent;
SELECT ctid AS a_was FROM idem.outbox_keys WHERE key = 'a' \gset
-- through the messages: this session notes where key a's row is
SELECT key, payload FROM idem_outbox_lease('r', 10, '1 hour');
SELECT idem_outbox_ack(array_agg(id)) AS acked FROM idem.outbox;

-- key a's row removed, its place freed, and taken by key b's new row
SELECT idem_outbox_purge() AS purged;
VACUUM idem.outbox_keys;
SELECT idem_outbox_send('roots', 'b', '{"n": 2}') IS NOT NULL AS sent;
SELECT ctid = :'a_was' AS b_took_its_place FROM idem.outbox_keys WHERE key = 'b';
SELECT idem_outbox_send('roots', 'a', '{"n": 3}') IS NOT NULL AS sent;

-- both keys' messages, each once
SELECT key, payload FROM idem_outbox_lease('r', 10, '1 hour') ORDER BY key;
SELECT key, leased_by IS NOT NULL AS leased FROM idem.outbox_keys ORDER BY key;

\c :regress_db
SET client_min_messages = warning;
DROP DATABASE idem_key_roots;
