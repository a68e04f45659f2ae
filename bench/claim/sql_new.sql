-- One new id per transaction, hand-written: the same ids as idem_new.sql.
\set r random(1000000000000000000, 9200000000000000000)
INSERT INTO bench.dedup VALUES ('default', 'm' || :r, now()) ON CONFLICT DO NOTHING;
