-- A BEFORE UPDATE trigger that updates the row being updated: the UPDATE
-- then fails with 27000 (triggered_data_change_violation), and so does
-- idem_transition, on the direct path as through SPI.  Only the UPDATE that
-- idem_transition runs decides its request: an UPDATE of the same row run by
-- a trigger meanwhile is guarded as any UPDATE, and is not skipped.
\set VERBOSITY terse

CREATE FUNCTION err(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text;
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    RETURN st || ': ' || msg;
END;
$$;

SELECT idem_allow('sr', 'new', 'paid');

-- touches the row (once: not from the UPDATE it runs itself)
CREATE FUNCTION touch_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() = 1 THEN
        EXECUTE format('UPDATE %I SET note = note || ''+'' WHERE id = $1', TG_TABLE_NAME)
            USING NEW.id;
    END IF;
    RETURN NEW;
END;
$$;
CREATE FUNCTION see_statement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END;
$$;

CREATE FUNCTION make_table(t text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format($f$
        CREATE TABLE %1$I (id integer PRIMARY KEY, status text NOT NULL,
                           version bigint NOT NULL DEFAULT 0, note text NOT NULL DEFAULT '');
        INSERT INTO %1$I (id, status) VALUES (1, 'new'), (2, 'new'), (3, 'paid');
        SELECT idem_guard(%1$L, 'sr', 'status', 'version');
        -- fires before idem_guard
        CREATE TRIGGER a_touch BEFORE UPDATE ON %1$I
            FOR EACH ROW EXECUTE FUNCTION touch_row();
    $f$, t);
END;
$$;
SELECT make_table('sr_direct');
SELECT make_table('sr_spi');
CREATE TRIGGER after_statement AFTER UPDATE ON sr_spi
    FOR EACH STATEMENT EXECUTE FUNCTION see_statement();
SELECT make_table('sr_plain');

-- a plain UPDATE
SELECT err($$UPDATE sr_plain SET status = 'paid' WHERE id = 1$$);
-- idem_transition on each path gives the same
SET client_min_messages = debug1;
SELECT err($$SELECT idem_transition('sr_direct', '1', 'paid')$$);
SELECT err($$SELECT idem_transition('sr_spi', '1', 'paid')$$);
SELECT err($$SELECT idem_transition('sr_direct', '1', 'paid', 0)$$);
SELECT err($$SELECT idem_transition('sr_spi', '1', 'paid', 0)$$);
RESET client_min_messages;

-- a request that does not apply writes nothing: judged on the locked row
-- first, it runs no trigger (the trigger's own UPDATE of the row would go
-- through, guarded, as the other triggers' writes would stay)
SELECT idem_transition('sr_direct', '2', 'new');
SELECT idem_transition('sr_spi', '2', 'new');
SELECT idem_transition('sr_direct', '3', 'paid', 5);
SELECT idem_transition('sr_spi', '3', 'paid', 5);
SELECT idem_transition('sr_direct', '3', 'new');
SELECT idem_transition('sr_spi', '3', 'new');
SELECT 'sr_direct' AS t, * FROM sr_direct UNION ALL SELECT 'sr_spi', * FROM sr_spi
 ORDER BY t, id;

DROP TABLE sr_direct, sr_spi, sr_plain;
DROP FUNCTION make_table(text), touch_row(), see_statement(), err(text);
DELETE FROM idem.transitions;
