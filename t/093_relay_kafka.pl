
# Copyright (c) idem contributors
#
# idem-relay's kafka sink, against librdkafka's mock cluster (three brokers
# speaking the real Kafka protocol inside the relay's process, set with
# kafka.property.test.mock.num.brokers).  What it shows: the idempotent
# producer (acks=all) gets a delivery report for every message, the relay
# acknowledges a message only after its report, and a key's messages are
# delivered in their order (the relay logs a batch's deliveries once the
# batch is done, so the order of its lines is that of the leases, not that
# of librdkafka's reports); a delivery error (brokers that cannot be reached) is
# retried, with the error kept in the outbox.  Then end to end: a mock
# cluster in a process of its own (test/relay/kafka_mock.c, built here,
# listening on loopback), the relay producing to it, and two consumers of
# one group (examples/consumer_kafka.py: idem_claim and the business write
# in one transaction, the offset committed after it), one of which dies
# between the two: every message applied exactly once, in order per key;
# the survivor's database backend terminated while it waits, and the server
# crashed while its transaction waits for a lock: it reconnects and applies
# the same message; a message whose business write violates a CHECK goes to
# the dead letters once, and the messages after it are applied; a third
# consumer skips the messages of another producer whose idem-message-id is
# missing or cannot be claimed (600 bytes, not UTF-8, a NUL character) and
# goes on after an offset commit the broker refuses, a --namespace over 63
# bytes stops a consumer at start-up, and with the database down for longer
# than max.poll.interval.ms the third consumer leaves its group, applies its
# message once the database is back, joins again and reads the message
# again, a duplicate; with a LATIN1 database, an idem-message-id LATIN1
# cannot hold is skipped, and a key or a value it cannot hold is a dead
# letter, whether the consumer speaks LATIN1 or UTF8 to the server, and a
# --namespace or --name it cannot hold stops the consumer once it reaches
# the database; and the key, value and headers of a message, read back from
# that cluster.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IPC::Run;
use JSON::PP;
use Time::HiRes qw(usleep);
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
ok($in_order, 'the messages of each key delivered in their order');

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

# A message the producer refuses itself (larger than message.max.bytes) is
# refused for good, and the rest of its batch is delivered.
sql(q{
SELECT idem_outbox_send('big', 'b1', '{"n": 1}');
SELECT idem_outbox_send('big', 'b2', jsonb_build_object('blob', repeat('x', 20000)));
SELECT idem_outbox_send('big', 'b3', '{"n": 3}');});
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.test.mock.num.brokers=1',
	'--set', 'kafka.property.message.max.bytes=10000',
	'--lease', '10s', '--timeout', '5s', '--once', '--verbose', '--log-interval', '0');
is($rc, 0, 'the relay stopped (--once)') or diag($err);
is(sql(q{SELECT string_agg(aggregateid, ',' ORDER BY aggregateid) FROM idem.outbox WHERE aggregatetype = 'big'}), 'b2',
	'the messages around the one too large are delivered');
like(sql(q{SELECT last_error FROM idem.outbox_keys WHERE topic = 'big' AND key = 'b2' AND dead}),
	qr/^permanent: kafka: could not produce: .*too large/i, 'the one too large is dead at once, with the error');

# A full producer queue (room for one message here) is waited for within
# the lease: the batch of 20 goes out as delivery reports make room, each
# message at its first attempt, none retried.
sql(q{SELECT idem_outbox_send('qfull', 'q' || k, jsonb_build_object('n', k)) FROM generate_series(1, 20) k});
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.test.mock.num.brokers=1',
	'--set', 'kafka.property.queue.buffering.max.messages=1', '--batch', '20',
	'--lease', '10s', '--timeout', '5s', '--once', '--log-interval', '0');
is($rc, 0, 'the relay stopped (--once)') or diag($err);
like($err, qr/stopped: leased 20, delivered 20, retried 0, dead 0/,
	'a full producer queue is waited for: the 20 messages delivered at their first attempt')
  or diag($err);
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'qfull'}), '0', 'and acknowledged');

# Runs (--per-key): the producer has many messages in flight, but a run is
# given to it one message after the other, and stops at its first message
# not delivered.  r2's fourth message is too large: refused for good, dead;
# the rest of r2 stays in the outbox, held back by it.
sql(join(";\n", map {
		my ($k, $s) = @$_;
		my $body = $k eq 'r2' && $s == 4 ? "jsonb_build_object('seq', 4, 'blob', repeat('x', 20000))"
		  : "jsonb_build_object('seq', $s)";
		"SELECT idem_outbox_send('runs', '$k', $body)"
	} map { my $s = $_; map { [ $_, $s ] } qw(r1 r2 r3) } 1 .. 10));
my %run_msg = map { my ($id, $k, $s) = split /\|/; ($id => "$k:$s") } split /\n/,
  sql(q{SELECT id || '|' || aggregateid || '|' || (payload->>'seq') FROM idem.outbox
        WHERE aggregatetype = 'runs'});
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.test.mock.num.brokers=1',
	'--set', 'kafka.property.message.max.bytes=10000', '--per-key', '8',
	'--lease', '10s', '--timeout', '5s', '--once', '--verbose', '--log-interval', '0');
is($rc, 0, 'the relay leasing runs stopped (--once)') or diag($err);
is(sql(q{SELECT string_agg(aggregateid || ':' || (payload->>'seq'), ',' ORDER BY seq)
         FROM idem.outbox WHERE aggregatetype = 'runs'}),
	'r2:4,r2:5,r2:6,r2:7,r2:8,r2:9,r2:10',
	'with runs, the messages of r2 after its refused one are not produced');
is(sql(q{SELECT dead FROM idem.outbox_keys WHERE topic = 'runs' AND key = 'r2'}), 't',
	'the refused one is dead and holds its key back');
