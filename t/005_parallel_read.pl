
# Copyright (c) idem contributors
#
# A read in parallel mode (idem_offset_get, idem_token_status and
# idem_claim_info are PARALLEL SAFE) can take no snapshot: it judges each
# version of the row as it stands.  A row that another transaction moves
# to another page (an update that is not HOT) has two versions; when the
# index gives the new one first (VACUUM freed room before the old one),
# the new one is judged while its transaction is in progress, and the old
# one once it committed: both are missed, unless the read looks again.
# Here a writer advances one offset in transactions of one update each,
# none of them HOT (an index on the offset), VACUUM frees room all the time,
# and parallel workers read the offset 100,000 times: never NULL.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('parallel_read', 'autovacuum = off');
$node->safe_psql('postgres', q{
CREATE INDEX offsets_offset ON idem.offsets ("offset");
SELECT idem_offset_advance('c', 's', 0, 1);
CREATE PROCEDURE writer(n int) LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 2..n LOOP
		PERFORM idem_offset_advance('c', 's', 0, i);
		COMMIT;
	END LOOP;
END $$;});

my ($wout, $werr, $rout, $rerr) = ('', '', '', '');
my $writer = IPC::Run::start(
	[ 'psql', '-X', '-qAt', '-d', $node->connstr('postgres'), '-c', 'CALL writer(100000000)' ],
	'>', \$wout, '2>', \$werr);
$node->poll_query_until('postgres', q{SELECT idem_offset_get('c', 's', 0) > 100})
  or die 'the writer did not start';
# short statements, so that VACUUM is held back by none of them
my $tmp = PostgreSQL::Test::Utils::tempdir;
open(my $script, '>', "$tmp/reader.sql") or die;
print $script "SET force_parallel_mode = on;\n";
print $script q{SELECT count(*) FILTER (WHERE v IS NULL) FROM (SELECT idem_offset_get('c', 's', 0) v FROM generate_series(1, 500)) x;}
  . "\n" for 1 .. 200;
close($script);
my $reader = IPC::Run::start(
	[ 'psql', '-X', '-qAt', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'), '-f', "$tmp/reader.sql" ],
	'>', \$rout, '2>', \$rerr);
# room freed before the row all the time, so that new versions go there
my $vacuums = 0;
while ($reader->pumpable)
{
	$node->safe_psql('postgres', 'VACUUM idem.offsets');
	$vacuums++;
	$reader->pump_nb;
	select(undef, undef, undef, 0.2);
}
$reader->finish;
my $advanced = $node->safe_psql('postgres', q{SELECT idem_offset_get('c', 's', 0)});
$node->safe_psql('postgres',
	q{SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE 'CALL writer%'});
$writer->finish;

my @counts = split /\n/, $rout;
my $missed = 0;
$missed += $_ for @counts;
is($rerr, '', 'the parallel reads ran without an error');
is(scalar(@counts) . " statements, $missed missed", '200 statements, 0 missed',
	'a read in parallel mode never misses the row a writer moves')
  or diag("offset advanced to $advanced, $vacuums vacuums");
cmp_ok($advanced, '>', 1000, 'the writer moved the row meanwhile');

$node->stop;
done_testing();
