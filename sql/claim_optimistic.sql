-- After 16 new claims in a row a backend skips the pre-check of the next
-- claim: a duplicate is then found by the speculative insertion itself (a
-- row inserted and backed out, counted in the statistics), and from that
-- duplicate on claims are pre-checked again, so that a run of duplicates
-- costs one backed-out row, not one each.
CREATE FUNCTION inserted() RETURNS bigint LANGUAGE sql AS
$$ SELECT n_tup_ins FROM pg_stat_xact_user_tables WHERE relid = 'idem.claims'::regclass $$;
BEGIN;
SELECT count(*) FILTER (WHERE x) AS new_claims
  FROM unnest(idem_claim_batch(ARRAY(SELECT 'opt' || g FROM generate_series(1, 20) g))) x;
SELECT inserted();
SELECT idem_claim('opt21');
SELECT inserted();
-- a duplicate, found by the insertion
SELECT idem_claim('opt1');
SELECT inserted();
-- pre-checked again: no row inserted for these duplicates
SELECT idem_claim('opt2'), idem_claim('opt3'), idem_claim('opt21');
SELECT inserted();
-- new claims: pre-checked until 16 in a row, then not
SELECT count(*) FILTER (WHERE idem_claim('opt' || g)) FROM generate_series(22, 37) g;
SELECT idem_claim('opt4');
SELECT inserted();
-- a redelivered batch after a run of new claims: one backed-out row
SELECT count(*) FILTER (WHERE idem_claim('opt' || g)) FROM generate_series(38, 53) g;
SELECT inserted();
SELECT idem_claim_batch(ARRAY['opt7', 'opt5', 'opt6', 'opt8']);
SELECT inserted();
SELECT count(*) FROM idem.claims WHERE msg_id LIKE 'opt%';
ROLLBACK;
DROP FUNCTION inserted();