my %rseq;
for my $id ($err =~ /delivered (\S+) \(topic runs/g)
{
	my ($k, $s) = split /:/, $run_msg{$id} // '?:?';
	push @{ $rseq{$k} }, $s;
}
is(join(' ', map { "$_=" . join(',', @{ $rseq{$_} // [] }) } qw(r1 r2 r3)),
	'r1=1,2,3,4,5,6,7,8,9,10 r2=1,2,3 r3=1,2,3,4,5,6,7,8,9,10',
	'each key\'s messages delivered in order, r2 up to its refused message');

# A topic name Kafka would refuse (from the message's key or type, here an
# empty type) is refused for good at once, not retried until the message
# dies; the rest of the batch is delivered.
sql(q{
SELECT idem_outbox_send('named', 'n1', '{"n": 1}', NULL, 'good');
SELECT idem_outbox_send('named', 'n2', '{"n": 2}');
SELECT idem_outbox_send('named', 'n3', '{"n": 3}', NULL, 'a space');});
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.test.mock.num.brokers=1',
	'--set', 'topic.named.kafka.topic={type}',
	'--lease', '10s', '--timeout', '5s', '--once', '--log-interval', '0');
is($rc, 0, 'the relay stopped (--once)') or diag($err);
is(sql(q{SELECT string_agg(aggregateid, ',' ORDER BY aggregateid) FROM idem.outbox WHERE aggregatetype = 'named'}), 'n2,n3',
	'the message whose topic name is valid is delivered');
is(sql(q{SELECT string_agg(key || ': ' || last_error, E'\n' ORDER BY key) FROM idem.outbox_keys
         WHERE topic = 'named' AND dead}),
	qq{n2: permanent: kafka: "" is not a valid Kafka topic name (1 to 249 of a-z, A-Z, 0-9, ".", "_" and "-")\n}
	  . qq{n3: permanent: kafka: "a space" is not a valid Kafka topic name (1 to 249 of a-z, A-Z, 0-9, ".", "_" and "-")},
	'the others are dead at once, with the name');

# A producer that cannot produce (here a transactional producer, which the
# relay does not use as such: every produce fails): the batch is retried after
# the topic's backoff, not leased again at once, which spent an attempt of
# every message in milliseconds until they died.
sql(q{SELECT idem_outbox_configure('stuck', 5, '10 seconds', '1 minute');
SELECT idem_outbox_send('stuck', 's' || i, jsonb_build_object('n', i)) FROM generate_series(1, 10) i;});
{
	my ($sout, $serr) = ('', '');
	my $h = IPC::Run::start([ $relay, '--sink', 'kafka', '--set', 'kafka.property.test.mock.num.brokers=1',
			'--set', 'kafka.property.transactional.id=x', '--lease', '10s', '--timeout', '2s',
			'--poll', '50ms', '--log-interval', '0' ],
		'>', \$sout, '2>', \$serr,
		init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; });
	usleep(3_000_000);
	$h->signal('TERM');
	$h->finish;
	like($serr, qr/leased 10, delivered 0, retried 10, dead 0/, 'the relay leased and retried each once')
	  or diag($serr);
}
is(sql(q{SELECT string_agg(DISTINCT last_error, ', ') FROM idem.outbox_keys WHERE topic = 'stuck'}),
	'kafka: could not produce: Local: Erroneous state', 'every message with the error of the produce');
is(sql(q{SELECT count(*) || '|' || max(attempts) || '|' || count(*) FILTER (WHERE dead) FROM idem.outbox_keys WHERE topic = 'stuck'}),
	'10|1|0', 'each message had one attempt, and waits for its backoff');
sql(q{DELETE FROM idem.outbox WHERE aggregatetype = 'stuck'; DELETE FROM idem.outbox_keys WHERE topic = 'stuck'});

# Settings that would weaken the guarantees are refused.
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.acks=1');
is($rc, 1, 'acks=1 is refused');
like($err, qr/kafka\.property\.acks must stay all \(kafka\.property\.acks: command line\)/,
	'with a message naming where it was set');
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.request.required.acks=1');
is($rc, 1, 'acks=1 through its alias is refused');
like($err, qr/kafka\.property\.request\.required\.acks must stay all \(kafka\.property\.request\.required\.acks: command line\)/,
	'naming the alias that was set, and where');
# A property and its alias set both: the one written last wins, as for one
# name (the topic template refused after them shows that acks passed).
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.request.required.acks=all',
	'--set', 'kafka.property.acks=1');
is($rc, 1, 'acks=1 after its alias set to all is refused');
like($err, qr/kafka\.property\.acks must stay all \(kafka\.property\.acks: command line\)/,
	'naming the name written last');
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.acks=1',
	'--set', 'kafka.property.request.required.acks=all', '--set', 'kafka.topic=my events');
is($rc, 1, 'the alias set to all after acks=1 wins');
like($err, qr/kafka\.topic "my events" cannot give/, 'acks passed: the topic is what is refused')
  or diag($err);
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.enable.idempotence=false');
is($rc, 1, 'enable.idempotence=false is refused');
like($err, qr/enable\.idempotence must stay true/, 'with a message');
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.partitioner=random');
is($rc, 1, 'partitioner=random is refused');
like($err, qr/partitioner must not be random/, 'with a message');
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.delivery.report.only.error=true');
is($rc, 1, 'delivery.report.only.error=true is refused');
like($err, qr/delivery\.report\.only\.error must stay false/, 'with a message');
# A topic template that can never give a valid name is a configuration
# error, not a reason for every message to die.
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.topic=my events');
is($rc, 1, 'a topic template with a space is refused');
like($err, qr/kafka\.topic "my events" cannot give a valid Kafka topic name/, 'with a message');
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'topic.named.kafka.topic=..');
is($rc, 1, 'a topic\'s own template ".." is refused');
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.no.such=1');
is($rc, 1, 'an unknown librdkafka setting is refused');
# Without brokers the producer would start, and every message would die of
# its attempts ("Local: Purged in queue").
($rc, $out, $err) = run_relay('--sink', 'kafka', '--once', '--log-interval', '0');
is($rc, 1, 'no kafka.brokers: exit code 1');
like($err, qr/the kafka sink needs brokers: set kafka\.brokers/, 'and says what to set') or diag($err);
($rc, $out, $err) = run_relay('--sink', 'stdout', '--set', 'topic.tk.sink=kafka', '--once', '--log-interval', '0');
like($err, qr/the kafka sink of topic "tk" needs brokers: set topic\.tk\.kafka\.brokers or kafka\.brokers/,
	'a topic\'s own: the keys that could set them') or diag($err);
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', 'kafka.property.bootstrap.servers=127.0.0.1:1',
	'--once', '--timeout', '1s', '--log-interval', '0');
