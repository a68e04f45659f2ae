-- consumer dedup: retentions at the edges of the timestamp range.  A
-- retention so long that "now() - retention" falls before the earliest
-- timestamp there is keeps every claim of its namespace; it never makes
-- idem_purge fail, for its namespace or for all of them.  The namespaces of
-- this file start with "rl_"; it leaves no claim and no setting behind.
\set VERBOSITY terse

-- aged in UTC, as idem_purge counts retentions
CREATE FUNCTION pg_temp.age_claim(space text, id text, age interval) RETURNS bigint
LANGUAGE sql AS $$
    WITH u AS (UPDATE idem.claims SET claimed_at = (now() AT TIME ZONE 'UTC' - age) AT TIME ZONE 'UTC'
                WHERE ns = space AND msg_id = id RETURNING 1)
    SELECT count(*) FROM u;
$$;
CREATE FUNCTION pg_temp.left_in(space text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT coalesce(array_agg(msg_id ORDER BY msg_id), '{}') FROM idem.claims WHERE ns = space;
$$;

SELECT idem_purge(NULL, 1000000) >= 0 AS cleared;

-- "keep for ever", said in several ways; namespaces are purged in order, so
-- these come before the short one.  idem_set_retention refuses more than
-- 100 years since 0.2.0; a database upgraded from 0.1.0 may hold them.
INSERT INTO idem.namespaces (ns, retention) VALUES
    ('rl_a_years', '300000 years'),
    ('rl_b_days', '2147483647 days'),
    ('rl_c_largest', '178000000 years'),
    ('rl_d_mixed', '100000 years -35999999 days'),
    ('rl_e_short', '1 day');
SELECT ns, retention FROM idem.namespaces WHERE ns LIKE 'rl\_%' ORDER BY ns;
SELECT idem_claim('old', ns) AND idem_claim('new', ns) AS claimed
  FROM unnest(ARRAY['rl_a_years', 'rl_b_days', 'rl_c_largest', 'rl_d_mixed', 'rl_e_short']) ns;
SELECT sum(pg_temp.age_claim(ns, 'old', '1000 years')) AS aged
  FROM unnest(ARRAY['rl_a_years', 'rl_b_days', 'rl_c_largest', 'rl_d_mixed', 'rl_e_short']) ns;

-- every namespace at once: only the short one's old claim goes
SELECT idem_purge();
SELECT ns, pg_temp.left_in(ns)
  FROM unnest(ARRAY['rl_a_years', 'rl_b_days', 'rl_c_largest', 'rl_d_mixed', 'rl_e_short']) ns;
-- one namespace at a time
SELECT idem_purge('rl_a_years') AS a, idem_purge('rl_b_days') AS b,
       idem_purge('rl_c_largest') AS c, idem_purge('rl_d_mixed') AS d;
-- with a budget of one row, the kept namespaces do not use it up
SELECT pg_temp.age_claim('rl_e_short', 'new', '2 days') AS aged;
SELECT idem_purge(NULL, 1);
SELECT pg_temp.left_in('rl_e_short');

-- a long retention that still fits the range is applied to the microsecond
INSERT INTO idem.namespaces (ns, retention) VALUES ('rl_f_long', '6000 years');
SELECT idem_claim_batch(ARRAY['kept', 'edge', 'gone'], 'rl_f_long');
BEGIN;
SELECT pg_temp.age_claim('rl_f_long', 'kept', '5999 years') AS aged,
       pg_temp.age_claim('rl_f_long', 'edge', '6000 years') AS aged,
       pg_temp.age_claim('rl_f_long', 'gone', '6000 years 00:00:00.000001') AS aged;
SELECT idem_purge('rl_f_long');
SELECT pg_temp.left_in('rl_f_long');
COMMIT;

DELETE FROM idem.claims WHERE ns LIKE 'rl\_%';
DELETE FROM idem.namespaces WHERE ns LIKE 'rl\_%';
