# Copyright (c) idem contributors
#
# Statistics in shared memory: without preloading they fail with 55000 and
# everything else works; with it, the Prometheus text parses with the
# Prometheus client's own parser, the namespace limit sends new namespaces
# to "*", and a duplicate rate above idem.duplicate_rate_warning is logged
# once per interval.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use IdemTest;

# ---- without preloading ----
my $plain = idem_node('plain');
is($plain->safe_psql('postgres', q{SELECT idem_claim('m', 'ns'), idem_claim('m', 'ns')}),
	't|f', 'without preloading: claims work');
for my $q ('SELECT * FROM idem_stats', 'SELECT idem_metrics()', 'SELECT idem_stats_reset()')
{
	is(sqlstate_of($plain, 'postgres', $q), '55000', "without preloading: $q fails with 55000");
}
my ($ret, $out, $err) = $plain->psql('postgres', 'SELECT * FROM idem_stats');
like($err, qr/shared_preload_libraries/, 'the error says idem must be preloaded');
$plain->stop;

sub poll_show
{
	my ($n, $guc, $want) = @_;
	for (my $i = 0; $i < 10 * $PostgreSQL::Test::Utils::timeout_default; $i++)
	{
		return 1 if $n->safe_psql('postgres', "SHOW $guc") eq $want;
		usleep(100_000);
	}
	return 0;
}

# ---- preloaded ----
my $node = idem_node('stats',
	"shared_preload_libraries = 'idem'",
	'idem.max_namespaces = 10',
	'idem.duplicate_rate_warning = 0.3',
	"idem.duplicate_rate_interval = '1s'",
	'idem.duplicate_rate_min_operations = 10',
	# no round judges a rate before the test below asks for rounds
	"idem.maintenance_interval = '1h'");

# the metrics text, parsed by prometheus_client
$node->safe_psql('postgres', q{
SELECT idem_claim('m' || i % 5, 'orders') FROM generate_series(1, 10) i;
SELECT idem_outbox_send('events', 'k', '{}');
SELECT idem_token_issue('scope "with" \\ quotes', '1 hour');});
my $metrics = $node->safe_psql('postgres', 'SELECT idem_metrics()');
my $parser = <<'PY';
import sys
from prometheus_client.parser import text_string_to_metric_families
samples = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        samples[(s.name, s.labels.get('namespace'), s.labels.get('outcome'))] = s.value
print(int(samples[('idem_claims_total', 'orders', 'claimed')]),
      int(samples[('idem_claims_total', 'orders', 'duplicate')]),
      int(samples[('idem_outbox_messages_total', 'events', 'sent')]),
      int(samples[('idem_tokens_total', 'scope "with" \\ quotes', 'issued')]),
      samples[('idem_stats_reset_timestamp_seconds', None, None)] > 1.7e9)
PY
my ($pout, $perr) = ('', '');
IPC::Run::run([ 'python3', '-c', $parser ], '<', \$metrics, '>', \$pout, '2>', \$perr);
is($pout, "5 5 1 1 True\n", 'prometheus_client parses the metrics and reads the counters')
  or diag $perr;

# the duplicate rate warning, once the interval is over: judged at the next
# commit of the namespace, over what it did since it was last judged (3 s
# here, not the 1 s interval); "calm" (one duplicate in 21) is judged too,
# and stays under the warning
my $offset = -s $node->logfile;
$node->safe_psql('postgres', q{SELECT idem_claim('d' || i % 4, 'noisy') FROM generate_series(1, 20) i;
SELECT idem_claim('c' || i, 'calm') FROM generate_series(1, 20) i;});
sleep 3;
$node->safe_psql('postgres', q{SELECT idem_claim('d1', 'noisy'), idem_claim('c1', 'calm')});
ok(wait_for_log($node, qr/duplicate rate of claim namespace "noisy" is 0\.8\d*/, $offset),
	'a duplicate rate above the warning is logged, with the namespace and the rate');