is($rc, 0, 'bootstrap.servers as a property is brokers too: the relay runs') or diag($err);
unlike($err, qr/needs brokers/, 'and does not ask for kafka.brokers');

########################################################################
# End to end: a mock cluster of its own process, the relay, two consumers
########################################################################

# test/relay/kafka_mock.c, built here: librdkafka's mock cluster on a
# loopback port that the relay and examples/consumer_kafka.py both reach.
my $tmp = PostgreSQL::Test::Utils::tempdir;
my $src = "$FindBin::RealBin/..";
my $python = -x '/usr/bin/python3' ? '/usr/bin/python3' : 'python3';
my ($ccout, $ccerr) = ('', '');
ok( IPC::Run::run([ 'cc', '-Wall', '-o', "$tmp/kafka_mock", "$src/test/relay/kafka_mock.c", '-lrdkafka' ],
		'>', \$ccout, '2>', \$ccerr),
	'the mock cluster program builds') or BAIL_OUT("cannot build test/relay/kafka_mock.c: $ccerr");

my @started;
END { for my $h (@started) { $h->kill_kill if $h->pumpable; } }

my ($mock_in, $mock_out, $mock_err) = ('', '', '');
my $mock = IPC::Run::start([ "$tmp/kafka_mock", '1', 'events', '4' ],
	'<', \$mock_in, '>', \$mock_out, '2>', \$mock_err, IPC::Run::timeout(600));
push @started, $mock;
$mock->pump until $mock_out =~ /\n/ || !$mock->pumpable;
my ($bootstrap) = $mock_out =~ /^(\S+:\d+\S*)$/m;
ok(defined $bootstrap, "the mock cluster listens: $bootstrap") or BAIL_OUT("no mock cluster: $mock_err");

sub file { return -e $_[0] ? slurp_file($_[0]) : ''; }

sub wait_for
{
	my ($what, $cond) = @_;
	for (my $i = 0; $i < 10 * $PostgreSQL::Test::Utils::timeout_default; $i++)
	{
		return 1 if $cond->();
		$mock->pump_nb;
		select(undef, undef, undef, 0.1);
	}
	diag("timed out waiting for $what");
	return 0;
}

# the message left above, whose brokers could not be reached, is not this part's
sql(q{DELETE FROM idem.outbox WHERE aggregatetype = 'orders'});
sql(q{CREATE TABLE applied (n bigserial PRIMARY KEY, msg_id text NOT NULL, key text NOT NULL,
                            payload jsonb NOT NULL, consumer text NOT NULL,
                            CONSTRAINT no_poison CHECK (NOT payload ? 'poison'));
      CREATE TABLE dead_letters (msg_id text NOT NULL, key text NOT NULL, error text NOT NULL,
                                 sqlstate text NOT NULL)});
my $ekeys = 8;
my $eper = 15;
my $etotal = $ekeys * $eper;
sql(qq{SELECT idem_outbox_send('events', 'e' || k, jsonb_build_object('key', 'e' || k, 'seq', s))
       FROM generate_series(1, $eper) s, generate_series(1, $ekeys) k ORDER BY s, k});

# two consumers of one group; c1 dies after its fifth commit, before the
# offset commit, and c2 takes its partitions over
my %consumer;
for my $c ([ 'c1', '--die-after-commit', '5' ], [ 'c2' ])
{
	my ($name, @extra) = @$c;
	$consumer{$name} = { out => "$tmp/$name.out" };
	$consumer{$name}{h} = IPC::Run::start(
		[ $python, "$src/examples/consumer_kafka.py", '--brokers', $bootstrap, '--topic', 'events',
		  '--group', 'workers', '--name', $name, '--session-timeout', '6000', @extra ],
		'>', $consumer{$name}{out}, '2>&1',
		init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; $ENV{PGUSER} = 'postgres'; $ENV{PGAPPNAME} = $name; });
	push @started, $consumer{$name}{h};
}

($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', "kafka.brokers=$bootstrap",
	'--batch', '20', '--lease', '10s', '--timeout', '5s', '--once', '--log-interval', '0');
is($rc, 0, 'the relay produced every message to the mock cluster (--once)') or diag($err);
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'events'}), 0, 'and acknowledged them');

ok(wait_for('the consumers', sub { sql('SELECT count(*) FROM applied') == $etotal }),
	"the consumers applied $etotal messages")
  or diag(file($consumer{c1}{out}) . file($consumer{c2}{out}));
$consumer{c1}{h}->finish;
is($consumer{c1}{h}->result(0), 3, 'consumer c1 died after a commit, before its offset commit (exit code 3)');
my ($died) = file($consumer{c1}{out}) =~ /dying after the commit of ([0-9a-f-]+)/;
ok(defined $died, 'c1 logged the message it died after');
ok( defined $died && wait_for('the redelivery', sub { file($consumer{c2}{out}) =~ /duplicate \Q$died\E/ }),
	'c2 took over its partitions from the last committed offset: that message again, a duplicate for idem_claim');
is(sql(q{SELECT count(*) FROM applied WHERE msg_id = '} . ($died // '') . q{'}), 1,
	'the message c1 died after was applied once');

