-- One new id per transaction through idem.  The id is a random 64-bit
-- number, spread over the same key range as the pre-filled ids.
\set r random(1000000000000000000, 9200000000000000000)
SELECT idem_claim('m' || :r);
