
# Copyright (c) idem contributors
#
# Tokens consumed by many clients at once, exactly once.  Clients consume
# random tokens of a shared set, each time giving the token as issued (its
# row found at the hint), with a hint pointing nowhere, or with another
# token's hint (both found through the primary key); a quarter of the
# transactions roll back.  Meanwhile the table is vacuumed, and rewritten by
# VACUUM FULL, which moves the rows and leaves every hint stale (6,000
# transactions, a fixed number rather than a time).  Afterwards
# every token consumed by a committed transaction was consumed by exactly
# one, its status says so, and every other token is still valid, including
# those whose consumption was rolled back.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $tokens = 4000;
my $node   = idem_node('token_races', 'autovacuum = off');
$node->safe_psql(
	'postgres', qq{
	CREATE EXTENSION amcheck;
	CREATE TABLE tok (n int PRIMARY KEY, t text NOT NULL);
	INSERT INTO tok SELECT n, idem_token_issue('race', '1 day')
	  FROM generate_series(1, $tokens) n;
	-- consumptions that returned true, in committed transactions
	CREATE TABLE wins (n int NOT NULL, way int NOT NULL);
	-- consumptions that returned true, in transactions rolled back
	CREATE TABLE undone (n int NOT NULL);
});

$node->pgbench(
	'--no-vacuum --client=6 --jobs=2 --transactions=1000',
	0,
	[qr{processed: [1-9]}],
	[qr{^$}],
	'consumers race on shared tokens, with rollbacks, vacuums and rewrites',
	{
		'consume@40' => qq{
\\set r random(1, $tokens)
\\set way random(0, 2)
\\set rb random(0, 3)
BEGIN;
SELECT idem_token_consume(CASE :way
                              WHEN 0 THEN t
                              WHEN 1 THEN left(t, 43) || 'AAAAAAAA'
                              ELSE left(t, 43) || (SELECT right(o.t, 8) FROM tok o
                                                    WHERE o.n = :r % $tokens + 1)
                          END, 'race')::int AS won
  FROM tok WHERE n = :r \\gset
INSERT INTO wins SELECT :r, :way WHERE :won = 1;
\\if :rb = 0
ROLLBACK;
INSERT INTO undone SELECT :r WHERE :won = 1;
\\else
COMMIT;
\\endif
},
		'vacuum@1' => q{
VACUUM idem.tokens;
SELECT pg_sleep(0.05);
},
		'rewrite@1' => q{
VACUUM FULL idem.tokens;
SELECT pg_sleep(0.05);
},
	});

note $node->safe_psql(
	'postgres', q{
	SELECT format('tokens consumed: %s (as issued %s, hint nowhere %s, another hint %s); '
	              || 'consumptions rolled back: %s, of tokens consumed again later: %s',
	              (SELECT count(*) FROM wins),
	              (SELECT count(*) FROM wins WHERE way = 0),
	              (SELECT count(*) FROM wins WHERE way = 1),
	              (SELECT count(*) FROM wins WHERE way = 2),
	              (SELECT count(*) FROM undone),
	              (SELECT count(*) FROM undone WHERE n IN (SELECT n FROM wins)))});
is( $node->safe_psql(
		'postgres',
		'SELECT count(*) > 500, count(*) = count(DISTINCT n) FROM wins'),
	't|t',
	'no token was consumed by two committed transactions');
is($node->safe_psql('postgres', 'SELECT count(DISTINCT way) FROM wins'),
	'3', 'tokens were consumed in each of the three ways');
is( $node->safe_psql(
		'postgres', q{
	SELECT count(*) FROM tok
	 WHERE (idem_token_status(t, 'race') = 'consumed')
	       <> (n IN (SELECT n FROM wins))}),
	'0',
	'a token is consumed exactly when a committed transaction consumed it');
is( $node->safe_psql(
		'postgres', q{
	SELECT count(*) > 0,
	       count(*) FILTER (WHERE n IN (SELECT n FROM wins)) > 0
	  FROM undone}),
	't|t',
	'rolled-back consumptions happened, and their tokens were consumed again');
is( $node->safe_psql(
		'postgres', q{
	SELECT count(*) FILTER (WHERE n IN (SELECT n FROM wins)
	                          = idem_token_consume(t, 'race'))
	  FROM tok}),
	'0',
	'every token not consumed (rolled back or never tried) is still valid, the others are not');
is( $node->safe_psql(
		'postgres', q{
	SELECT count(*) FROM verify_heapam('idem.tokens');
	SELECT bt_index_check('idem.tokens_pkey', true),
	       bt_index_check('idem.tokens_expires_at_idx', true)}),
	"0\n|",
	'amcheck finds the table and its indexes consistent');

$node->stop;
done_testing();
