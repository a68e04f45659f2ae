-- state-transition guard: machines larger than the ones an application
-- starts with.  A state with many successors (every one of them allowed,
-- none other), a long chain (a late request 199 moves behind is stale), and
-- many states and machines at once.  The machines and table of this file
-- start with "glm".
\set VERBOSITY terse

-- a hub with twelve successors, each of which leads back to it
SELECT count(*) FILTER (WHERE idem_allow('glm_hub', 'hub', 't' || lpad(i::text, 2, '0'))) AS out,
       count(*) FILTER (WHERE idem_allow('glm_hub', 't' || lpad(i::text, 2, '0'), 'hub')) AS back
  FROM generate_series(1, 12) i;
-- a chain of 200 states
SELECT count(*) FILTER (WHERE idem_allow('glm_chain', 's' || lpad(i::text, 3, '0'),
                                         's' || lpad((i + 1)::text, 3, '0'))) AS chain
  FROM generate_series(0, 198) i;
-- forty more machines of one transition each
SELECT count(*) FILTER (WHERE idem_allow('glm_m' || i, 'a', 'b')) AS machines
  FROM generate_series(1, 40) i;

CREATE TABLE glm_hub (id integer PRIMARY KEY, state text NOT NULL);
INSERT INTO glm_hub SELECT i, 'hub' FROM generate_series(1, 13) i;
SELECT idem_guard('glm_hub', 'glm_hub', 'state');
CREATE TABLE glm_chain (id integer PRIMARY KEY, state text NOT NULL,
                        version integer NOT NULL DEFAULT 0);
INSERT INTO glm_chain (id, state) VALUES (1, 's000'), (2, 's199'), (3, 's100'), (4, 's198');
SELECT idem_guard('glm_chain', 'glm_chain', 'state', 'version');
CREATE TABLE glm_m40 (id integer PRIMARY KEY, state text NOT NULL);
INSERT INTO glm_m40 VALUES (1, 'a'), (2, 'a');
SELECT idem_guard('glm_m40', 'glm_m40', 'state');

-- every successor of the hub is allowed, by UPDATE and by idem_transition;
-- a thirteenth is not
CREATE FUNCTION glm_err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END;
$$;
SELECT i, glm_err(format('UPDATE glm_hub SET state = %L WHERE id = %s',
                         't' || lpad(i::text, 2, '0'), i)) AS by_update
  FROM generate_series(1, 13) i ORDER BY i;
UPDATE glm_hub SET state = 'hub' WHERE id <= 12;
SELECT i, idem_transition('glm_hub', i::text, 't' || lpad(i::text, 2, '0')) AS by_transition
  FROM generate_series(1, 13) i ORDER BY i;
-- and from each, the way back
SELECT i, idem_transition('glm_hub', i::text, 'hub') AS back
  FROM generate_series(1, 12) i ORDER BY i;
SELECT state, count(*) FROM glm_hub GROUP BY 1 ORDER BY 1;

-- the chain: one step forward at a time; a late request however far back
-- is stale, and a jump ahead is illegal
SELECT idem_transition('glm_chain', '3', 's101') AS one_step,
       idem_transition('glm_chain', '2', 's000') AS late_by_199,
       idem_transition('glm_chain', '2', 's198') AS late_by_1,
       idem_transition('glm_chain', '1', 's199') AS jump,
       idem_transition('glm_chain', '1', 's002') AS jump_by_2,
       idem_transition('glm_chain', '4', 's199') AS last_step;
SELECT glm_err($$UPDATE glm_chain SET state = 's000' WHERE id = 2$$) AS back_by_update,
       glm_err($$UPDATE glm_chain SET state = 's050' WHERE id = 1$$) AS ahead_by_update;
SELECT * FROM glm_chain ORDER BY id;

-- the last of many machines
SELECT idem_transition('glm_m40', '1', 'b') AS applied,
       glm_err($$UPDATE glm_m40 SET state = 'c' WHERE id = 2$$) AS illegal;

-- a machine of 20,000 states: a chain with a way back every seventh step
-- (to the state at half its number), and two states apart.  Whether a
-- request is late searches the states reachable from it, each once: the
-- answers are those of a small machine.
INSERT INTO idem.transitions
SELECT 'glm_big', 'b' || lpad(i::text, 5, '0'), 'b' || lpad((i + 1)::text, 5, '0')
  FROM generate_series(0, 19998) i;
INSERT INTO idem.transitions
SELECT 'glm_big', 'b' || lpad(i::text, 5, '0'), 'b' || lpad((i / 2)::text, 5, '0')
  FROM generate_series(1, 19999, 7) i;
INSERT INTO idem.transitions VALUES ('glm_big', 'apart', 'elsewhere');
CREATE TABLE glm_big (id integer PRIMARY KEY, state text NOT NULL);
INSERT INTO glm_big VALUES (1, 'apart'), (2, 'b19999'), (3, 'b00010'), (4, 'b10000'),
                           (5, 'b19993');
SELECT idem_guard('glm_big', 'glm_big', 'state');
SELECT idem_transition('glm_big', '1', 'b00000') AS unreachable,
       idem_transition('glm_big', '2', 'b00000') AS late_by_19999,
       idem_transition('glm_big', '3', 'b00011') AS one_step,
       idem_transition('glm_big', '4', 'b19999') AS jump,
       idem_transition('glm_big', '4', 'b05000') AS late_back,
       idem_transition('glm_big', '5', 'b09996') AS way_back;
SELECT * FROM glm_big ORDER BY id;

DROP TABLE glm_hub, glm_chain, glm_m40, glm_big;
DROP FUNCTION glm_err(text);
DELETE FROM idem.transitions WHERE machine LIKE 'glm\_%';
