# Claims keep working while the definitions of idem's table change under
# them: statistics updates, new and dropped indexes and rewrites send
# relcache invalidations that reach a backend in the middle of a claim.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('invalidation', 'autovacuum = off');

# Claims of new and repeated ids, single and batched, from several clients,
# while one client keeps changing the table's definition.
$node->pgbench(
	'--no-vacuum --client=4 --jobs=2 --time=8 --protocol=simple',
	0,
	[qr{processed: [1-9]}],
	[qr{^$}],
	'claims succeed while the table is analysed, indexed and rewritten',
	{
		'claim@20' => q{
\set id random(1, 20000)
SELECT idem_claim('k' || :id);
SELECT idem_try_claim('t' || :id);
SELECT idem_claim_batch(ARRAY['b' || :id, 'b' || (:id + 1), 'k' || :id]);
SELECT idem_release('t' || :id);
},
		'ddl@1' => q{
ANALYZE idem.claims;
CREATE INDEX IF NOT EXISTS claims_extra_:client_id ON idem.claims (claimed_at);
SELECT pg_sleep(0.01);
DROP INDEX IF EXISTS idem.claims_extra_:client_id;
CLUSTER idem.claims USING claims_pkey;
}
	});

# Every claim is still unique and findable through the primary key: the
# claims are listed from the heap, not from that index.
is( $node->safe_psql(
		'postgres',
		'SELECT count(*) = count(DISTINCT (ns, msg_id)) FROM idem.claims'),
	't',
	'no claim was made twice');
is( $node->safe_psql(
		'postgres', q{
SET enable_indexscan = off;
SET enable_indexonlyscan = off;
SET enable_bitmapscan = off;
SELECT count(*) FROM idem.claims c
 WHERE idem_claim_info(c.msg_id, c.ns) IS NULL}),
	'0',
	'every claim is found by key');
is( $node->safe_psql(
		'postgres',
		q{SELECT idem_claim(msg_id) FROM idem.claims WHERE msg_id LIKE 'k%' LIMIT 1}),
	'f',
	'a claimed id is still a duplicate');
unlike(slurp_file($node->logfile),
	qr/was not opened|TRAP|terminated by signal/,
	'no internal error in the server log');

$node->stop;
done_testing();
