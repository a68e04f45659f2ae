-- state-transition guard: keys that are equal without being the same
-- bytes.  idem_transition finds the row through the primary key, so the
-- key given is compared as the index compares it: numeric 1 is 1.0, and a
-- case-insensitive collation makes 'order-a' the key 'Order-A'.  The guard
-- must then recognise the row it found as the request's own, on every path
-- (the guard alone, another BEFORE ROW trigger, SPI).  The machine and
-- tables of this file start with "gk".
\set VERBOSITY terse

SELECT idem_allow('gk', 'new', 'paid'), idem_allow('gk', 'paid', 'shipped');
CREATE COLLATION gk_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
CREATE FUNCTION gk_noop() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN CASE WHEN TG_LEVEL = 'ROW' THEN NEW END;
END;
$$;
CREATE FUNCTION gk_err(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r text;
BEGIN
    EXECUTE q INTO r;
    RETURN r;
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END;
$$;

-- one table per key type and path
CREATE FUNCTION gk_make(t text, keytype text, path text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE TABLE %I (id %s PRIMARY KEY, status text NOT NULL,
                                     version integer NOT NULL DEFAULT 0)', t, keytype);
    EXECUTE format('SELECT idem_guard(%L, %L, %L, %L)', t, 'gk', 'status', 'version');
    IF path = 'locked' THEN
        EXECUTE format('CREATE TRIGGER a_noop BEFORE UPDATE ON %I FOR EACH ROW EXECUTE FUNCTION gk_noop()', t);
    ELSIF path = 'spi' THEN
        EXECUTE format('CREATE TRIGGER a_noop AFTER UPDATE ON %I FOR EACH STATEMENT EXECUTE FUNCTION gk_noop()', t);
    END IF;
END;
$$;
SELECT gk_make('gk_num_' || path, 'numeric', path), gk_make('gk_ci_' || path, 'text COLLATE gk_ci', path)
  FROM unnest(ARRAY['alone', 'locked', 'spi']) path;
DO $$
DECLARE
    path text;
BEGIN
    FOREACH path IN ARRAY ARRAY['alone', 'locked', 'spi'] LOOP
        EXECUTE format($q$INSERT INTO %I (id, status) VALUES (1.0, 'new'), (2.50, 'new')$q$, 'gk_num_' || path);
        EXECUTE format($q$INSERT INTO %I (id, status) VALUES ('Order-A', 'new'), ('Order-B', 'new')$q$, 'gk_ci_' || path);
    END LOOP;
END;
$$;

CREATE TABLE gk_outcomes (n serial, t text, request text, outcome text);
DO $$
DECLARE
    path text;
    t text;
    req text;
BEGIN
    FOREACH path IN ARRAY ARRAY['alone', 'locked', 'spi'] LOOP
        t := 'gk_num_' || path;
        FOREACH req IN ARRAY ARRAY[
            $q$SELECT idem_transition(%L, '1', 'paid')$q$,
            $q$SELECT idem_transition(%L, '1.000', 'paid')$q$,
            $q$SELECT idem_transition(%L, '1', 'shipped', 1)$q$,
            $q$SELECT idem_transition(%L, '2.5', 'paid', 0)$q$,
            $q$SELECT idem_transition(%L, '2.500', 'paid', 0)$q$,
            $q$SELECT idem_transition(%L, '3', 'paid')$q$] LOOP
            INSERT INTO gk_outcomes (t, request, outcome)
            VALUES (t, format(req, 't'), gk_err(format(req, t)));
        END LOOP;
        t := 'gk_ci_' || path;
        FOREACH req IN ARRAY ARRAY[
            $q$SELECT idem_transition(%L, 'order-a', 'paid')$q$,
            $q$SELECT idem_transition(%L, 'ORDER-A', 'paid')$q$,
            $q$SELECT idem_transition(%L, 'Order-A', 'shipped', 1)$q$,
            $q$SELECT idem_transition(%L, 'oRdEr-B', 'paid', 0)$q$,
            $q$SELECT idem_transition(%L, 'order-c', 'paid')$q$] LOOP
            INSERT INTO gk_outcomes (t, request, outcome)
            VALUES (t, format(req, 't'), gk_err(format(req, t)));
        END LOOP;
    END LOOP;
END;
$$;
SELECT t, request, outcome FROM gk_outcomes WHERE t LIKE '%\_alone' ORDER BY n;
-- the other paths answer the same
SELECT o.t, o.request, o.outcome, a.outcome AS alone
  FROM gk_outcomes o
  JOIN gk_outcomes a ON a.t = regexp_replace(o.t, '_[a-z]+$', '_alone') AND a.request = o.request
 WHERE o.outcome IS DISTINCT FROM a.outcome;
SELECT count(*) AS outcomes FROM gk_outcomes;
SELECT 'num' AS k, id::text, status, version FROM gk_num_alone
UNION ALL SELECT 'ci', id, status, version FROM gk_ci_alone ORDER BY 1, 2;

-- the key is read as "WHERE key = $1" reads it: not rounded to the column's
-- scale, not checked against a domain; so it finds what that UPDATE finds,
-- in both forms of the key
CREATE TABLE gk_scale (n numeric(5,2) PRIMARY KEY, status text NOT NULL);
CREATE TABLE gk_scale2 (a int, n numeric(5,2), status text NOT NULL, PRIMARY KEY (a, n));
CREATE DOMAIN gk_small AS int CHECK (VALUE < 100);
CREATE TABLE gk_dom (id gk_small PRIMARY KEY, status text NOT NULL);
SELECT idem_guard('gk_scale', 'gk', 'status'), idem_guard('gk_scale2', 'gk', 'status'),
       idem_guard('gk_dom', 'gk', 'status');
INSERT INTO gk_scale VALUES (1.01, 'new');
INSERT INTO gk_scale2 VALUES (1, 1.01, 'new');
INSERT INTO gk_dom VALUES (5, 'new');
WITH u AS (UPDATE gk_scale SET status = 'paid' WHERE n = '1.005' AND status = 'new' RETURNING 1)
SELECT count(*) AS updated FROM u;
SELECT idem_transition('gk_scale', '1.005', 'paid');
SELECT idem_transition('gk_scale2', ARRAY['1', '1.005'], 'paid');
WITH u AS (UPDATE gk_dom SET status = 'paid' WHERE id = '500' AND status = 'new' RETURNING 1)
SELECT count(*) AS updated FROM u;
SELECT idem_transition('gk_dom', '500', 'paid');
SELECT idem_transition('gk_dom', '5', 'paid');
SELECT idem_transition('gk_scale', '1.010', 'paid');
SELECT * FROM gk_scale UNION ALL SELECT n, status FROM gk_scale2;
DROP TABLE gk_scale, gk_scale2, gk_dom;
DROP DOMAIN gk_small;

DROP TABLE gk_num_alone, gk_num_locked, gk_num_spi, gk_ci_alone, gk_ci_locked, gk_ci_spi,
           gk_outcomes;
DROP FUNCTION gk_make(text, text, text), gk_noop(), gk_err(text);
DROP COLLATION gk_ci;
SELECT idem_disallow('gk', 'new', 'paid'), idem_disallow('gk', 'paid', 'shipped');