# While c2 waits for its next message, its backend is terminated and a
# session locks applied; then the rounds 16 and 17 are produced, e3's 16th
# message with "poison" in its payload, which the CHECK of applied refuses.
# c2's next message fails on the dead connection: c2 connects again, and its
# business write waits for the lock.  The server then crashes and starts
# again a second later: c2 fails to connect meanwhile, then applies that
# message on the server started again, and the rest.
my $c2_from = length(file($consumer{c2}{out}));
is(sql(q{SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000)) FROM pg_stat_activity
          WHERE application_name = 'c2'}), 1, "c2's database backend is terminated");
my $locker = IdemTest::Session->new($node, 'postgres');
$locker->query('BEGIN; LOCK TABLE applied IN EXCLUSIVE MODE;');
my @more = split /\n/, sql(qq{
	SELECT idem_outbox_send('events', 'e' || k, jsonb_build_object('key', 'e' || k, 'seq', s)
	         || CASE WHEN k = 3 AND s = $eper + 1 THEN '{"poison": true}' ELSE '{}' END::jsonb)
	FROM generate_series($eper + 1, $eper + 2) s, generate_series(1, $ekeys) k ORDER BY s, k});
my $poison = $more[2];
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', "kafka.brokers=$bootstrap",
	'--lease', '10s', '--timeout', '5s', '--once', '--log-interval', '0');
is($rc, 0, 'the relay produced two more rounds (--once)') or diag($err);
ok( wait_for('c2 to wait for the lock', sub {
			sql(q{SELECT count(*) FROM pg_stat_activity WHERE application_name = 'c2'
			        AND wait_event_type = 'Lock'}) == 1 }),
	'c2 connected again, and its business write waits for the lock')
  or diag(file($consumer{c2}{out}));
like(substr(file($consumer{c2}{out}), $c2_from),
	qr/PostgreSQL: (?:terminating connection|server closed the connection)[^\n]*; reconnecting/,
	'after the error of its terminated connection');
$c2_from = length(file($consumer{c2}{out}));
$node->stop('immediate');
$locker->{h}->kill_kill;
sleep(1);
$node->start;
$eper += 2;
$etotal = $ekeys * $eper;
ok(wait_for('c2 after the crash', sub { sql('SELECT count(*) FROM applied') == $etotal - 1 }),
	'c2 applied the messages on the server started again, but the one CHECK refuses')
  or diag(file($consumer{c2}{out}));
like(substr(file($consumer{c2}{out}), $c2_from), qr/PostgreSQL: connection to server .* failed: [^\n]*; reconnecting/,
	'after failing to connect while the server was down');
# A business write that violates a CHECK (SQLSTATE class 23) fails the same
# way each time: the message goes to the dead letters once, with its claim,
# and the messages of the other keys and the next one of its key go on.
is(sql(q{SELECT msg_id || '|' || key || '|' || sqlstate || '|' || error FROM dead_letters}),
	"$poison|e3|23514|new row for relation \"applied\" violates check constraint \"no_poison\"",
	'the message CHECK refuses is in the dead letters, once, with its key, SQLSTATE and error');
is(sql(qq{SELECT count(*) FROM applied WHERE msg_id = '$poison'}), 0, 'and was not applied');
$consumer{c2}{h}->signal('TERM');
$consumer{c2}{h}->finish;
is($consumer{c2}{h}->full_result(0), 0, 'consumer c2 stops on SIGTERM');

is(sql(q{SELECT count(*), count(DISTINCT msg_id) FROM applied}), ($etotal - 1) . '|' . ($etotal - 1),
	'every message applied exactly once, but the dead letter');
is(sql(q{SELECT count(*) FROM idem.claims WHERE ns = 'kafka'}), $etotal, 'and claimed once in namespace kafka');
my %applied_order;
for my $row (split /\n/, sql(q{SELECT key, payload->>'seq' FROM applied ORDER BY n}))
{
	my ($k, $s) = split /\|/, $row;
	push @{ $applied_order{$k} }, $s;
}
# (e3 without its dead letter, of the last round but one)
is( scalar(grep {
			my $k = $_;
			join(',', @{ $applied_order{$k} // [] }) eq join(',', grep { $k ne 'e3' || $_ != $eper - 1 } 1 .. $eper)
		} map { "e$_" } 1 .. $ekeys),
	$ekeys, 'the messages of each key were applied in the order they were sent');

# Messages of a producer of its own (confluent-kafka), to partition 0:
# HEADERS are [name, value] pairs, the values in hex; key_hex and value_hex,
# when given, the key and the value in hex (value_hex null: a null value).
my $produce_py = <<'PY';
import json, sys
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1]})
failed = []
for m in json.loads(sys.argv[3]):
    key = bytes.fromhex(m["key_hex"]) if "key_hex" in m else m["key"].encode()
    if "value_hex" in m:
        value = bytes.fromhex(m["value_hex"]) if m["value_hex"] is not None else None
    else:
        value = json.dumps(m["value"]).encode()
    p.produce(sys.argv[2], key=key, value=value, partition=0,
              headers=[(k, bytes.fromhex(v)) for k, v in m["headers"]],
              on_delivery=lambda err, msg: failed.append(err) if err else None)
sys.exit(1 if p.flush(30) or failed else 0)
PY
sub produce_to
{
	my ($topic, @msgs) = @_;
	my ($pout, $perr) = ('', '');
	my $ok = IPC::Run::run([ $python, '-c', $produce_py, $bootstrap, $topic, JSON::PP->new->encode(\@msgs) ],
		'>', \$pout, '2>', \$perr, IPC::Run::timeout(60));
	diag($perr) unless $ok;
	return $ok;
}

sub produce { return produce_to('events', @_); }

sub msg_with_id
{
	my ($key, $id) = @_;
	return { key => $key, value => { key => $key, seq => 1 },
		headers => defined $id ? [ [ 'idem-message-id', unpack('H*', $id) ] ] : [] };
}

