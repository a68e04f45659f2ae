-- idem_claim_batch with repeated ids in batches large and unsorted enough
-- for the sort to reorder equal ids: the first occurrence of an id is the
-- one that claims it, whatever the sort does with the others.  The
-- namespaces of this file start with "cbo_"; it leaves no claim behind.
\set VERBOSITY terse

-- eight elements, two of each id, in descending order: the smallest batch
-- the server's sort does not keep in order by itself
SELECT idem_claim_batch(ARRAY['d', 'c', 'b', 'a', 'd', 'c', 'b', 'a'], 'cbo_8');
SELECT idem_claim_batch(ARRAY['h', 'g', 'f', 'e', 'e', 'f', 'g', 'h'], 'cbo_8');
SELECT idem_claim_batch(ARRAY['x', 'w', 'x', 'v', 'w', 'u', 'x', 'v', 'u'], 'cbo_8');
-- ids that are prefixes of each other, with repeats
SELECT idem_claim_batch(ARRAY['pp', 'p', 'ppp', 'p', 'pp', 'ppp', 'p', 'pp'], 'cbo_8');
-- the same batch again: every element is a duplicate
SELECT idem_claim_batch(ARRAY['d', 'c', 'b', 'a', 'd', 'c', 'b', 'a'], 'cbo_8');
SELECT msg_id FROM idem.claims WHERE ns = 'cbo_8' ORDER BY msg_id;

--
-- a random batch of a few thousand ids with repeats, checked against a
-- model computed in SQL: element i is true exactly when its id was not
-- claimed before the batch and does not occur before i in the array
--
SELECT setseed(0.2026);
CREATE TEMP TABLE batch AS
    SELECT i AS pos, 'k' || (random() * 1500)::int AS id
      FROM generate_series(1, 4000) AS i;
-- some ids are claimed before the batch
SELECT count(*) FILTER (WHERE c) AS claimed_before
  FROM (SELECT idem_claim(id, 'cbo_random') AS c
          FROM (SELECT DISTINCT id FROM batch) d
         WHERE right(id, 1) = '7') s;
CREATE TEMP TABLE model AS
    SELECT pos, id,
           pos = min(pos) OVER (PARTITION BY id) AND right(id, 1) <> '7' AS expected
      FROM batch;
SELECT count(*) AS elements, count(DISTINCT id) AS distinct_ids,
       count(*) - count(DISTINCT id) AS repeats,
       count(*) FILTER (WHERE expected) AS expected_true
  FROM model;
CREATE TEMP TABLE got AS
    SELECT r.pos, r.claimed
      FROM unnest(idem_claim_batch((SELECT array_agg(id ORDER BY pos) FROM batch),
                                   'cbo_random'))
           WITH ORDINALITY AS r(claimed, pos);
SELECT count(*) AS results,
       count(*) FILTER (WHERE g.claimed IS DISTINCT FROM m.expected) AS mismatches,
       count(*) FILTER (WHERE g.claimed) AS claimed
  FROM model m FULL JOIN got g USING (pos);
-- the first few that differ, if any
SELECT m.pos, m.id, m.expected, g.claimed
  FROM model m JOIN got g USING (pos)
 WHERE g.claimed IS DISTINCT FROM m.expected
 ORDER BY m.pos LIMIT 5;
-- every id of the batch is claimed once
SELECT count(*) AS rows, count(*) = (SELECT count(DISTINCT id) FROM batch) AS one_per_id
  FROM idem.claims WHERE ns = 'cbo_random';

-- the same batch again, and once more reversed: every element a duplicate
SELECT count(*) FILTER (WHERE claimed) AS claimed
  FROM unnest(idem_claim_batch((SELECT array_agg(id ORDER BY pos) FROM batch),
                               'cbo_random')) AS r(claimed);
SELECT count(*) FILTER (WHERE claimed) AS claimed
  FROM unnest(idem_claim_batch((SELECT array_agg(id ORDER BY pos DESC) FROM batch),
                               'cbo_random')) AS r(claimed);

-- reversed, into a fresh namespace: the first occurrence is now the last
-- position of each id in the table above
CREATE TEMP TABLE got_rev AS
    SELECT 4001 - r.pos AS pos, r.claimed
      FROM unnest(idem_claim_batch((SELECT array_agg(id ORDER BY pos DESC) FROM batch),
                                   'cbo_reversed'))
           WITH ORDINALITY AS r(claimed, pos);
SELECT count(*) AS results,
       count(*) FILTER (WHERE g.claimed IS DISTINCT FROM m.expected) AS mismatches,
       count(*) FILTER (WHERE g.claimed) AS claimed
  FROM (SELECT pos, pos = max(pos) OVER (PARTITION BY id) AS expected FROM batch) m
  FULL JOIN got_rev g USING (pos);

-- the answer keeps the subscripts of the ids: its element [i] is the
-- answer for msg_ids[i], whatever the array's lower bound
SELECT r, array_lower(r, 1) AS lower, r[0] AS "r[0]", r[2] AS "r[2]"
  FROM idem_claim_batch('[0:2]={lb-a,lb-b,lb-a}'::text[], 'cbo_bounds') r;
SELECT r FROM idem_claim_batch('[-3:-2]={lb-a,lb-c}'::text[], 'cbo_bounds') r;
SELECT r FROM idem_claim_batch('{}'::text[], 'cbo_bounds') r;
-- and errors name an element by its subscript
\set VERBOSITY default
SELECT idem_claim_batch('[5:7]={lb-d,NULL,lb-e}'::text[], 'cbo_bounds');
SELECT idem_claim_batch('[0:1]={"",lb-e}'::text[], 'cbo_bounds');
SELECT idem_claim_batch(array_prepend(repeat('x', 513), '[-1:-1]={lb-f}'::text[]), 'cbo_bounds');
\set VERBOSITY terse

DROP TABLE batch, model, got, got_rev;
DELETE FROM idem.claims WHERE ns LIKE 'cbo\_%';
