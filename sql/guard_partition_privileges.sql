-- state-transition guard: idem_transition on a partitioned table checks the
-- privileges of the UPDATE it stands for also when no partition takes the
-- key (or the table has no partition): a caller who may not update the
-- state column is refused (42501) as that UPDATE would be, not told
-- not_found.  The objects of this file start with "gpp".
\set VERBOSITY terse

SELECT idem_allow('gpp', 'new', 'paid');
CREATE TABLE gpp_orders (region text, id integer, status text NOT NULL, note text,
                         PRIMARY KEY (region, id)) PARTITION BY LIST (region);
CREATE TABLE gpp_orders_eu PARTITION OF gpp_orders FOR VALUES IN ('eu');
SELECT idem_guard('gpp_orders', 'gpp', 'status');
INSERT INTO gpp_orders VALUES ('eu', 1, 'new'), ('eu', 2, 'new');
CREATE TABLE gpp_empty (region text, id integer, status text NOT NULL, note text,
                        PRIMARY KEY (region, id)) PARTITION BY LIST (region);
SELECT idem_guard('gpp_empty', 'gpp', 'status');
CREATE ROLE regress_idem_gpp_alice;
CREATE ROLE regress_idem_gpp_bob;
GRANT SELECT, UPDATE (note) ON gpp_orders, gpp_empty TO regress_idem_gpp_alice;
GRANT SELECT, UPDATE (status) ON gpp_orders, gpp_empty TO regress_idem_gpp_bob;

SET ROLE regress_idem_gpp_alice;
UPDATE gpp_orders SET status = 'paid' WHERE region = 'xx' AND id = 1;
SELECT idem_transition('gpp_orders', ARRAY['xx', '1'], 'paid');
SELECT idem_transition('gpp_orders', ARRAY['eu', '2'], 'paid');
UPDATE gpp_empty SET status = 'paid' WHERE region = 'eu' AND id = 1;
SELECT idem_transition('gpp_empty', ARRAY['eu', '1'], 'paid');
RESET ROLE;

-- who may update the state column is told not_found
SET ROLE regress_idem_gpp_bob;
SELECT idem_transition('gpp_orders', ARRAY['xx', '1'], 'paid');
SELECT idem_transition('gpp_orders', ARRAY['eu', '2'], 'paid');
SELECT idem_transition('gpp_empty', ARRAY['eu', '1'], 'paid');
RESET ROLE;

DROP TABLE gpp_orders, gpp_empty;
DROP ROLE regress_idem_gpp_alice, regress_idem_gpp_bob;
DELETE FROM idem.transitions WHERE machine = 'gpp';