# c3, of the same group (it takes every partition at their committed
# offsets), with a max.poll.interval.ms of 7 s for the part after this one.
$consumer{c3} = { out => "$tmp/c3.out" };
$consumer{c3}{h} = IPC::Run::start(
	[ $python, "$src/examples/consumer_kafka.py", '--brokers', $bootstrap, '--topic', 'events',
	  '--group', 'workers', '--name', 'c3', '--session-timeout', '6000', '--max-poll-interval', '7000' ],
	'>', $consumer{c3}{out}, '2>&1',
	init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; $ENV{PGUSER} = 'postgres'; $ENV{PGAPPNAME} = 'c3'; });
push @started, $consumer{c3}{h};

# Not from idem-relay: an idem-message-id of 600 bytes, which idem_claim
# refuses (22001), one that is not UTF-8, one with a NUL character, and a
# message without one; then a message that has a good one.  The first four
# cannot be deduplicated: each is skipped and its offset committed, rather
# than retried for ever (which held the partition) or ended the consumer
# (UnicodeDecodeError, or psycopg2's ValueError for a NUL).
ok( produce(msg_with_id('f1', 'x' x 600), msg_with_id('f2', "\xff\xfe"), msg_with_id('f3', "a\x00b"),
		msg_with_id('f4', undef), msg_with_id('f5', 'foreign-5')),
	'five messages of another producer, to partition 0');
ok(wait_for('foreign-5', sub { sql(q{SELECT count(*) FROM applied WHERE msg_id = 'foreign-5'}) == 1 }),
	'the message after them is applied') or diag(file($consumer{c3}{out}));
my $c3_log = file($consumer{c3}{out});
like($c3_log, qr/idem_claim refuses an idem-message-id: msg_id is too long \(SQLSTATE 22001\)/,
	'idem_claim refused the id of 600 bytes');
is(scalar(() = $c3_log =~ /an idem-message-id idem_claim cannot take \([^\n]*\) at events\[0\]@\d+: skipped/g), 3,
	'that one, the one not UTF-8 and the one with a NUL are skipped, once each');
like($c3_log, qr/no idem-message-id at events\[0\]@\d+: skipped/, 'so is the one without an id');
unlike($c3_log, qr/offset commit failed|Traceback/, 'their offsets are committed');
is(sql(q{SELECT count(*) FROM idem.claims WHERE ns = 'kafka'}) . '|' . sql('SELECT count(*) FROM dead_letters'),
	($etotal + 1) . '|1', 'nothing claimed or dead-lettered for them');
ok($consumer{c3}{h}->pumpable, 'c3 runs on');

# The offset commit of a message skipped fails (the broker answers
# UNKNOWN_MEMBER_ID, as it does to a consumer that a rebalance left out):
# logged, and the consumer goes on (it ended with the KafkaException).
$mock_out = '';
$mock_in .= "commit-errors 25 1\n";
$mock->pump until $mock_out =~ /^pushed$/m || !$mock->pumpable;
$mock_out = '';
my $c3_at = length(file($consumer{c3}{out}));
ok(produce(msg_with_id('f6', undef), msg_with_id('f7', 'foreign-7')), 'a message without an id, and one with');
ok(wait_for('foreign-7', sub { sql(q{SELECT count(*) FROM applied WHERE msg_id = 'foreign-7'}) == 1 }),
	'the one with an id is applied') or diag(file($consumer{c3}{out}));
like(substr(file($consumer{c3}{out}), $c3_at),
	qr/no idem-message-id at events\[0\]@\d+: skipped\n(?:.*\n)*?.*offset commit failed: [^\n]*Unknown member/,
	'after the offset commit of the one without an id failed') or diag(file($consumer{c3}{out}));
ok($consumer{c3}{h}->pumpable, 'c3 runs on');

# A namespace idem_claim refuses for every message (over 63 bytes) is an
# error of the command line: the consumer stops at once.
my $ns_h = IPC::Run::start(
	[ $python, "$src/examples/consumer_kafka.py", '--brokers', $bootstrap, '--topic', 'events',
	  '--group', 'ns-check', '--namespace', 'n' x 64 ],
	'>', "$tmp/ns-check.out", '2>&1', init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; });
push @started, $ns_h;
ok(wait_for('the consumer with a namespace of 64 bytes to stop', sub { !$ns_h->pumpable }),
	'a consumer given a namespace of 64 bytes stops') or $ns_h->kill_kill;
$ns_h->finish;
is($ns_h->full_result(0) >> 8, 2, 'with exit code 2');
like(file("$tmp/ns-check.out"), qr/--namespace must be 1 to 63 bytes long/, 'saying why');

# Messages of another producer with an idem-message-id idem_claim takes,
# but a key or a value PostgreSQL's text cannot hold (not UTF-8, a NUL
# character), a null value, and a value that is not JSON; then a good one.
# Each is claimed and dead-lettered, as a business write that fails for good
# is, rather than ending the consumer (UnicodeDecodeError, psycopg2's
# ValueError for a NUL, AttributeError for the null value).
my $c3_dl = length(file($consumer{c3}{out}));
ok( produce(
		{ %{ msg_with_id('u1', 'unfit-1') }, key_hex => 'fffe' },
		{ %{ msg_with_id('u2', 'unfit-2') }, key_hex => unpack('H*', "a\x00b") },
		{ %{ msg_with_id('u3', 'unfit-3') }, value_hex => 'ff7b7d' },
		{ %{ msg_with_id('u4', 'unfit-4') }, value_hex => unpack('H*', qq({"a": "\x00"})) },
		{ %{ msg_with_id('u5', 'unfit-5') }, value_hex => undef },
		{ %{ msg_with_id('u6', 'unfit-6') }, value_hex => unpack('H*', 'not json') },
		msg_with_id('u7', 'unfit-7')),
	'seven messages of another producer, with good ids, to partition 0');
