-- ordered streams: consumer offsets and producer sequences
\set VERBOSITY terse

-- ==== offsets ====
-- nothing stored yet
SELECT idem_offset_get('c', 'orders', 0) AS none;
-- the first offset is applied, whatever it is
SELECT idem_offset_advance('c', 'orders', 0, 5) AS first;
SELECT idem_offset_get('c', 'orders', 0) AS stored;
-- a replay (equal or below) is skipped
SELECT idem_offset_advance('c', 'orders', 0, 5) AS equal,
       idem_offset_advance('c', 'orders', 0, 3) AS below,
       idem_offset_advance('c', 'orders', 0, 0) AS zero;
-- the next one, and a gap (compacted topic): applied
SELECT idem_offset_advance('c', 'orders', 0, 6) AS next,
       idem_offset_advance('c', 'orders', 0, 100) AS gap,
       idem_offset_advance('c', 'orders', 0, 99) AS behind_gap;
SELECT idem_offset_get('c', 'orders', 0) AS stored;
-- partitions, streams and consumers are independent
SELECT idem_offset_advance('c', 'orders', 1, 0) AS other_part,
       idem_offset_advance('c', 'payments', 0, 1) AS other_stream,
       idem_offset_advance('d', 'orders', 0, 2) AS other_consumer;
SELECT idem_offset_get('c', 'orders', 1) AS p1,
       idem_offset_get('c', 'payments', 0) AS payments,
       idem_offset_get('d', 'orders', 0) AS d,
       idem_offset_get('c', 'orders', 2) AS p2_none;
SELECT consumer, stream, part, "offset", updated_at IS NOT NULL AS has_time
  FROM idem_offsets ORDER BY 1, 2, 3;
-- one row per partition, however many messages
DO $$
BEGIN
    FOR i IN 101..1100 LOOP
        PERFORM idem_offset_advance('c', 'orders', 0, i);
    END LOOP;
END;
$$;
SELECT count(*) AS rows, max("offset") FROM idem.offsets WHERE consumer = 'c' AND stream = 'orders';
-- the largest offset
SELECT idem_offset_advance('c', 'big', 0, 9223372036854775807) AS max_offset,
       idem_offset_advance('c', 'big', 0, 9223372036854775807) AS again;

-- rollback: the offset goes back, the message is applied again
BEGIN;
SELECT idem_offset_advance('c', 'orders', 0, 1101) AS in_txn;
SELECT idem_offset_get('c', 'orders', 0) AS seen_in_txn;
SELECT idem_offset_advance('c', 'orders', 0, 1101) AS replay_in_txn;
ROLLBACK;
SELECT idem_offset_get('c', 'orders', 0) AS after_rollback;
-- a first offset rolled back leaves no row
BEGIN;
SELECT idem_offset_advance('c', 'fresh', 0, 7) AS fresh;
ROLLBACK;
SELECT idem_offset_get('c', 'fresh', 0) AS none_after_rollback;
-- savepoints
BEGIN;
SELECT idem_offset_advance('c', 'orders', 0, 1101) AS a;
SAVEPOINT s;
SELECT idem_offset_advance('c', 'orders', 0, 1102) AS b;
ROLLBACK TO SAVEPOINT s;
SELECT idem_offset_get('c', 'orders', 0) AS after_savepoint;
SELECT idem_offset_advance('c', 'orders', 0, 1102) AS b_again;
SAVEPOINT t;
SELECT idem_offset_advance('c', 'sp', 0, 1) AS first_in_savepoint;
ROLLBACK TO SAVEPOINT t;
SELECT idem_offset_get('c', 'sp', 0) AS none_after_savepoint;
SELECT idem_offset_advance('c', 'sp', 0, 1) AS first_again;
COMMIT;
SELECT idem_offset_get('c', 'orders', 0) AS committed, idem_offset_get('c', 'sp', 0) AS sp;