my $log = slurp_file($node->logfile, $offset);
my ($covered) = $log =~ /duplicate rate of claim namespace "noisy" is [\d.]+ over the last (\d+) s/;
cmp_ok($covered // 0, '>=', 3, 'the line gives the time the rate covers: since it was last judged');
my $lines = () = $log =~ /duplicate rate of claim namespace "noisy"/g;
is($lines, 1, 'one line per interval');
unlike($log, qr/duplicate rate of claim namespace "calm"/, 'a namespace under the warning is not logged');
# more duplicates within the interval (made an hour, so that no interval can
# end meanwhile) are not judged again at their commits
$node->append_conf('postgresql.conf', "idem.duplicate_rate_interval = '1h'");
$node->reload;
ok(poll_show($node, 'idem.duplicate_rate_interval', '1h'), 'the interval is an hour');
$offset = -s $node->logfile;
$node->safe_psql('postgres', q{SELECT idem_claim('d' || i % 4, 'noisy') FROM generate_series(1, 20) i});
$node->safe_psql('postgres', q{SELECT idem_claim('d' || i % 4, 'noisy') FROM generate_series(1, 20) i});
unlike(slurp_file($node->logfile, $offset), qr/duplicate rate of claim namespace "noisy"/,
	'more duplicates within the interval are not logged again');

# a burst of duplicates followed by silence: judged by the maintenance
# worker's next round, without another commit of the namespace's work, in
# one line that names the database
$node->append_conf('postgresql.conf', "idem.maintenance_interval = '1s'\nidem.duplicate_rate_interval = '1s'");
$node->reload;
ok(poll_show($node, 'idem.duplicate_rate_interval', '1s'), 'the interval is a second again');
$offset = -s $node->logfile;
$node->safe_psql('postgres', q{SELECT idem_claim('q' || i % 4, 'quiet') FROM generate_series(1, 20) i});
ok(wait_for_log($node, qr/duplicate rate of claim namespace "quiet" is 0\.8\d* over the last \d+ s/, $offset),
	'a namespace silent after a burst of duplicates is judged by the maintenance worker');
ok(wait_for_log($node, qr/DETAIL:  16 of 20 operations in database "postgres" were duplicates/, $offset),
	'its line names the database');
# three more rounds: the silent namespace has nothing more to judge
sleep 3;
$log = slurp_file($node->logfile, $offset);
$lines = () = $log =~ /duplicate rate of claim namespace "quiet"/g;
is($lines, 1, 'and it is logged once');

# a round that waits on a lock (a session holds idem.requests, which the
# round purges after the claims and tokens): the launcher still judges
# namespaces silent since a burst at every interval meanwhile, and the round
# goes on once the lock is gone
sub poll_stats
{
	my ($q, $want) = @_;
	for (my $i = 0; $i < 10 * $PostgreSQL::Test::Utils::timeout_default; $i++)
	{
		return 1 if $node->safe_psql('postgres', $q) eq $want;
		usleep(100_000);
	}
	return 0;
}
my $holder = IdemTest::Session->new($node, 'postgres');
$holder->query("BEGIN; LOCK TABLE idem.requests IN ACCESS EXCLUSIVE MODE; SELECT 1;");
ok(poll_stats(q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem maintenance round' AND wait_event_type = 'Lock'}, '1'),
	'a round waits for a lock on idem.requests');
$offset = -s $node->logfile;
$node->safe_psql('postgres', q{SELECT idem_claim('s' || i % 4, 'stuck') FROM generate_series(1, 20) i});
ok(wait_for_log($node, qr/duplicate rate of claim namespace "stuck" is 0\.8\d* over the last \d+ s/, $offset),
	'a namespace silent after a burst of duplicates is judged while a round waits on a lock');
$holder->query("COMMIT;");
$holder->close;
ok(poll_stats(q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem maintenance round' AND wait_event_type = 'Lock'}, '0'),
	'the round goes on once the lock is gone');

# the namespace limit: new namespaces are counted under "*"
$node->safe_psql('postgres', q{SELECT idem_stats_reset();
SELECT idem_claim('m', 'limit-' || i) FROM generate_series(1, 20) i;});
my $rows = $node->safe_psql('postgres', q{
SELECT count(*) FILTER (WHERE ns <> '*'), sum(operations) FROM idem_stats WHERE kind = 'claim'});
my ($named, $sum) = split /\|/, $rows;
cmp_ok($named, '<=', 10, 'at most idem.max_namespaces namespaces are tracked')
  or diag $node->safe_psql('postgres', 'SHOW idem.max_namespaces');
is($sum, '20', 'every claim is counted, the namespaces beyond the limit under "*"');
is($node->safe_psql('postgres', q{SELECT operations > 0 FROM idem_stats WHERE kind = 'claim' AND ns = '*'}),
	't', 'the namespace "*" holds the rest');

$node->stop;

# The entries of a dropped database are removed, so that their room (and
# their part of the limit) is taken again: by idem_stats_reset, and by the
# maintenance worker's launcher at each round.  Without that, the namespaces
# of databases dropped long ago made every new one count under "*".
my $drop = idem_node('stats_drop',
	"shared_preload_libraries = 'idem'",
	'idem.max_namespaces = 10',
	"idem.maintenance_interval = '1h'");
$drop->safe_psql('postgres', q{CREATE DATABASE gone});
$drop->safe_psql('gone', q{CREATE EXTENSION idem; SELECT idem_claim('m', 'g' || i) FROM generate_series(1, 10) i});
$drop->safe_psql('postgres', q{SELECT idem_claim('m', 'p1')});
is($drop->safe_psql('postgres', q{SELECT string_agg(ns, ',') FROM idem_stats WHERE kind = 'claim'}),
	'*', 'the limit reached by another database: a new namespace is counted under "*"');
$drop->safe_psql('postgres', q{DROP DATABASE gone});
$drop->safe_psql('postgres', q{SELECT idem_stats_reset(); SELECT idem_claim('m', 'p2')});
is($drop->safe_psql('postgres', q{SELECT string_agg(ns, ',' ORDER BY ns) FROM idem_stats WHERE kind = 'claim'}),
	'p2', 'once that database is dropped, idem_stats_reset removes its entries: the next one has its own');
$drop->safe_psql('postgres', q{CREATE DATABASE gone2});
$drop->safe_psql('gone2', q{CREATE EXTENSION idem; SELECT idem_claim('m', 'h' || i) FROM generate_series(1, 9) i});
$drop->safe_psql('postgres', q{DROP DATABASE gone2});
# the dropped database's entries still take the room until the next round
$drop->safe_psql('postgres', q{SELECT idem_claim('m', 'p3')});
is($drop->safe_psql('postgres', q{SELECT string_agg(ns, ',' ORDER BY ns) FROM idem_stats WHERE kind = 'claim'}),
	'*,p2', 'until then, a new namespace is counted under "*"');
$drop->append_conf('postgresql.conf', "idem.maintenance_interval = '1s'");
$drop->reload;
my $own = 0;
for (my $i = 0; $i < 10 * $PostgreSQL::Test::Utils::timeout_default && !$own; $i++)
{
	$drop->safe_psql('postgres', q{SELECT idem_claim('m' || random(), 'p3')});
	$own = $drop->safe_psql('postgres', q{SELECT count(*) FROM idem_stats WHERE kind = 'claim' AND ns = 'p3'}) eq '1';
	usleep(100_000) unless $own;
}
ok($own, 'and so does the maintenance worker\'s launcher, at its next round');
$drop->stop;
done_testing();
