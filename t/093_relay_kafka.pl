
# Copyright (c) idem contributors
#
# idem-relay's kafka sink, against librdkafka's mock cluster (three brokers
# speaking the real Kafka protocol inside the relay's process, set with
# kafka.property.test.mock.num.brokers).  What it shows: the idempotent
# producer (acks=all) gets a delivery report for every message, the relay
# acknowledges a message only after its report, and the reports come in the
# order of each key; a delivery error (brokers that cannot be reached) is
# retried, with the error kept in the outbox.  What it does not show: a
# consumer reading the messages back (the mock cluster lives and dies with
# the relay's process).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $bindir = `pg_config --bindir`;
chomp $bindir;
my $relay = "$bindir/idem-relay";
my $node = idem_node('kafka');
my %pgenv = (PGHOST => $node->host, PGPORT => $node->port, PGDATABASE => 'postgres');

sub sql { return $node->safe_psql('postgres', $_[0]); }

sub run_relay
{
	my (@args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ $relay, @args ], '>', \$out, '2>', \$err,
		init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; },
		IPC::Run::timeout(60));
	return ($? >> 8, $out, $err);
}

my $nkeys = 10;
my $per_key = 10;
my $n = $nkeys * $per_key;
my @ids = split /\n/, sql(qq{
	SELECT idem_outbox_send('orders', 'k' || k, jsonb_build_object('seq', s), NULL, 'order.paid')
	FROM generate_series(1, $per_key) s, generate_series(1, $nkeys) k ORDER BY s, k});
my %key_of;
my %seq_of;
my $i = 0;
for my $s (1 .. $per_key)
{
	for my $k (1 .. $nkeys)
	{
		$key_of{ $ids[$i] } = "k$k";
		$seq_of{ $ids[$i] } = $s;
		$i++;
	}
}

my ($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.test.mock.num.brokers=3',
	'--batch', '20', '--lease', '10s', '--timeout', '5s', '--once', '--verbose', '--log-interval', '0');
is($rc, 0, 'the relay delivered to the mock cluster and stopped (--once)') or diag($err);
is(sql('SELECT count(*) FROM idem.outbox'), 0, 'every message acknowledged');
my @delivered = $err =~ /delivered (\S+) \(topic orders/g;
is(scalar(@delivered), $n, "$n delivery reports");
my %count;
$count{$_}++ for @delivered;
is(scalar(grep { $count{$_} == 1 } @ids), $n, 'each message reported once');
my %last;
my $in_order = 1;
for my $id (@delivered)
{
	my $k = $key_of{$id};
	$in_order = 0 if defined $last{$k} && $seq_of{$id} != $last{$k} + 1;
	$last{$k} = $seq_of{$id};
}
ok($in_order, 'the reports of each key in the order of its messages');

# Brokers that cannot be reached: every delivery fails within the timeout,
# and the messages are retried.
sql(q{SELECT idem_outbox_send('orders', 'k1', '{"seq": 11}')});
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.brokers=127.0.0.1:1',
	'--lease', '5s', '--timeout', '1s', '--once', '--verbose', '--log-interval', '0');
is($rc, 0, 'the relay stopped (--once)');
like($err, qr/retry .* after the topic's backoff: kafka: /, 'the failed delivery is retried');
is(sql(q{SELECT count(*) FROM idem.outbox_keys WHERE last_error LIKE 'kafka: %' AND NOT dead}), 1,
	'the error is kept in the outbox, the message waits for its next attempt');
is(sql('SELECT count(*) FROM idem.outbox'), 1, 'and is not acknowledged');

# Settings that would weaken the guarantees are refused.
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.acks=1');
is($rc, 1, 'acks=1 is refused');
like($err, qr/acks must stay all/, 'with a message');
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.no.such=1');
is($rc, 1, 'an unknown librdkafka setting is refused');

done_testing();