-- the updates are in place (HOT): the transaction's counters, before and
-- after (they may hold earlier transactions' counts not yet reported)
BEGIN;
CREATE TEMP TABLE hot0 AS
SELECT c.relname, pg_stat_get_xact_tuples_inserted(c.oid) AS inserted,
       pg_stat_get_xact_tuples_updated(c.oid) AS updated,
       pg_stat_get_xact_tuples_hot_updated(c.oid) AS hot_updated
  FROM pg_class c
 WHERE c.oid IN ('idem.offsets'::regclass, 'idem.producer_seqs'::regclass);
DO $$
BEGIN
    FOR i IN 2001..2050 LOOP
        PERFORM idem_offset_advance('c', 'orders', 0, i);
        PERFORM idem_seq_accept('hot', i);
    END LOOP;
END;
$$;
SELECT c.relname, pg_stat_get_xact_tuples_inserted(c.oid) - h.inserted AS inserted,
       pg_stat_get_xact_tuples_updated(c.oid) - h.updated AS updated,
       pg_stat_get_xact_tuples_hot_updated(c.oid) - h.hot_updated AS hot_updated
  FROM pg_class c JOIN hot0 h USING (relname)
 WHERE c.oid IN ('idem.offsets'::regclass, 'idem.producer_seqs'::regclass)
 ORDER BY 1;
ROLLBACK;

-- reset (administration): move back, forward, forget
SELECT idem_offset_reset('c', 'orders', 0, 10) AS replaced;
SELECT idem_offset_advance('c', 'orders', 0, 11) AS reprocessed;
SELECT idem_offset_reset('c', 'orders', 0, NULL) AS forgotten;
SELECT idem_offset_get('c', 'orders', 0) AS none;
SELECT idem_offset_reset('c', 'new', 3, 42) AS none_before;
SELECT idem_offset_get('c', 'new', 3) AS set;
SELECT idem_offset_reset('c', 'missing', 0, NULL) AS nothing_to_forget;

-- bad input
SELECT idem_offset_advance(NULL, 's', 0, 1);
SELECT idem_offset_advance('c', NULL, 0, 1);
SELECT idem_offset_advance('c', 's', NULL, 1);
SELECT idem_offset_advance('c', 's', 0, NULL);
SELECT idem_offset_advance('', 's', 0, 1);
SELECT idem_offset_advance('c', '', 0, 1);
SELECT idem_offset_advance(repeat('c', 513), 's', 0, 1);
SELECT idem_offset_advance('c', 's', -1, 1);
SELECT idem_offset_advance('c', 's', 0, -1);
SELECT idem_offset_get(NULL, 's', 0);
SELECT idem_offset_get('c', '', 0);
SELECT idem_offset_get('c', 's', -1);
SELECT idem_offset_reset(NULL, 's', 0, 1);
SELECT idem_offset_reset('c', '', 0, 1);
SELECT idem_offset_reset('c', 's', NULL, 1);
SELECT idem_offset_reset('c', 's', -1, 1);
SELECT idem_offset_reset('c', 's', 0, -1);
SELECT idem_offset_reset('c', repeat('s', 513), 0, 1);
-- nothing was stored by the errors
SELECT count(*) AS none FROM idem.offsets WHERE stream = 's' OR consumer = '';

-- the SQLSTATE of each refusal
CREATE FUNCTION stream_sqlstate(q text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END;
$$;
SELECT q, stream_sqlstate(q) FROM unnest(ARRAY[
    $q$SELECT idem_offset_advance(NULL, 's', 0, 1)$q$,
    $q$SELECT idem_offset_advance('c', 's', NULL, 1)$q$,
    $q$SELECT idem_offset_advance('c', 's', 0, NULL)$q$,
    $q$SELECT idem_offset_advance('', 's', 0, 1)$q$,
    $q$SELECT idem_offset_advance(repeat('c', 513), 's', 0, 1)$q$,
    $q$SELECT idem_offset_advance('c', 's', -1, 1)$q$,
    $q$SELECT idem_offset_advance('c', 's', 0, -1)$q$,
    $q$SELECT idem_offset_get('c', NULL, 0)$q$,
    $q$SELECT idem_offset_reset(NULL, 's', 0, 1)$q$,
    $q$SELECT idem_offset_reset('', 's', 0, 1)$q$,
    $q$SELECT idem_offset_reset(repeat('c', 513), 's', 0, 1)$q$,
    $q$SELECT idem_offset_reset('c', 's', 0, -1)$q$,
    $q$SELECT idem_seq_accept(NULL, 1)$q$,
    $q$SELECT idem_seq_accept('', 1)$q$,
    $q$SELECT idem_seq_accept(repeat('p', 513), 1)$q$,
    $q$SELECT idem_seq_accept('x', NULL)$q$,
    $q$SELECT idem_seq_accept('x', -1)$q$,
    $q$SELECT idem_seq_accept('x', 1, NULL)$q$,
    $q$SELECT idem_seq_accept('x', 1, 0)$q$,
    $q$SELECT idem_seq_accept('x', 1, 1025)$q$,
    $q$SELECT idem_seq_accept('c-window', 1, 32)$q$,
    $q$SELECT idem_seq_accept('c-window', 2, 33)$q$]) AS q;

-- ==== producer sequences ====
-- the first number is accepted, whatever it is
SELECT idem_seq_accept('p', 10) AS first;
SELECT idem_seq_accept('p', 10) AS again;
-- in order, and a gap
SELECT idem_seq_accept('p', 11) AS next, idem_seq_accept('p', 20) AS gap;
-- out of order inside the window (20 - 63 .. 20): once each
SELECT idem_seq_accept('p', 15) AS late, idem_seq_accept('p', 15) AS late_again,
       idem_seq_accept('p', 12) AS late2, idem_seq_accept('p', 11) AS seen_before;
-- the bottom of the window: 20 - 63 = -43; all numbers >= 0 fit
SELECT idem_seq_accept('p', 0) AS zero, idem_seq_accept('p', 0) AS zero_again;
-- a jump moves the window: 200 - 63 = 137 is its floor
SELECT idem_seq_accept('p', 200) AS jump;
SELECT idem_seq_accept('p', 137) AS floor, idem_seq_accept('p', 137) AS floor_again,
       idem_seq_accept('p', 136) AS below_floor, idem_seq_accept('p', 20) AS old_seen,
       idem_seq_accept('p', 150) AS inside;
SELECT producer, "window", high, length(seen) AS bytes FROM idem.producer_seqs WHERE producer = 'p';

-- a small window, each shift of the bitmap checked against a list
SELECT idem_seq_accept('w3', 5, 3) AS a, idem_seq_accept('w3', 3, 3) AS b,
       idem_seq_accept('w3', 2, 3) AS too_old, idem_seq_accept('w3', 4, 3) AS c,
       idem_seq_accept('w3', 6, 3) AS d, idem_seq_accept('w3', 3, 3) AS now_too_old,
       idem_seq_accept('w3', 4, 3) AS dup4, idem_seq_accept('w3', 5, 3) AS dup5;
SELECT idem_seq_accept('w1', 1, 1) AS a, idem_seq_accept('w1', 1, 1) AS dup,
       idem_seq_accept('w1', 0, 1) AS too_old, idem_seq_accept('w1', 2, 1) AS b;

-- the bitmap against a model: random numbers, windows of several sizes
CREATE TEMP TABLE model (producer text, seq bigint, result text, expected text);
DO $$
DECLARE
    w int;
    s bigint;
    high bigint;
    seen bigint[];
    r text;
    e text;
BEGIN
    PERFORM setseed(0.17);
    FOREACH w IN ARRAY ARRAY[1, 7, 8, 9, 64, 100, 1024] LOOP
        high := NULL;
        seen := '{}';
        FOR i IN 1..600 LOOP
            s := floor(random() * (CASE WHEN i % 50 = 0 THEN 5000 ELSE 3 * w + 10 END))::bigint
                 + i * greatest(w / 8, 1);
            r := idem_seq_accept('model-' || w, s, w)::text;
            IF high IS NULL OR s > high THEN
                e := 'accepted';
                high := s;
                seen := array_append(seen, s);
            ELSIF high - s >= w THEN
                e := 'too_old';
            ELSIF s = ANY (seen) THEN
                e := 'duplicate';
            ELSE
                e := 'accepted';
                seen := array_append(seen, s);
            END IF;
            INSERT INTO model VALUES ('model-' || w, s, r, e);
        END LOOP;
    END LOOP;
END;
$$;
SELECT producer, count(*) AS calls, count(*) FILTER (WHERE result <> expected) AS wrong,
       count(*) FILTER (WHERE result = 'accepted') AS accepted,
       count(*) FILTER (WHERE result = 'duplicate') > 0 AS some_duplicates,
       count(*) FILTER (WHERE result = 'too_old') > 0 AS some_too_old
  FROM model GROUP BY producer ORDER BY length(producer), producer;
-- constant storage: one row per producer, a bitmap of window bits
SELECT producer, "window", length(seen) AS bytes FROM idem.producer_seqs
 WHERE producer LIKE 'model-%' ORDER BY "window";

-- rollback and savepoints
BEGIN;
SELECT idem_seq_accept('p', 201) AS in_txn, idem_seq_accept('p', 201) AS dup_in_txn;
ROLLBACK;
SELECT idem_seq_accept('p', 201) AS after_rollback;
BEGIN;
SAVEPOINT s;
SELECT idem_seq_accept('p', 202) AS a, idem_seq_accept('q', 1) AS new_producer;
ROLLBACK TO SAVEPOINT s;
SELECT idem_seq_accept('p', 202) AS a_again, idem_seq_accept('q', 1) AS q_again;
COMMIT;
SELECT idem_seq_accept('p', 202) AS dup, idem_seq_accept('q', 1) AS q_dup;

-- bad input
SELECT idem_seq_accept(NULL, 1);
SELECT idem_seq_accept('', 1);
SELECT idem_seq_accept(repeat('p', 513), 1);
SELECT idem_seq_accept('p', NULL);
SELECT idem_seq_accept('p', -1);
SELECT idem_seq_accept('p', 1, NULL);
SELECT idem_seq_accept('x', 1, 0);
SELECT idem_seq_accept('x', 1, 1025);
SELECT idem_seq_accept('x', 1, -5);
-- a window changed for an existing producer
SELECT idem_seq_accept('p', 300, 128);
SELECT idem_seq_accept('w3', 7);
-- no row for the producers refused
SELECT count(*) AS none FROM idem.producer_seqs WHERE producer IN ('x', '');
SELECT producer, high FROM idem.producer_seqs WHERE producer = 'c-window';
-- the largest number
SELECT idem_seq_accept('max', 9223372036854775807) AS a,
       idem_seq_accept('max', 9223372036854775807 - 63) AS in_window,
       idem_seq_accept('max', 9223372036854775807 - 64) AS too_old,
       idem_seq_accept('max', 0) AS zero_too_old;

-- a prepared transaction holds its offset and its producer's row: the
-- others wait for it (here until lock_timeout, 55P03, whose context says
-- the row was being updated), see what it leaves when it is committed, and
-- store their own when it is rolled back
CREATE FUNCTION pg_temp.wait_err(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text;
    ctx text;
BEGIN
    EXECUTE q;
    RETURN 'no wait';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, ctx = PG_EXCEPTION_CONTEXT;
    RETURN st || ': ' || regexp_replace(split_part(ctx, E'\n', 1), '\(\d+,\d+\)', '(b,o)');
END;
$$;
SELECT idem_offset_advance('c', 'prep', 0, 10) AS stored, idem_seq_accept('prep', 10) AS accepted;
BEGIN;
SELECT idem_offset_advance('c', 'prep', 0, 11) AS prepared_offset,
       idem_seq_accept('prep', 11) AS prepared_seq,
       idem_offset_advance('c', 'prep', 1, 1) AS prepared_first;
PREPARE TRANSACTION 'idem_stream_pt';
SELECT idem_offset_get('c', 'prep', 0) AS committed_only, idem_offset_get('c', 'prep', 1) AS none;
SET lock_timeout = '10ms';
SELECT pg_temp.wait_err($$SELECT idem_offset_advance('c', 'prep', 0, 12)$$) AS advance,
       pg_temp.wait_err($$SELECT idem_offset_advance('c', 'prep', 1, 2)$$) AS first,
       pg_temp.wait_err($$SELECT idem_seq_accept('prep', 12)$$) AS seq;
RESET lock_timeout;
COMMIT PREPARED 'idem_stream_pt';
SELECT idem_offset_advance('c', 'prep', 0, 11) AS replay, idem_seq_accept('prep', 11) AS dup,
       idem_offset_advance('c', 'prep', 1, 1) AS replay_first;
BEGIN;
SELECT idem_offset_advance('c', 'prep', 0, 12) AS prepared_offset, idem_seq_accept('prep', 12) AS prepared_seq;
PREPARE TRANSACTION 'idem_stream_pt';
ROLLBACK PREPARED 'idem_stream_pt';
SELECT idem_offset_advance('c', 'prep', 0, 12) AS applied, idem_seq_accept('prep', 12) AS accepted;
SELECT count(*) AS prepared_left FROM pg_prepared_xacts;
DELETE FROM idem.offsets WHERE stream = 'prep';

-- the SQLSTATE and message of the error a statement raises
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;
-- idem's tables altered by hand: refused with 55000, never misread
BEGIN;
ALTER TABLE idem.producer_seqs RENAME COLUMN seen TO bits;
SELECT pg_temp.err($$SELECT idem_seq_accept('p', 500)$$);
ROLLBACK;
BEGIN;
ALTER TABLE idem.offsets DROP CONSTRAINT offsets_pkey;
ALTER TABLE idem.offsets ADD PRIMARY KEY (stream, consumer, part);
SELECT pg_temp.err($$SELECT idem_offset_advance('c', 'orders', 0, 5000)$$);
ROLLBACK;
BEGIN;
ALTER TABLE idem.offsets DROP CONSTRAINT offsets_pkey;
ALTER TABLE idem.offsets ADD PRIMARY KEY (consumer, stream);
SELECT pg_temp.err($$SELECT idem_offset_get('c', 'orders', 0)$$);
ROLLBACK;
SELECT idem_seq_accept('p', 500) AS accepted_after_rollback;
-- a row written by hand with a negative highest number is malformed (XX001),
-- before a window that differs is reported; so is one whose window is
-- outside 1..1024, or whose bitmap is not of its window's length (a window
-- of 64 has 8 bytes)
SELECT "window", octet_length(seen) FROM idem.producer_seqs WHERE producer = 'p';
BEGIN;
UPDATE idem.producer_seqs SET high = -9223372036854775807 WHERE producer = 'p';
SELECT pg_temp.err($$SELECT idem_seq_accept('p', 5, 32)$$);
ROLLBACK;
BEGIN;
UPDATE idem.producer_seqs SET "window" = 0, seen = '' WHERE producer = 'p';
SELECT pg_temp.err($$SELECT idem_seq_accept('p', 501)$$) AS window_0;
ROLLBACK;
BEGIN;
UPDATE idem.producer_seqs SET "window" = 1032, seen = decode(repeat('00', 129), 'hex') WHERE producer = 'p';
SELECT pg_temp.err($$SELECT idem_seq_accept('p', 501)$$) AS window_1032;
ROLLBACK;
BEGIN;
UPDATE idem.producer_seqs SET seen = seen || '\x00'::bytea WHERE producer = 'p';
SELECT pg_temp.err($$SELECT idem_seq_accept('p', 501)$$) AS bitmap_long;
ROLLBACK;
BEGIN;
UPDATE idem.producer_seqs SET seen = substr(seen, 2) WHERE producer = 'p';
SELECT pg_temp.err($$SELECT idem_seq_accept('p', 501)$$) AS bitmap_short;
ROLLBACK;
SELECT idem_seq_accept('p', 501) AS accepted_after_rollback;
-- the view idem_offsets is for pg_monitor: a member reads it, another role
-- is refused (42501)
CREATE ROLE regress_idem_stream_monitor IN ROLE pg_monitor;
CREATE ROLE regress_idem_stream_other;
SET ROLE regress_idem_stream_monitor;
SELECT count(*) > 0 AS monitor_reads FROM idem_offsets WHERE consumer = 'c';
SET ROLE regress_idem_stream_other;
SELECT count(*) FROM idem_offsets;
RESET ROLE;
DROP ROLE regress_idem_stream_monitor, regress_idem_stream_other;
DROP FUNCTION stream_sqlstate(text);
