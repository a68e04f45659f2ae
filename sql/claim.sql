-- consumer dedup: the outcomes of idem_claim and its variants
\set VERBOSITY terse
SELECT idem_claim('m1');
SELECT idem_claim('m1');
SELECT idem_claim('m1', 'other');
