-- One duplicate per transaction, hand-written: the same ids as idem_dup.sql.
\set k 1000000000000000000 + random(1, :rows) * :step
INSERT INTO bench.dedup VALUES ('default', 'm' || :k, now()) ON CONFLICT DO NOTHING;
