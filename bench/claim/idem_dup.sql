-- One duplicate per transaction through idem: an id drawn from the
-- pre-filled ones (run.sh passes rows and step).
\set k 1000000000000000000 + random(1, :rows) * :step
SELECT idem_claim('m' || :k);
