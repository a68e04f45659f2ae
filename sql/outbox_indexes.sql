-- A send keeps every index of idem.outbox complete: the primary key idem
-- made, whose entry it inserts itself when it is the only index, and any
-- index a user added, which sends every insertion through the executor.
-- amcheck's heapallindexed check finds a row missing from an index.
\set VERBOSITY terse
CREATE EXTENSION amcheck;

CREATE FUNCTION pg_temp.checked() RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(c.relname, ' ' ORDER BY c.relname)
      FROM pg_index i
      JOIN pg_class c ON c.oid = i.indexrelid
     WHERE i.indrelid = 'idem.outbox'::regclass
       AND bt_index_check(i.indexrelid, true) IS NOT NULL
$$;

-- the primary key alone
SELECT count(idem_outbox_send('indexes', 'k' || i % 7, jsonb_build_object('n', i)))
  FROM generate_series(1, 40) i;
SELECT pg_temp.checked();

-- indexes a user added: plain, partial, on an expression
CREATE INDEX outbox_by_created ON idem.outbox (created_at);
CREATE INDEX outbox_by_type ON idem.outbox (type) WHERE type IS NOT NULL;
CREATE INDEX outbox_by_n ON idem.outbox (((payload->>'n')::int));
SELECT count(idem_outbox_send('indexes', 'k' || i % 7, jsonb_build_object('n', i), NULL,
                              CASE WHEN i % 2 = 0 THEN 'even' END))
  FROM generate_series(41, 80) i;
SELECT pg_temp.checked();
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT count(*) AS even FROM idem.outbox WHERE aggregatetype = 'indexes' AND type = 'even';
SELECT count(*) AS from_60 FROM idem.outbox
 WHERE aggregatetype = 'indexes' AND (payload->>'n')::int >= 60;
RESET enable_seqscan;
RESET enable_bitmapscan;

-- a unique index a user added is enforced
CREATE UNIQUE INDEX outbox_unique_n ON idem.outbox (aggregateid, ((payload->>'n')::int))
 WHERE aggregatetype = 'indexes';
SELECT idem_outbox_send('indexes', 'k1', '{"n": 1}');

DROP INDEX idem.outbox_unique_n;

-- and once they are gone, the primary key alone again
DROP INDEX idem.outbox_by_created, idem.outbox_by_type, idem.outbox_by_n;
SELECT count(idem_outbox_send('indexes', 'k' || i % 7, jsonb_build_object('n', i)))
  FROM generate_series(81, 120) i;
SELECT pg_temp.checked();

DELETE FROM idem.outbox WHERE aggregatetype = 'indexes';

-- a deferrable one is checked by a trigger, which a send does not fire: a
-- send that may break it is refused (0A000), not left unchecked
ALTER TABLE idem.outbox ADD CONSTRAINT outbox_deferrable UNIQUE (aggregateid, type)
    DEFERRABLE INITIALLY IMMEDIATE;
SELECT idem_outbox_send('indexes', 'k-deferred', '{}', NULL, 'once') IS NOT NULL AS sent;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;
SELECT pg_temp.err($$SELECT idem_outbox_send('indexes', 'k-deferred', '{}', NULL, 'once')$$);
SELECT count(*) AS kept FROM idem.outbox WHERE aggregateid = 'k-deferred';
ALTER TABLE idem.outbox DROP CONSTRAINT outbox_deferrable;
DELETE FROM idem.outbox WHERE aggregatetype = 'indexes';

DELETE FROM idem.outbox_keys WHERE topic = 'indexes';
DROP EXTENSION amcheck;
