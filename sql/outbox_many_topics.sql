-- a transaction that sends to many topics remembers them (to notify an
-- idle relay of each when it commits) in a hash table once they are many
-- (searching a list of them at every send took time growing with the square
-- of their number); rolled back, so that nothing is left
\set VERBOSITY terse
BEGIN;
SELECT count(idem_outbox_send('mt-' || g, 'k', '{}')) FROM generate_series(1, 5000) g;
-- a topic sent to again is remembered once
SELECT count(idem_outbox_send('mt-' || (g % 20), 'k', '{}')) FROM generate_series(1, 100) g;
SELECT count(*) AS messages, count(DISTINCT aggregatetype) AS topics FROM idem.outbox WHERE aggregatetype LIKE 'mt-%';
ROLLBACK;