ok(wait_for('unfit-7', sub { sql(q{SELECT count(*) FROM applied WHERE msg_id = 'unfit-7'}) == 1 }),
	'the last one is applied') or diag(file($consumer{c3}{out}));
is( sql(q{SELECT string_agg(msg_id || '|' || key || '|' || sqlstate || '|' || error, E'\n' ORDER BY msg_id)
		  FROM dead_letters WHERE msg_id LIKE 'unfit-%'}),
	join("\n",
		'unfit-1|\xff\xfe|22021|the key is not UTF-8',
		'unfit-2|a\x00b|22021|the key has a NUL character',
		'unfit-3|u3|22021|the value is not UTF-8',
		'unfit-4|u4|22021|the value has a NUL character',
		'unfit-5|u5|23502|null value in column "payload" of relation "applied" violates not-null constraint',
		'unfit-6|u6|22P02|invalid input syntax for type json'),
	'the six before it are dead letters, with their keys, SQLSTATEs and errors')
  or diag(file($consumer{c3}{out}));
is(sql(q{SELECT count(*) FROM idem.claims WHERE ns = 'kafka' AND msg_id LIKE 'unfit-%'}), 7, 'all seven claimed');
my $c3_dl_log = substr(file($consumer{c3}{out}), $c3_dl);
is(scalar(() = $c3_dl_log =~ /^c3 dead unfit-\d \(partition 0, offset \d+\)$/mg), 6, 'c3 logged six dead letters')
  or diag($c3_dl_log);
unlike($c3_dl_log, qr/Traceback|offset commit failed/, 'and committed their offsets');
ok($consumer{c3}{h}->pumpable, 'c3 runs on');

# The database is down for longer than c3's max.poll.interval.ms while c3
# has a message to apply: c3 tries to connect again and again, and
# librdkafka takes it out of its group.  Once the database is back, c3
# applies the message; its offset commit fails (c3 is no longer a member),
# and c3 joins again, reads the message again from the last committed
# offset, a duplicate, and goes on.
my $c3_from = length(file($consumer{c3}{out}));
$node->stop;
ok(produce(msg_with_id('p1', 'poll-1')), 'a message produced while the database is down');
ok( wait_for('c3 to leave its group', sub {
			substr(file($consumer{c3}{out}), $c3_from) =~ /maximum poll interval \(7000ms\) exceeded/ }),
	'c3 waits for the database longer than max.poll.interval.ms, and leaves its group')
  or diag(file($consumer{c3}{out}));
like(substr(file($consumer{c3}{out}), $c3_from), qr/PostgreSQL: connection to server .* failed: [^\n]*; reconnecting/,
	'meanwhile it fails to connect to the database');
$node->start;
ok( wait_for('poll-1 again', sub { substr(file($consumer{c3}{out}), $c3_from) =~ /duplicate poll-1 / }),
	'with the database back, c3 applies the message, joins its group again, and reads it again: a duplicate')
  or diag(file($consumer{c3}{out}));
like(substr(file($consumer{c3}{out}), $c3_from), qr/applied poll-1 .*\n(?:.*\n)*.*offset commit failed: .*\n(?:.*\n)*.*assigned .*\n(?:.*\n)*.*duplicate poll-1 /,
	'applied, its offset commit failed, assigned partitions again, then the duplicate')
  or diag(substr(file($consumer{c3}{out}), $c3_from));
ok(produce(msg_with_id('p2', 'poll-2')), 'one more message');
ok(wait_for('poll-2', sub { sql(q{SELECT count(*) FROM applied WHERE msg_id = 'poll-2'}) == 1 }),
	'c3 applies it: it consumes again') or diag(file($consumer{c3}{out}));
is(sql(q{SELECT count(*) FROM applied WHERE msg_id IN ('poll-1', 'poll-2')}), 2, 'each applied once');
$consumer{c3}{h}->signal('TERM');
$consumer{c3}{h}->finish;
is($consumer{c3}{h}->full_result(0), 0, 'consumer c3 stops on SIGTERM');

# Consumers of a LATIN1 database, whose encoding has no equivalent of some
# characters (U+20AC), on a topic of their own: a message whose
# idem-message-id has one cannot be claimed, and is skipped; one whose key
# or value has one is claimed and dead-lettered with 22P05, its key written
# as Python writes it, so that the dead letter can be stored, rather than
# ending the consumer (psycopg2's UnicodeEncodeError, not an error of the
# database); a key LATIN1 holds (U+00E9) is applied.  c4 speaks LATIN1 to
# the server (the database's encoding, by default), c5 UTF8
# (PGCLIENTENCODING), which the server converts: it would refuse their
# dead letters with 22P05 too if their keys were not written so.  Each has
# a group and a claim namespace of its own.
$node->safe_psql('postgres', q{CREATE DATABASE latin1 TEMPLATE template0 ENCODING 'LATIN1' LOCALE 'C'});
$node->safe_psql('latin1', q{
	CREATE EXTENSION idem;
	CREATE TABLE applied (n bigserial PRIMARY KEY, msg_id text NOT NULL, key text NOT NULL,
	                      payload jsonb NOT NULL, consumer text NOT NULL);
	CREATE TABLE dead_letters (msg_id text NOT NULL, key text NOT NULL, error text NOT NULL,
	                           sqlstate text NOT NULL,
	                           consumer text NOT NULL DEFAULT current_setting('application_name'));
});
sub sql_latin1 { return $node->safe_psql('latin1', $_[0]); }
ok( produce_to('latin',
		msg_with_id('l1', "l1-\xe2\x82\xac"),
		{ %{ msg_with_id('l2', 'latin-2') }, key_hex => 'e282ac' },
		{ %{ msg_with_id('l3', 'latin-3') }, value_hex => unpack('H*', qq({"a": "\xe2\x82\xac"})) },
		{ %{ msg_with_id('l4', 'latin-4') }, key_hex => 'c3a9', value_hex => unpack('H*', qq({"key": "\xc3\xa9"})) }),
	'four messages with characters outside LATIN1, or in it, to partition 0 of topic latin');
