-- a transaction that sends to many topics remembers them (to notify an
-- idle relay of each when it commits) in a hash table once they are many:
-- searching a list of them at every send took time growing with the square
-- of their number; rolled back, so that nothing is left
\set VERBOSITY terse
CREATE FUNCTION pg_temp.elapsed(q text) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := clock_timestamp();
BEGIN
    EXECUTE q;
    RETURN extract(epoch FROM clock_timestamp() - t);
END
$$;
BEGIN;
SELECT pg_temp.elapsed($q$SELECT count(idem_outbox_send('mt', 'k' || g, '{}')) FROM generate_series(1, 60000) g$q$) AS one
\gset
SELECT pg_temp.elapsed($q$SELECT count(idem_outbox_send('mt-' || g, 'k', '{}')) FROM generate_series(1, 60000) g$q$) AS many
\gset
SELECT :many < 5 * :one AS about_as_fast;
-- a topic sent to again is remembered once
SELECT count(idem_outbox_send('mt-' || (g % 20), 'k', '{}')) FROM generate_series(1, 100) g;
ROLLBACK;
