-- state-transition guard: a label of idem_transition_result renamed is
-- 55000 with the extension's hint, in a session that had read the labels
-- before as in one that had not, and the labels are read again once the
-- type is as it was.  The objects of this file start with "grl".
\set VERBOSITY terse

CREATE FUNCTION grl_err(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text; hint text;
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            hint = PG_EXCEPTION_HINT;
    RETURN st || ': ' || msg || ' (' || hint || ')';
END;
$$;
SELECT idem_allow('grl', 'new', 'paid');
CREATE TABLE grl_orders (id integer PRIMARY KEY, status text NOT NULL);
SELECT idem_guard('grl_orders', 'grl', 'status');
INSERT INTO grl_orders SELECT i, 'new' FROM generate_series(1, 4) i;

-- a session that has not read the labels
\c
\set VERBOSITY terse
BEGIN;
ALTER TYPE idem_transition_result RENAME VALUE 'applied' TO 'done';
SELECT grl_err($$SELECT idem_transition('grl_orders', '1', 'paid')$$);
ROLLBACK;

-- a session that has
SELECT idem_transition('grl_orders', '1', 'paid');
BEGIN;
ALTER TYPE idem_transition_result RENAME VALUE 'applied' TO 'done';
SELECT grl_err($$SELECT idem_transition('grl_orders', '2', 'paid')$$);
SELECT grl_err($$SELECT idem_transition('grl_orders', '1', 'paid')$$);
ROLLBACK;
SELECT idem_transition('grl_orders', '2', 'paid'), idem_transition('grl_orders', '2', 'paid');
SELECT * FROM grl_orders ORDER BY id;

DROP TABLE grl_orders;
DROP FUNCTION grl_err(text);
DELETE FROM idem.transitions WHERE machine = 'grl';