for my $c ([ 'c4', 'kafka' ], [ 'c5', 'kafka-utf8', PGCLIENTENCODING => 'UTF8' ])
{
	my ($name, $ns, %env) = @$c;
	$consumer{$name} = { out => "$tmp/$name.out" };
	$consumer{$name}{h} = IPC::Run::start(
		[ $python, "$src/examples/consumer_kafka.py", '--brokers', $bootstrap, '--topic', 'latin',
		  '--group', "latin-$name", '--name', $name, '--namespace', $ns, '--session-timeout', '6000' ],
		'>', $consumer{$name}{out}, '2>&1',
		init => sub {
			$ENV{$_} = $pgenv{$_} for keys %pgenv;
			$ENV{$_} = $env{$_} for keys %env;
			$ENV{PGUSER} = 'postgres';
			$ENV{PGAPPNAME} = $name;
			$ENV{PGDATABASE} = 'latin1';
		});
	push @started, $consumer{$name}{h};
}
ok( wait_for('latin-4', sub { sql_latin1(q{SELECT count(*) FROM applied WHERE msg_id = 'latin-4'}) == 2 }),
	'c4 and c5 apply the last one')
  or diag(file($consumer{c4}{out}) . file($consumer{c5}{out}));
is( sql_latin1(q{SELECT string_agg(consumer || '|' || msg_id || '|' || (key = U&'\00E9') || '|'
		                            || (payload->>'key' = U&'\00E9'), ',' ORDER BY consumer) FROM applied}),
	'c4|latin-4|true|true,c5|latin-4|true|true', 'with its key and value in LATIN1');
is( sql_latin1(q{SELECT string_agg(consumer || '|' || msg_id || '|' || key || '|' || sqlstate || '|' || error, E'\n'
		                            ORDER BY consumer, msg_id)
		  FROM dead_letters}),
	join("\n",
		map { ("$_|latin-2|\\u20ac|22P05|the key has a character with no equivalent in LATIN1",
			   "$_|latin-3|l3|22P05|the value has a character with no equivalent in LATIN1") } 'c4', 'c5'),
	'the one whose key, and the one whose value, LATIN1 cannot hold are dead letters, for both')
  or diag(file($consumer{c4}{out}) . file($consumer{c5}{out}));
is(sql_latin1(q{SELECT string_agg(ns || ' ' || n, ',' ORDER BY ns) FROM (SELECT ns, count(*) n FROM idem.claims GROUP BY ns) c}),
	'kafka 3,kafka-utf8 3', 'those three claimed by each');
for my $name ('c4', 'c5')
{
	my $log = file($consumer{$name}{out});
	like($log, qr/idem_claim cannot take an idem-message-id with a character with no equivalent in LATIN1\n.*an idem-message-id idem_claim cannot take \('l1-\xe2\x82\xac'\) at latin\[0\]\@0: skipped/,
		"$name skips the one whose idem-message-id LATIN1 cannot hold") or diag($log);
	unlike($log, qr/Traceback|PostgreSQL: |offset commit failed/, "and goes on, without an error of the database");
	$consumer{$name}{h}->signal('TERM');
	$consumer{$name}{h}->finish;
	is($consumer{$name}{h}->full_result(0), 0, "$name stops on SIGTERM");
}
# A --namespace or a --name (written with each business row) the LATIN1
# database cannot hold: the consumer stops with exit code 2 once it reaches
# the database, with the first message of its new group (before, that
# message ended it with a traceback).
for my $opt ('--namespace', '--name')
{
	my ($cout, $cerr) = ('', '');
	my $crc = eval {
		IPC::Run::run(
			[ $python, "$src/examples/consumer_kafka.py", '--brokers', $bootstrap, '--topic', 'latin',
			  '--group', "latin$opt", '--name', 'cn', '--session-timeout', '6000', $opt, "n\xe2\x82\xac" ],
			'>', \$cout, '2>', \$cerr,
			init => sub {
				$ENV{$_} = $pgenv{$_} for keys %pgenv;
				$ENV{PGUSER} = 'postgres';
				$ENV{PGDATABASE} = 'latin1';
			},
			IPC::Run::timeout(60));
		$? >> 8;
	};
	is($crc, 2, "a consumer of the LATIN1 database given $opt with a euro sign stops with exit code 2")
	  or diag($@ . $cout . $cerr);
	like($cerr, qr/\Q$opt\E has a character with no equivalent in LATIN1/, 'saying why');
}

# A record the broker refuses (INVALID_RECORD) is refused for good, with the
# broker's error; it was retried until the message died.
sql(q{SELECT idem_outbox_send('refused', 'x1', '{"n": 1}');});
$mock_in .= "produce-errors 87 1\n";
$mock->pump until $mock_out =~ /^pushed$/m || !$mock->pumpable;
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', "kafka.brokers=$bootstrap",
	'--lease', '10s', '--timeout', '5s', '--once', '--log-interval', '0');
is($rc, 0, 'the relay stopped (--once)') or diag($err);
is(sql(q{SELECT dead || ' ' || attempts || ' ' || last_error FROM idem.outbox_keys WHERE topic = 'refused'}),
	'true 1 permanent: kafka: Broker: Broker failed to validate record', 'a record the broker refuses is dead at once');

