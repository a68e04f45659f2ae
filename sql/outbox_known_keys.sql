-- A session that knows a key to have its row in idem.outbox_keys sends
-- without looking for it.  A key is known only once the transaction that
-- made sure of its row committed, and forgotten when key rows are deleted:
-- every committed message must have its key's row, or no relay leases it.
\set VERBOSITY terse

CREATE FUNCTION has_row(k text) RETURNS boolean LANGUAGE sql AS
    $$ SELECT EXISTS (SELECT 1 FROM idem.outbox_keys WHERE topic = 'kk' AND key = k) $$;
-- the SQLSTATE and message of the error a statement raises
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;
-- leases and acknowledges until nothing is left (a lease holds one message
-- of a key)
CREATE FUNCTION deliver() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    total bigint := 0;
    n bigint;
BEGIN
    LOOP
        SELECT idem_outbox_ack(coalesce(array_agg(id), '{}')) INTO n
          FROM idem_outbox_lease('kk-relay', 10000) WHERE topic = 'kk';
        EXIT WHEN n = 0;
        total := total + n;
    END LOOP;
    RETURN total;
END;
$$;

-- a key row inserted by a transaction that rolls back
BEGIN;
SELECT idem_outbox_send('kk', 'a', '{}') IS NOT NULL AS sent;
ROLLBACK;
SELECT idem_outbox_send('kk', 'a', '{}') IS NOT NULL AS sent;
SELECT has_row('a');

-- by a subtransaction that rolls back, in a transaction that commits
BEGIN;
SAVEPOINT s;
SELECT idem_outbox_send('kk', 'b', '{}') IS NOT NULL AS sent;
ROLLBACK TO SAVEPOINT s;
SELECT idem_outbox_send('kk', 'c', '{}') IS NOT NULL AS sent;
COMMIT;
SELECT idem_outbox_send('kk', 'b', '{}') IS NOT NULL AS sent;
SELECT has_row('b');

-- by a prepared transaction rolled back later
BEGIN;
SELECT idem_outbox_send('kk', 'd', '{}') IS NOT NULL AS sent;
PREPARE TRANSACTION 'kk_prepared';
ROLLBACK PREPARED 'kk_prepared';
SELECT idem_outbox_send('kk', 'd', '{}') IS NOT NULL AS sent;
SELECT has_row('d');

-- a key known, then purged: the next send makes its row again
SELECT idem_outbox_send('kk', 'e', '{}') IS NOT NULL AS sent;
SELECT idem_outbox_send('kk', 'e', '{}') IS NOT NULL AS sent;
SELECT deliver();
SELECT idem_outbox_purge() > 0 AS purged, has_row('e');
SELECT idem_outbox_send('kk', 'e', '{}') IS NOT NULL AS sent;
SELECT has_row('e');

-- sent, delivered and purged in the transaction that made sure of the row
BEGIN;
SELECT idem_outbox_send('kk', 'f', '{}') IS NOT NULL AS sent;
SELECT deliver();
SELECT idem_outbox_purge() > 0 AS purged, has_row('f');
COMMIT;
SELECT idem_outbox_send('kk', 'f', '{}') IS NOT NULL AS sent;
SELECT has_row('f');

-- deleted by hand, or truncated
SELECT idem_outbox_send('kk', 'g', '{}') IS NOT NULL AS sent;
SELECT deliver();
DELETE FROM idem.outbox_keys WHERE topic = 'kk' AND key = 'g';
SELECT idem_outbox_send('kk', 'g', '{}') IS NOT NULL AS sent;
SELECT has_row('g');
SELECT deliver();
TRUNCATE idem.outbox_keys;
SELECT idem_outbox_send('kk', 'g', '{}') IS NOT NULL AS sent;
SELECT has_row('g');

-- deleted in the statement that sends: the trigger makes the session forget
SELECT idem_outbox_send('kk', 'h', '{}') IS NOT NULL AS sent;
SELECT deliver();
WITH d AS (DELETE FROM idem.outbox_keys WHERE topic = 'kk' AND key = 'h' RETURNING 1)
SELECT idem_outbox_send('kk', 'h', '{}') IS NOT NULL AS sent FROM d;
SELECT has_row('h');
SELECT deliver();

