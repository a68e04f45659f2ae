-- One idem_claim_batch of :batch new ids per transaction (run.sh passes
-- batch).  Each id is drawn at random over the same key range as in
-- idem_new.sql, so that a batch has no locality a stream of single claims
-- would lack.
SELECT idem_claim_batch(ARRAY(
    SELECT 'm' || (1000000000000000000 + (random() * 8200000000000000000)::int8)
      FROM generate_series(1, :batch) g));