# A producer that had a fatal error (an idempotent producer with the gapless
# guarantee, whose produce the broker answers OUT_OF_ORDER_SEQUENCE_NUMBER)
# refuses every message from then on: the relay makes a new one before its
# next lease, and the messages are retried and delivered by the same relay.
sql(q{SELECT idem_outbox_configure('fatal', 10, '100 ms', '100 ms');
SELECT idem_outbox_send('fatal', 'f' || k, jsonb_build_object('n', k)) FROM generate_series(1, 3) k;});
$mock_out = '';
$mock_in .= "produce-errors 45 1\n";
$mock->pump until $mock_out =~ /^pushed$/m || !$mock->pumpable;
{
	my ($fout, $ferr) = ('', '');
	my $h = IPC::Run::start([ $relay, '--sink', 'kafka', '--set', "kafka.brokers=$bootstrap",
			'--set', 'kafka.property.enable.gapless.guarantee=true',
			'--lease', '10s', '--timeout', '5s', '--poll', '50ms', '--log-interval', '0' ],
		'>', \$fout, '2>', \$ferr,
		init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; });
	ok(wait_for('the delivery after a fatal error',
			sub { sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'fatal'}) == 0 }),
		'the messages are delivered by the relay whose producer had a fatal error');
	$h->signal('TERM');
	$h->finish;
	like($ferr, qr/the producer had a fatal error \(.*\): making a new one/,
		'the producer with a fatal error is made again') or diag($ferr);
	like($ferr, qr/stopped: leased \d+, delivered 3, retried [1-9]/, 'after its messages were retried')
	  or diag($ferr);
}

# A topic the cluster does not have (its metadata says UNKNOWN_TOPIC_OR_PART)
# fails only its own messages, which are retried after their backoff; the
# rest of the batch is delivered.  Once the
# topic exists, its message is delivered too.
sql(q{SELECT idem_outbox_configure('missing', 10, '1 second', '1 second')});
sql(q{SELECT idem_outbox_send('missing', 'm1', '{"n": 1}'), idem_outbox_send('missing', 'm2', '{"n": 2}')});
sql(q{SELECT idem_outbox_send('present', 'p' || k, '{"n": 1}') FROM generate_series(1, 4) k});
$mock_in .= "topic-error missing 3\n";
$mock->pump until $mock_out =~ /^set$/m || !$mock->pumpable;
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', "kafka.brokers=$bootstrap",
	'--set', 'kafka.property.topic.metadata.propagation.max.ms=200',
	'--lease', '10s', '--timeout', '5s', '--once', '--log-interval', '0');
is($rc, 0, 'the relay stopped (--once)') or diag($err);
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'present'}), '0',
	'the messages of a topic the cluster has are delivered beside one of a missing topic');
is( sql(q{SELECT count(*) FROM idem.outbox_keys WHERE topic = 'missing' AND NOT dead AND attempts = 1
	          AND last_error ~ '^kafka: .*[Uu]nknown topic'}),
	'2', 'the messages of a missing topic are retried, with the reason');
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'missing'}), '2',
	'neither message of the missing topic was acknowledged');
$mock_in .= "topic-error missing 0\n";
$mock_out = '';
$mock->pump until $mock_out =~ /^set$/m || !$mock->pumpable;
sql(q{UPDATE idem.outbox_keys SET available_at = now() WHERE topic = 'missing'});    # its backoff, over
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', "kafka.brokers=$bootstrap",
	'--lease', '10s', '--timeout', '5s', '--once', '--log-interval', '0');
is($rc, 0, 'the relay stopped (--once)') or diag($err);
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'missing'}), '0',
	'once the topic exists, its messages are delivered');

# What a message carries, read back by a consumer of the mock cluster: the
# outbox key as the Kafka key, the payload as the value, and the headers
# idem-message-id, idem-type, idem-attempt and idem-headers (the message's
# own, JSON); a message without a type or headers has neither idem-type nor
# idem-headers.  h1 is at its second attempt: its first lease was given back
# by hand.
my $h1 = sql(q{SELECT idem_outbox_send('hdrs', 'h1', '{"n": 1}', '{"trace": "t-1", "n": 2}', 'order.paid')});
is(sql(q{SELECT string_agg(id || ' ' || idem_outbox_nack(id, 'given back', '0 seconds'), ',')
           FROM idem_outbox_lease('by-hand', 100, '1 minute')}),
	"$h1 true", 'h1 leased once and given back by hand');
my $h2 = sql(q{SELECT idem_outbox_send('hdrs', 'h2', '[2]')});
($rc, $out, $err) = run_relay('--sink', 'kafka', '--set', "kafka.brokers=$bootstrap",
	'--lease', '10s', '--timeout', '5s', '--once', '--log-interval', '0');
is($rc, 0, 'the relay stopped (--once)') or diag($err);
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'hdrs'}), 0, 'both delivered');
my $read_py = <<'PY';
import json, sys, time
from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": "hdrs-reader", "enable.auto.commit": False})
topic, want = sys.argv[2], int(sys.argv[3])
parts = c.list_topics(topic, timeout=30).topics[topic].partitions
c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
got = []
deadline = time.monotonic() + 60
while len(got) < want and time.monotonic() < deadline:
    m = c.poll(0.5)
    if m is None or m.error():
        continue
    got.append({"key": m.key().decode(), "value": json.loads(m.value()),
                "headers": [[k, v.decode() if v is not None else None] for k, v in (m.headers() or [])]})
c.close()
print(json.dumps(sorted(got, key=lambda g: g["key"])))
PY
my ($rout, $rerr) = ('', '');
ok(IPC::Run::run([ $python, '-c', $read_py, $bootstrap, 'hdrs', '2' ], '>', \$rout, '2>', \$rerr,
		IPC::Run::timeout(120)), 'the messages are read back from the mock cluster') or diag($rerr);
is_deeply(eval { JSON::PP->new->decode($rout) } // $rout,
	[ { key => 'h1', value => { n => 1 },
		headers => [ [ 'idem-message-id', $h1 ], [ 'idem-type', 'order.paid' ], [ 'idem-attempt', '2' ],
					 [ 'idem-headers', '{"n": 2, "trace": "t-1"}' ] ] },
	  { key => 'h2', value => [2],
		headers => [ [ 'idem-message-id', $h2 ], [ 'idem-attempt', '1' ] ] } ],
	'the key, the value, and the headers idem-message-id, idem-type, idem-attempt and idem-headers')
  or diag($rout);

$mock->signal('TERM');
$mock->finish;
$node->stop;
done_testing();