-- with the trigger disabled the session looks for its key's row every time,
-- since a DELETE would not make it forget
SELECT idem_outbox_send('kk', 'i', '{}') IS NOT NULL AS sent;
SELECT deliver();
ALTER TABLE idem.outbox_keys DISABLE TRIGGER outbox_keys_deleted;
SELECT idem_outbox_send('kk', 'i', '{}') IS NOT NULL AS sent;
SELECT deliver();
DELETE FROM idem.outbox_keys WHERE topic = 'kk' AND key = 'i';
SELECT idem_outbox_send('kk', 'i', '{}') IS NOT NULL AS sent;
SELECT has_row('i');
SELECT deliver();
ALTER TABLE idem.outbox_keys ENABLE ALWAYS TRIGGER outbox_keys_deleted;
-- the trigger only fires before a DELETE of each row (39P01)
SELECT pg_temp.err($$SELECT idem._outbox_keys_deleted()$$);

-- deleted under session_replication_role = replica, as in a logical
-- replication worker: the trigger is ENABLE ALWAYS, so it fires there too.
-- The DELETE waits for the senders in flight (its SHARE lock on the table),
-- and the session forgets the key: its next send makes the row again, and
-- the key's messages are leased, those sent before the DELETE included.
SELECT idem_outbox_send('kk', 'x', '{"n": 1}') IS NOT NULL AS sent;
SELECT idem_outbox_send('kk', 'x', '{"n": 2}') IS NOT NULL AS sent;
BEGIN;
SET LOCAL session_replication_role = replica;
DELETE FROM idem.outbox_keys WHERE topic = 'kk' AND key = 'x';
SELECT string_agg(mode, ', ' ORDER BY mode) AS locks FROM pg_locks
 WHERE locktype = 'relation' AND relation = 'idem.outbox_keys'::regclass
   AND pid = pg_backend_pid() AND granted;
COMMIT;
SHOW session_replication_role;
SELECT has_row('x');
SELECT idem_outbox_send('kk', 'x', '{"n": 3}') IS NOT NULL AS sent;
SELECT has_row('x');
SELECT key, payload, attempt, idem_outbox_ack(ARRAY[id]) AS acked
  FROM idem_outbox_lease('kk-relay', 10000) WHERE topic = 'kk';
SELECT key, payload, attempt, idem_outbox_ack(ARRAY[id]) AS acked
  FROM idem_outbox_lease('kk-relay', 10000) WHERE topic = 'kk';
SELECT key, payload, attempt, idem_outbox_ack(ARRAY[id]) AS acked
  FROM idem_outbox_lease('kk-relay', 10000) WHERE topic = 'kk';
-- a key whose messages were all delivered, its row removed by
-- idem_outbox_purge under replica (as a replication worker applies a purge
-- made on the publisher): the same
SELECT idem_outbox_send('kk', 'y', '{}') IS NOT NULL AS sent;
SELECT idem_outbox_send('kk', 'y', '{}') IS NOT NULL AS sent;
SELECT deliver();
SET session_replication_role = replica;
SELECT idem_outbox_purge() > 0 AS purged;
RESET session_replication_role;
SELECT has_row('y');
SELECT idem_outbox_send('kk', 'y', '{"n": "y"}') IS NOT NULL AS sent;
SELECT has_row('y');
SELECT key, payload, attempt, idem_outbox_ack(ARRAY[id]) AS acked
  FROM idem_outbox_lease('kk-relay', 10000) WHERE topic = 'kk';

-- every message sent here is leased
SELECT count(*) AS undelivered FROM idem.outbox WHERE aggregatetype = 'kk';
SELECT deliver() AS delivered;
SELECT count(*) AS undelivered FROM idem.outbox WHERE aggregatetype = 'kk';

DELETE FROM idem.outbox_keys WHERE topic = 'kk';
DROP FUNCTION has_row(text);
DROP FUNCTION deliver();
