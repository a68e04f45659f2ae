
# Copyright (c) idem contributors
#
# idem-relay's rabbitmq sink end to end, against a real RabbitMQ
# (rabbitmq-server, started here on 127.0.0.1 with its own directories):
#
# - N messages of 20 keys go through idem's outbox, in two halves;
# - two relays deliver them; the first is killed with SIGKILL while it holds
#   leased messages (stopped with SIGSTOP first and checked to hold a lease);
# - two consumers (examples/consumer_rabbitmq.py: idem_claim and the
#   business write in one transaction, manual ack after the commit) share
#   the queue, the first killed with SIGKILL between a commit and its ack:
#   the message comes back to the second, whose claim says "already done";
# - the broker is killed with SIGKILL and started again while the second
#   half is being delivered: the relays and the consumer reconnect;
# - at the end every message was applied exactly once, and in order per key
#   (checked in the business table);
# - the consumer's database backend terminated between two deliveries, and a
#   message whose business write violates a CHECK: it goes to the dead
#   letters once, and the messages after it are applied;
# - deliveries of another publisher whose message_id idem_claim cannot take
#   (not UTF-8, a NUL character) are rejected, and the ones after them are
#   applied, one without x-idem-key with an empty key; with a LATIN1
#   database, a message_id LATIN1 cannot hold is rejected, and an
#   x-idem-key or a body it cannot hold is a dead letter; a --namespace over
#   63 bytes stops the consumer at start-up, and a --namespace or --name
#   the LATIN1 database cannot hold once it reaches the database;
# - a connection the broker closes while the relay is idle costs the next
#   message no attempt;
# - an exchange of its own and a routing key {topic}.{type}: the message
#   reaches the queue bound to that key;
# - what the END block does when the test dies partway, with the broker
#   running and no pid file: neither the broker nor its epmd is left (nor a
#   relay or consumer the test started).
#
# A broker that cannot be started fails the test: it is never skipped.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use Cwd qw(abs_path);
use IO::Socket::INET;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use IdemTest;

# ports free on this machine, so that two runs of the suite do not collide
my $amqp_port = PostgreSQL::Test::Cluster::get_free_port();
my $dist_port = PostgreSQL::Test::Cluster::get_free_port();
my $epmd_port = PostgreSQL::Test::Cluster::get_free_port();
my $nodename = 'rabbit-idem-test@localhost';
my $rabbit_server = '/usr/lib/rabbitmq/bin/rabbitmq-server';
my $rabbitmqctl = '/usr/lib/rabbitmq/bin/rabbitmqctl';
my $src = abs_path("$FindBin::RealBin/..");
my $consumer = "$src/examples/consumer_rabbitmq.py";

my $bindir = `pg_config --bindir`;
chomp $bindir;
my $relay = "$bindir/idem-relay";
ok(-x $relay, 'idem-relay is installed');
ok(-x $rabbit_server, "rabbitmq-server is installed ($rabbit_server)")
  or BAIL_OUT('RabbitMQ is not installed: install rabbitmq-server (scripts/test.sh does)');

my $tmp = PostgreSQL::Test::Utils::tempdir;

########################################################################
# The broker
########################################################################

my $rdir = "$tmp/rabbitmq";
mkdir $rdir or die;
my %rabbit_env = (
	HOME => $rdir,    # the Erlang cookie
	RABBITMQ_NODENAME => $nodename,
	RABBITMQ_NODE_IP_ADDRESS => '127.0.0.1',
	RABBITMQ_NODE_PORT => $amqp_port,
	RABBITMQ_DIST_PORT => $dist_port,
	ERL_EPMD_PORT => $epmd_port,
	ERL_EPMD_ADDRESS => '127.0.0.1',
	RABBITMQ_MNESIA_BASE => "$rdir/mnesia",
	RABBITMQ_LOG_BASE => "$rdir/log",
	RABBITMQ_PID_FILE => "$rdir/rabbit.pid",
	RABBITMQ_CONF_ENV_FILE => "$rdir/rabbitmq-env.conf",
	RABBITMQ_CONFIG_FILE => "$rdir/rabbitmq.conf",
	RABBITMQ_ADVANCED_CONFIG_FILE => "$rdir/advanced.config",
	RABBITMQ_ENABLED_PLUGINS_FILE => "$rdir/enabled_plugins");
for my $f ([ 'rabbitmq-env.conf', '' ], [ 'enabled_plugins', "[].\n" ],
	[ 'rabbitmq.conf', "listeners.tcp.default = 127.0.0.1:$amqp_port\n" ])
{
	open(my $fh, '>', "$rdir/$f->[0]") or die;
	print $fh $f->[1];
	close($fh);
}

sub rabbit_init
{
	return sub { $ENV{$_} = $rabbit_env{$_} for keys %rabbit_env; };
}

sub rabbitmqctl
{
	my @args = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ $rabbitmqctl, @args ], '>', \$out, '2>', \$err,
		init => rabbit_init(),
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return ($? >> 8, $out, $err);
}

my $broker;
my $nstarts = 0;

sub start_broker
{
	$nstarts++;
	unlink "$rdir/rabbit.pid";
	$broker = IPC::Run::start([$rabbit_server],
		'>', "$rdir/server$nstarts.out", '2>', "$rdir/server$nstarts.err",
		init => rabbit_init());
	my ($rc, $out, $err) = rabbitmqctl('wait', '--timeout', '60', "$rdir/rabbit.pid");
	if ($rc != 0)
	{
		diag("rabbitmqctl wait: $out$err");
		diag(slurp_file("$rdir/server$nstarts.out"))
		  if -f "$rdir/server$nstarts.out";
	}
	return $rc == 0;
}

# The processes started with the broker's environment: the broker (its
# script and its Erlang VM, with the VM's helpers), the epmd the VM starts
# as a daemon, which outlives it, and a rabbitmqctl still running.
sub broker_processes
{
	my $mark = "RABBITMQ_PID_FILE=$rdir/rabbit.pid";
	my @pids;
	for my $dir (glob('/proc/[0-9]*'))
	{
		my ($pid) = $dir =~ m{(\d+)$};
		next if $pid == $$;
		open(my $fh, '<', "$dir/environ") or next;
		my $env = do { local $/; <$fh> } // '';
		close($fh);
		push @pids, $pid if grep { $_ eq $mark } split /\0/, $env;
	}
	return @pids;
}

# Kills them all, until none is left: the broker's pid file does not name
# a broker still starting, nor epmd, and "epmd -kill" refuses while a node
# is registered, as a VM just killed is until epmd sees its connection
# close.  True once none is left.
sub stop_broker
{
	for (my $i = 0; $i < 100; $i++)
	{
		my @pids = broker_processes();
		return 1 unless @pids;
		kill 'KILL', @pids;
		usleep(100_000);
	}
	return 0;
}

# Whatever happens, no relay, consumer, broker or epmd of this test is left
# running: the relays and consumers first, which would otherwise try to
# reconnect for ever.
my @started;

sub started
{
	my ($h) = @_;
	push @started, $h;
	return $h;
}

END
{
	local $?;    # the test's exit status (kill_kill sets it)
	for my $h (@started)
	{
		$h->kill_kill if $h->pumpable;
	}
	stop_broker();
}

sub port_open
{
	my ($port) = @_;
	my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Proto => 'tcp', Timeout => 5);
	return 0 unless $sock;
	close($sock);
	return 1;
}

sub broker_pid
{
	my $pid = slurp_file("$rdir/rabbit.pid");
	chomp $pid;
	return $pid;
}

ok(start_broker(), "rabbitmq-server started on 127.0.0.1:$amqp_port")
  or BAIL_OUT('could not start rabbitmq-server: see the log above');

# The queue, declared by the consumer as it declares it (durable, single
# active consumer), before any message is published.
my $node = idem_node('rabbit');
my $dsn = $node->connstr('postgres');
# no path: the virtual host "/" (a path "/" would name the virtual host "")
my $amqp = "amqp://guest:guest\@127.0.0.1:$amqp_port";
my ($out, $err) = ('', '');
IPC::Run::run([ 'python3', $consumer, '--dsn', $dsn, '--amqp', $amqp, '--queue', 'orders',
		'--declare-only' ], '>', \$out, '2>', \$err);
is($?, 0, 'the queue is declared') or diag($err);

########################################################################
# The outbox, the relays, the consumers
########################################################################

$node->safe_psql('postgres', q{
	CREATE TABLE order_events (
		id bigserial PRIMARY KEY,
		message_id uuid NOT NULL,
		key text NOT NULL,
		payload jsonb NOT NULL,
		consumer text NOT NULL,
		CONSTRAINT no_poison CHECK (NOT payload ? 'poison'));
	CREATE TABLE dead_letters (
		message_id text NOT NULL,
		key text NOT NULL,
		error text NOT NULL,
		sqlstate text NOT NULL);
	-- a broker outage must not use up a message's attempts
	SELECT idem_outbox_configure('orders', 1000, '100 milliseconds', '1 second');
});

my $nkeys = 20;
my $per_key = 16;
my $n = $nkeys * $per_key;
my %sent;    # message id => 1

# Sends seqs FROM..TO of every key; POISON, KEY:SEQ, is a message with
# "poison" in its payload, which the CHECK of order_events refuses.  Their
# ids, in the order of (seq, key).
sub send_seqs
{
	my ($from, $to, $poison) = @_;
	$poison //= '';
	my @ids = split /\n/, $node->safe_psql('postgres', qq{
		SELECT idem_outbox_send('orders', 'k' || k, jsonb_build_object('key', 'k' || k, 'seq', s)
		         || CASE WHEN 'k' || k || ':' || s = '$poison' THEN '{"poison": true}' ELSE '{}' END::jsonb)
		FROM generate_series($from, $to) s, generate_series(1, $nkeys) k
		ORDER BY s, k});
	$sent{$_} = 1 for @ids;
	return @ids;
}

sub wait_for
{
	my ($what, $cond) = @_;
	for (my $i = 0; $i < 20 * $PostgreSQL::Test::Utils::timeout_default; $i++)
	{
		return 1 if $cond->();
		usleep(50_000);
	}
	diag("timed out waiting for $what");
	return 0;
}

sub sql { return $node->safe_psql('postgres', $_[0]); }

# What the outbox, the relays and the consumers were doing, for a failure.
sub diag_state
{
	diag('topic|key|dead|attempts|later|leased_by|has_head|leased_through|leased_max|last_error|messages');
	diag(sql(q{SELECT topic, key, dead, attempts, available_at > pg_catalog.clock_timestamp() AS later,
	                  leased_by, head_id IS NOT NULL AS has_head, leased_through, leased_max, last_error,
	                  (SELECT count(*) FROM idem.outbox o
	                    WHERE o.aggregatetype = k.topic AND o.aggregateid = k.key) AS messages
	             FROM idem.outbox_keys k ORDER BY key}));
	diag(sql('SELECT * FROM idem_outbox_stats()'));
	diag(sql(q{SELECT pid, application_name, state, pg_catalog.clock_timestamp() - xact_start AS in_xact,
	                  wait_event_type, wait_event, left(query, 60)
	             FROM pg_stat_activity WHERE backend_type = 'client backend' ORDER BY pid}));
	for my $what ([ 'list_queues', 'name', 'messages', 'consumers' ],
		[ 'list_connections', 'name', 'state' ])
	{
		my ($rc, $out) = rabbitmqctl($what->[0], '-q', '--no-table-headers', @$what[ 1 .. $#$what ]);
		diag("rabbitmqctl $what->[0] (exit $rc):\n$out");
	}
	# sent, neither in the outbox nor applied: acknowledged and lost
	my %seen = map { $_ => 1 } split /\n/,
	  sql('SELECT id FROM idem.outbox UNION ALL SELECT message_id::uuid FROM order_events');
	my @lost = grep { !$seen{$_} } sort keys %sent;
	diag(scalar(@lost) . " sent messages neither in the outbox nor applied: @lost[0 .. ($#lost < 9 ? $#lost : 9)]");
	for my $f (glob("$tmp/*.out"), glob("$tmp/*.err"))
	{
		my @lines = split /\n/, slurp_file($f);
		diag("--- $f (last 40 lines)\n" . join("\n", @lines > 40 ? @lines[-40 .. -1] : @lines));
	}
}

my @relay_args = ('--sink', 'rabbitmq', '--set', "rabbitmq.url=$amqp", '--batch', '10',
	'--lease', '3s', '--timeout', '1s', '--reconnect-max', '1s', '--poll', '200ms',
	'--log-interval', '0', '--verbose');
my %pgenv = (PGHOST => $node->host, PGPORT => $node->port, PGDATABASE => 'postgres');

sub start_relay
{
	my ($name) = @_;
	return started(IPC::Run::start([ $relay, '--name', $name, @relay_args ],
		'>', "$tmp/$name.out", '2>', "$tmp/$name.err",
		init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; },
		IPC::Run::timeout(120)));
}

sub start_consumer
{
	my ($name, @extra) = @_;
	return started(IPC::Run::start([ 'python3', '-u', $consumer, '--dsn', $dsn, '--amqp', $amqp,
			'--queue', 'orders', '--name', $name, '--prefetch', '5', @extra ],
		'>', "$tmp/$name.out", '2>&1', init => sub { $ENV{PGAPPNAME} = $name; }, IPC::Run::timeout(120)));
}

# The first consumer is the active one; it dies after its 10th commit.
my $ca = start_consumer('consumer-a', '--die-after-commit', '10');
ok(wait_for('consumer-a to connect', sub { slurp_file("$tmp/consumer-a.out") =~ /connected/ }),
	'consumer-a is connected');
my $cb = start_consumer('consumer-b');

send_seqs(1, $per_key / 2);

# Relay 1, caught holding leased messages, is killed.
my $r1 = start_relay('relay-1');
my $caught = 0;
for (my $i = 0; $i < 2000 && !$caught; $i++)
{
	$r1->signal('STOP');
	# a lease whose message is still there (the ack of a message leased
	# alone leaves the key's row naming it)
	$caught = sql(q{SELECT count(*) FROM idem.outbox_keys k JOIN idem.outbox o ON o.id = k.head_id
	                 WHERE k.leased_by = 'relay-1' AND k.available_at > now()}) > 0;
	if ($caught)
	{
		$r1->signal('KILL');
	}
	else
	{
		$r1->signal('CONT');
		usleep(10_000);
	}
}
ok($caught, 'relay-1 was stopped while holding leased messages');
$r1->finish;
is($r1->full_result(0) & 127, 9, 'relay-1 was killed by SIGKILL');
my $r2 = start_relay('relay-2');

# consumer-a dies between a commit and its ack.
$ca->finish;
is($ca->full_result(0) & 127, 9, 'consumer-a was killed by SIGKILL');
my ($died_on) = slurp_file("$tmp/consumer-a.out") =~ /applied (\S+) key \S+ redelivered \S+\n[^\n]*dying between commit and ack/;
ok(defined $died_on, 'consumer-a died after committing a message, before its ack');

# The second half, and a broker killed and started again while it is
# delivered: relay-2 is caught holding leased messages of the second half
# (published or not: the stop lands mostly in its calls to the database)
# and let go on once the broker is gone; what is left of the second half
# goes through the broker started again.  (Waiting for the consumers'
# progress instead, the broker could die after the relays were done.)
send_seqs($per_key / 2 + 1, $per_key);
my $caught2 = 0;
for (my $i = 0; $i < 2000 && !$caught2; $i++)
{
	$r2->signal('STOP');
	$caught2 = sql(q{SELECT count(*) FROM idem.outbox_keys k JOIN idem.outbox o ON o.id = k.head_id
	                  WHERE k.leased_by = 'relay-2' AND k.available_at > now()
	                    AND (o.payload->>'seq')::int > } . ($per_key / 2)) > 0;
	last if $caught2;
	$r2->signal('CONT');
	usleep(10_000);
}
ok($caught2, 'relay-2 was stopped while holding leased messages of the second half');
kill 'KILL', broker_pid();
$broker->finish;
$r2->signal('CONT');
my $applied_at_crash = sql('SELECT count(*) FROM order_events');
my $outbox_at_crash = sql('SELECT count(*) FROM idem.outbox');
note("broker killed with $applied_at_crash applied and $outbox_at_crash messages in the outbox");
ok(start_broker(), 'rabbitmq-server started again');

ok( wait_for('the outbox to be empty and every message applied',
		sub {
			sql(q{SELECT (SELECT count(*) FROM idem.outbox) = 0
			         AND (SELECT count(DISTINCT message_id) FROM order_events) = } . $n) eq 't';
		}),
	'the relays delivered everything and the consumers applied it')
  or diag_state();
# The queue drains: redeliveries of what was applied are acknowledged too.
ok( wait_for('the queue to be empty',
		sub {
			my ($rc, $qout) = rabbitmqctl('list_queues', '-q', '--no-table-headers', 'name',
				'messages');
			return $rc == 0 && $qout =~ /^orders\s+0$/m;
		}),
	'the queue is empty');

########################################################################
# Exactly once, in order per key
########################################################################

is(sql('SELECT count(*) FROM order_events'), $n, "$n business writes for $n messages");
my @applied = split /\n/, sql('SELECT message_id FROM order_events ORDER BY id');
is(scalar(grep { $sent{$_} } @applied), $n, 'each of them one of the messages sent');
is(sql(q{SELECT count(*) FROM idem.claims WHERE ns = 'rabbit'}), $n,
	'one claim per message in the namespace rabbit');
is( sql(qq{
		SELECT count(*) FROM (
			SELECT key FROM order_events GROUP BY key
			HAVING array_agg((payload->>'seq')::int ORDER BY id)
			       IS DISTINCT FROM ARRAY(SELECT generate_series(1, $per_key))) bad}),
	0, 'every key applied in the order it was sent');

my $bout = slurp_file("$tmp/consumer-b.out");
like($bout, qr/duplicate \Q$died_on\E /,
	'the message consumer-a committed but did not ack came back to consumer-b, as a duplicate')
  if defined $died_on;
like($bout, qr/broker: .*reconnecting/, 'consumer-b lost the broker and reconnected');
like(slurp_file("$tmp/relay-2.err"), qr/rabbitmq: (connection|channel)|rabbitmq: could not/,
	'relay-2 saw the broker go away');
like(slurp_file("$tmp/relay-2.err"), qr/rabbitmq: connected to .* again/,
	'and connected to it again');
my $retried = () = slurp_file("$tmp/relay-2.err") =~ /retry .* after/g;
note("relay-2 retried $retried messages");
note('duplicates seen by the consumers: ' . (() = $bout =~ /duplicate /g));

########################################################################
# The database lost, and a message the business write refuses
########################################################################

# consumer-b's backend is terminated while it waits for its next delivery;
# then two more seqs, k3's 17th message with "poison" in its payload, which
# the CHECK of order_events refuses (SQLSTATE class 23, the same way each
# time): it goes to the dead letters once, with its claim, rather than come
# back forever and hold the queue up, and the messages of the other keys
# and the next one of k3 are applied, on a new connection.
my $b_from = length(slurp_file("$tmp/consumer-b.out"));
is(sql(q{SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000)) FROM pg_stat_activity
          WHERE application_name = 'consumer-b'}), 1, "consumer-b's database backend is terminated");
my $poison = (send_seqs($per_key + 1, $per_key + 2, 'k3:' . ($per_key + 1)))[2];
my $all = $n + 2 * $nkeys;
ok( wait_for('the messages after the poison one', sub {
			sql('SELECT count(*) FROM order_events') == $all - 1
			  && sql('SELECT count(*) FROM idem.outbox') == 0 }),
	'consumer-b applied the next messages, but the one CHECK refuses')
  or diag_state();
like(substr(slurp_file("$tmp/consumer-b.out"), $b_from), qr/database: .*(?:terminating connection|server closed the connection)/,
	'after the error of its terminated connection');
is(sql(q{SELECT message_id || '|' || key || '|' || sqlstate || '|' || error FROM dead_letters}),
	"$poison|k3|23514|new row for relation \"order_events\" violates check constraint \"no_poison\"",
	'the message CHECK refuses is in the dead letters, once, with its key, SQLSTATE and error');
is(sql(q{SELECT count(*), count(DISTINCT message_id) FROM order_events}), ($all - 1) . '|' . ($all - 1),
	'every message applied once, but the dead letter');
is(sql(q{SELECT count(*) FROM idem.claims WHERE ns = 'rabbit'}), $all, 'and claimed once');
is( sql(qq{
		SELECT count(*) FROM (
			SELECT key FROM order_events GROUP BY key
			HAVING array_agg((payload->>'seq')::int ORDER BY id)
			       IS DISTINCT FROM ARRAY(SELECT s FROM generate_series(1, $per_key + 2) s
			                               WHERE key <> 'k3' OR s <> $per_key + 1)) bad}),
	0, 'every key applied in the order it was sent, k3 without its dead letter');
ok( wait_for('the queue to be empty',
		sub {
			my ($rc, $qout) = rabbitmqctl('list_queues', '-q', '--no-table-headers', 'name',
				'messages');
			return $rc == 0 && $qout =~ /^orders\s+0$/m;
		}),
	'the queue is empty: the dead letter was acknowledged');

# Deliveries of another publisher whose message_id idem_claim cannot take:
# one that is not UTF-8 (pika gives it as bytes) and one with a NUL
# character; then one with a good id and no x-idem-key, and one with a good
# id.  The first two cannot be deduplicated: each is rejected without
# requeue, rather than delivered again for ever (bytes made a call to
# idem_claim(bytea, ...), which does not exist, and the queue was held up)
# or ending the consumer (psycopg2's ValueError for a NUL).  The one without
# x-idem-key is applied with an empty key, as the Kafka and NATS consumers
# apply a message without a key (it was rejected).
my $good_foreign = '00000000-0000-4000-8000-000000000091';
my $nokey_foreign = '00000000-0000-4000-8000-000000000092';
my $foreign_py = <<'PY';
import pika, sys
c = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = c.channel()
ch.confirm_delivery()
for mid, key, name in ((b"\xff\xfe", "f1", "f1"), ("a\x00b", "f2", "f2"), (sys.argv[3], None, "f4"),
                       (sys.argv[2], "f3", "f3")):
    ch.basic_publish("", "orders", '{"key": "%s", "seq": 1}' % name,
                     pika.BasicProperties(message_id=mid, headers={"x-idem-key": key} if key else None,
                                          delivery_mode=2))
c.close()
PY
$b_from = length(slurp_file("$tmp/consumer-b.out"));
my ($fout, $ferr) = ('', '');
ok(IPC::Run::run([ 'python3', '-c', $foreign_py, $amqp, $good_foreign, $nokey_foreign ], '>', \$fout, '2>', \$ferr),
	'four messages of another publisher are in the queue') or diag($ferr);
ok( wait_for('the good one', sub { sql(qq{SELECT count(*) FROM order_events WHERE message_id = '$good_foreign'}) == 1 }),
	'the one with a good message_id, after the others, is applied')
  or diag_state();
is(sql(qq{SELECT '[' || key || ']' || (payload->>'key') FROM order_events WHERE message_id = '$nokey_foreign'}), '[]f4',
	'so is the one without x-idem-key, with an empty key');
my $b_log = substr(slurp_file("$tmp/consumer-b.out"), $b_from);
is(scalar(() = $b_log =~ /delivery \d+ without a message_id idem_claim takes \((?:b'\\xff\\xfe'|'a\\x00b')\): rejected/g), 2,
	'the one not UTF-8 and the one with a NUL are rejected, once each') or diag($b_log);
unlike($b_log, qr/\Q$nokey_foreign\E\W*\): rejected/, 'the one without x-idem-key is not');
is(sql(q{SELECT count(*) FROM idem.claims WHERE ns = 'rabbit'}) . '|' . sql('SELECT count(*) FROM dead_letters'),
	($all + 2) . '|1', 'nothing claimed or dead-lettered for the first two');
ok( wait_for('the queue to be empty',
		sub {
			my ($rc, $qout) = rabbitmqctl('list_queues', '-q', '--no-table-headers', 'name',
				'messages');
			return $rc == 0 && $qout =~ /^orders\s+0$/m;
		}),
	'the queue is empty: they were not requeued');

# Deliveries of another publisher with a message_id idem_claim takes, but
# an x-idem-key or a body PostgreSQL's text cannot hold: an x-idem-key that
# is not UTF-8 (pika gives it as bytes), one with a NUL character, one that
# is a table, not a string, a body that is not UTF-8, and one with a NUL;
# then a good one.  Each is claimed and dead-lettered, as a business write
# that fails for good is, rather than retried for ever (bytes and a table
# made business writes that fail with 42804 or cannot be sent, and the
# queue was held up) or ending the consumer (psycopg2's ValueError for a
# NUL, UnicodeDecodeError for the body).
my $unfit_py = <<'PY';
import pika, sys
c = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = c.channel()
ch.confirm_delivery()
for n, key, body in ((1, b"\xff\xfe", b'{"key": "u1"}'), (2, "a\x00b", b'{"key": "u2"}'),
                     (3, {"a": 1}, b'{"key": "u3"}'), (4, "u4", b'\xff{}'), (5, "u5", b'{"a": "\x00"}'),
                     (6, "u6", b'{"key": "u6"}')):
    ch.basic_publish("", "orders", body,
                     pika.BasicProperties(message_id="00000000-0000-4000-8000-0000000000a%d" % n,
                                          headers={"x-idem-key": key}, delivery_mode=2))
c.close()
PY
$b_from = length(slurp_file("$tmp/consumer-b.out"));
($fout, $ferr) = ('', '');
ok(IPC::Run::run([ 'python3', '-c', $unfit_py, $amqp ], '>', \$fout, '2>', \$ferr),
	'six messages of another publisher, with good ids, are in the queue') or diag($ferr);
ok( wait_for('the good one',
		sub { sql(q{SELECT count(*) FROM order_events WHERE message_id = '00000000-0000-4000-8000-0000000000a6'}) == 1 }),
	'the last one is applied')
  or diag_state();
is( sql(q{SELECT string_agg(right(message_id, 2) || '|' || key || '|' || sqlstate || '|' || error, E'\n'
		                    ORDER BY message_id)
		  FROM dead_letters WHERE message_id LIKE '00000000-0000-4000-8000-0000000000a_'}),
	join("\n",
		'a1|\xff\xfe|22021|x-idem-key is not UTF-8',
		'a2|a\x00b|22021|x-idem-key has a NUL character',
		"a3|{'a': 1}|42804|x-idem-key is not a string",
		'a4|u4|22021|the body is not UTF-8',
		'a5|u5|22021|the body has a NUL character'),
	'the five before it are dead letters, with their keys, SQLSTATEs and errors')
  or diag(slurp_file("$tmp/consumer-b.out"));
is(sql(q{SELECT count(*) FROM idem.claims WHERE ns = 'rabbit' AND msg_id LIKE '00000000-0000-4000-8000-0000000000a_'}),
	6, 'all six claimed');
$b_log = substr(slurp_file("$tmp/consumer-b.out"), $b_from);
is(scalar(() = $b_log =~ /: dead 00000000-0000-4000-8000-0000000000a\d key /g), 5, 'consumer-b logged five dead letters')
  or diag($b_log);
unlike($b_log, qr/Traceback|database: /, 'and went on, without an error of the database');
ok( wait_for('the queue to be empty',
		sub {
			my ($rc, $qout) = rabbitmqctl('list_queues', '-q', '--no-table-headers', 'name',
				'messages');
			return $rc == 0 && $qout =~ /^orders\s+0$/m;
		}),
	'the queue is empty: they were acknowledged');

# A consumer of a LATIN1 database, whose encoding has no equivalent of some
# characters (U+20AC): a delivery whose message_id has one cannot be
# claimed, and is rejected; one whose x-idem-key or body has one is claimed
# and dead-lettered with 22P05, its key written as Python writes it, so that
# the dead letter can be stored, rather than ending the consumer (psycopg2's
# UnicodeEncodeError, not an error of the database); a key LATIN1 holds
# (U+00E9) is applied.
$node->safe_psql('postgres', q{CREATE DATABASE latin1_consumer TEMPLATE template0 ENCODING 'LATIN1' LOCALE 'C'});
$node->safe_psql('latin1_consumer', q{
	CREATE EXTENSION idem;
	CREATE TABLE order_events (
		id bigserial PRIMARY KEY,
		message_id uuid NOT NULL,
		key text NOT NULL,
		payload jsonb NOT NULL,
		consumer text NOT NULL);
	CREATE TABLE dead_letters (
		message_id text NOT NULL,
		key text NOT NULL,
		error text NOT NULL,
		sqlstate text NOT NULL);
});
sub sql_latin1 { return $node->safe_psql('latin1_consumer', $_[0]); }
my $cl = start_consumer('consumer-l', '--dsn', $node->connstr('latin1_consumer'), '--queue', 'latin1');
ok(wait_for('consumer-l to connect', sub { slurp_file("$tmp/consumer-l.out") =~ /connected/ }),
	'a consumer of a LATIN1 database is connected');
my $latin1_py = <<'PY';
import pika, sys
c = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = c.channel()
ch.confirm_delivery()
for mid, key, body in (("l1-\u20ac", "l1", '{"key": "l1"}'),
                       ("00000000-0000-4000-8000-0000000000c2", "k\u20acy", '{"key": "l2"}'),
                       ("00000000-0000-4000-8000-0000000000c3", "l3", '{"a": "\u20ac"}'),
                       ("00000000-0000-4000-8000-0000000000c4", "\u00e9", '{"key": "\u00e9"}')):
    ch.basic_publish("", "latin1", body.encode(),
                     pika.BasicProperties(message_id=mid, headers={"x-idem-key": key}, delivery_mode=2))
c.close()
PY
my $l_from = length(slurp_file("$tmp/consumer-l.out"));
($fout, $ferr) = ('', '');
ok(IPC::Run::run([ 'python3', '-c', $latin1_py, $amqp ], '>', \$fout, '2>', \$ferr),
	'four messages with characters outside LATIN1, or in it, are in the queue') or diag($ferr);
ok( wait_for('the last one',
		sub { sql_latin1(q{SELECT count(*) FROM order_events WHERE message_id = '00000000-0000-4000-8000-0000000000c4'}) == 1 }),
	'the last one is applied')
  or diag(slurp_file("$tmp/consumer-l.out"));
is( sql_latin1(q{SELECT message_id || '|' || (key = U&'\00E9') || '|' || (payload->>'key' = U&'\00E9') FROM order_events}),
	'00000000-0000-4000-8000-0000000000c4|true|true', 'with its key and payload in LATIN1');
is( sql_latin1(q{SELECT string_agg(right(message_id, 2) || '|' || key || '|' || sqlstate || '|' || error, E'\n'
		                            ORDER BY message_id)
		  FROM dead_letters}),
	join("\n",
		'c2|k\u20acy|22P05|x-idem-key has a character with no equivalent in LATIN1',
		'c3|l3|22P05|the body has a character with no equivalent in LATIN1'),
	'the one whose x-idem-key, and the one whose body, LATIN1 cannot hold are dead letters')
  or diag(slurp_file("$tmp/consumer-l.out"));
is(sql_latin1(q{SELECT count(*) FROM idem.claims WHERE ns = 'rabbit'}), 3, 'those three claimed');
my $l_log = substr(slurp_file("$tmp/consumer-l.out"), $l_from);
like($l_log, qr/idem_claim cannot take a message_id with a character with no equivalent in LATIN1\n.*delivery \d+ without a message_id idem_claim takes \('l1-\xe2\x82\xac'\): rejected/,
	'the one whose message_id LATIN1 cannot hold is rejected') or diag($l_log);
unlike($l_log, qr/Traceback|database: /, 'and consumer-l went on, without an error of the database');
ok( wait_for('the queue to be empty',
		sub {
			my ($rc, $qout) = rabbitmqctl('list_queues', '-q', '--no-table-headers', 'name',
				'messages');
			return $rc == 0 && $qout =~ /^latin1\s+0$/m;
		}),
	'the queue is empty: each was acknowledged or rejected');
$cl->signal('TERM');
$cl->finish;
is($cl->full_result(0), 0, 'consumer-l stops on SIGTERM');

# A namespace idem_claim refuses for every message (over 63 bytes) is an
# error of the command line: the consumer stops at once.
($out, $err) = ('', '');
IPC::Run::run([ 'python3', $consumer, '--dsn', $dsn, '--amqp', $amqp, '--queue', 'orders',
		'--namespace', 'n' x 64, '--declare-only' ], '>', \$out, '2>', \$err, IPC::Run::timeout(60));
is($? >> 8, 2, 'a consumer given a namespace of 64 bytes stops with exit code 2');
like($err, qr/--namespace must be 1 to 63 bytes long/, 'saying why');
# A namespace or a name (written with each business row) the database's
# encoding cannot hold: checked once the database is reached, with the same
# exit code (before, the first message ended the consumer with a traceback).
for my $opt ('--namespace', '--name')
{
	($out, $err) = ('', '');
	my $rc = eval {
		IPC::Run::run([ 'python3', $consumer, '--dsn', $node->connstr('latin1_consumer'), '--amqp', $amqp,
				'--queue', 'latin1', '--name', 'consumer-n', $opt, "n\xe2\x82\xac" ],
			'>', \$out, '2>', \$err, IPC::Run::timeout(30));
		$? >> 8;
	};
	is($rc, 2, "a consumer of a LATIN1 database given $opt with a euro sign stops with exit code 2")
	  or diag($@ . $out . $err);
	like($err, qr/\Q$opt\E has a character with no equivalent in LATIN1/, 'saying why');
}

$cb->signal('TERM');
$cb->finish;
$r2->signal('TERM');
$r2->finish;

########################################################################
# A routing key AMQP cannot carry
########################################################################

# A key of 300 bytes in the routing key: that message is refused for good
# before anything is sent, and the connection and the rest of the batch go
# on (mandatory off: a message no queue takes is confirmed all the same).
sql(q{
SELECT idem_outbox_send('longkey', 'lk1', '{"n": 1}');
SELECT idem_outbox_send('longkey', repeat('k', 300), '{"n": 2}');
SELECT idem_outbox_send('longkey', 'lk3', '{"n": 3}');});
my $lk = IPC::Run::run([ $relay, '--name', 'relay-lk', @relay_args, '--once',
		'--set', 'rabbitmq.routing_key={key}', '--set', 'rabbitmq.mandatory=false' ],
	'>', "$tmp/relay-lk.out", '2>', "$tmp/relay-lk.err",
	init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; },
	IPC::Run::timeout(60));
ok($lk, 'the relay stopped (--once)') or diag(slurp_file("$tmp/relay-lk.err"));
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'longkey' AND length(aggregateid) < 300}), 0,
	'the messages around it are delivered');
like(sql(q{SELECT last_error FROM idem.outbox_keys WHERE topic = 'longkey' AND dead}),
	qr/^permanent: rabbitmq: the routing key is 300 bytes long/, 'the one with the long key is dead at once');
unlike(slurp_file("$tmp/relay-lk.err"), qr/rabbitmq: could not publish/, 'the connection was not given up');

# A type of at most 255 bytes in a LATIN1 database, longer in UTF-8, which
# AMQP's type property cannot hold (librabbitmq failed to encode it after the
# method frame was sent, and the connection was dropped and the batch
# retried until the message died): refused for good, the batch goes on.
$node->safe_psql('postgres', q{CREATE DATABASE latin1 TEMPLATE template0 ENCODING 'LATIN1' LOCALE 'C'});
$node->safe_psql('latin1', q{CREATE EXTENSION idem;
SELECT idem_outbox_send('latin', 't1', '{"n": 1}', NULL, repeat(chr(233), 200));
SELECT idem_outbox_send('latin', 't2', '{"n": 2}', NULL, repeat(chr(233), 100));});
my $lt = IPC::Run::run([ $relay, '--name', 'relay-latin1', @relay_args, '--once',
		'--set', 'rabbitmq.mandatory=false' ],
	'>', "$tmp/relay-latin1.out", '2>', "$tmp/relay-latin1.err",
	init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; $ENV{PGDATABASE} = 'latin1'; },
	IPC::Run::timeout(60));
ok($lt, 'the relay stopped (--once)') or diag(slurp_file("$tmp/relay-latin1.err"));
is($node->safe_psql('latin1', q{SELECT string_agg(aggregateid, ',') FROM idem.outbox}), 't1',
	'the message with a type of 200 bytes in UTF-8 is delivered');
is($node->safe_psql('latin1', q{SELECT key || ' ' || attempts || ' ' || last_error FROM idem.outbox_keys WHERE dead}),
	"t1 1 permanent: rabbitmq: the type is 400 bytes long in UTF-8; AMQP's type property holds at most 255",
	'the one of 400 bytes is dead at its first attempt, with the reason');
unlike(slurp_file("$tmp/relay-latin1.err"), qr/rabbitmq: could not publish|closed by the broker/,
	'the connection was not given up');

# A body over the broker's max_message_size (it would close the channel, and
# the batch would be retried until every message of it was dead) and headers
# too large for an AMQP frame (librabbitmq cannot encode them, and the
# connection was dropped): refused for good, before anything is sent.
sql(q{
SELECT idem_outbox_send('big', 'b1', '{"n": 1}');
SELECT idem_outbox_send('big', 'b2', jsonb_build_object('x', repeat('a', 5000)));
SELECT idem_outbox_send('big', 'b3', '{"n": 3}', jsonb_build_object('h', repeat('b', 200000)));
SELECT idem_outbox_send('big', 'b4', '{"n": 4}');});
my $big = IPC::Run::run([ $relay, '--name', 'relay-big', @relay_args, '--once',
		'--set', 'rabbitmq.max_message_size=4096', '--set', 'rabbitmq.mandatory=false' ],
	'>', "$tmp/relay-big.out", '2>', "$tmp/relay-big.err",
	init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; },
	IPC::Run::timeout(60));
ok($big, 'the relay stopped (--once)') or diag(slurp_file("$tmp/relay-big.err"));
is(sql(q{SELECT string_agg(aggregateid, ',' ORDER BY aggregateid) FROM idem.outbox WHERE aggregatetype = 'big'}),
	'b2,b3', 'the messages around them are delivered');
like(sql(q{SELECT string_agg(key || ' ' || attempts || ' ' || last_error, E'\n' ORDER BY key)
           FROM idem.outbox_keys WHERE topic = 'big' AND dead}),
	qr/^b2 1 permanent: rabbitmq: the payload is 50\d\d bytes long; rabbitmq.max_message_size is 4096\nb3 1 permanent: rabbitmq: the message's properties \(its headers\) do not fit in an AMQP frame of \d+ bytes$/,
	'each is dead at its first attempt, with the reason');
unlike(slurp_file("$tmp/relay-big.err"), qr/rabbitmq: could not publish|closed by the broker/,
	'the connection was not given up');

# mandatory (the default): a message no queue takes comes back
# (basic.return) and is retried with the reason, not acknowledged; once a
# queue takes it, it is delivered.
sql(q{SELECT idem_outbox_configure('unroutable', 10, '1 second', '1 second');
SELECT idem_outbox_send('unroutable', 'u1', '{"n": 1}');});
my $ur_run = sub {
	return IPC::Run::run([ $relay, '--name', 'relay-unroutable', @relay_args, '--once' ],
		'>', "$tmp/relay-unroutable.out", '2>', "$tmp/relay-unroutable.err",
		init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; }, IPC::Run::timeout(60));
};
ok($ur_run->(), 'the relay stopped (--once)') or diag(slurp_file("$tmp/relay-unroutable.err"));
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'unroutable'}), '1',
	'a message no queue takes is not acknowledged');
is(sql(q{SELECT attempts || ' ' || dead || ' ' || last_error FROM idem.outbox_keys WHERE topic = 'unroutable'}),
	'1 false rabbitmq: unroutable: no queue is bound to the routing key (basic.return)',
	'it is retried, with the reason');
my ($qout, $qerr) = ('', '');
ok( IPC::Run::run([ 'python3', '-c', 'import pika, sys; c = pika.BlockingConnection(pika.URLParameters(sys.argv[1])); '
			. 'c.channel().queue_declare(queue="unroutable", durable=True); c.close()', $amqp ],
		'>', \$qout, '2>', \$qerr),
	'a queue named as the topic is declared') or diag($qerr);
sql(q{UPDATE idem.outbox_keys SET available_at = now() WHERE topic = 'unroutable'});    # its backoff, over
ok($ur_run->(), 'the relay stopped (--once)') or diag(slurp_file("$tmp/relay-unroutable.err"));
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'unroutable'}), '0',
	'once a queue takes it, it is delivered');

# What a message carries (read back with basic.get): persistent
# (delivery_mode 2, so that a broker that restarts keeps it in a durable
# queue), JSON, its id, type and origin, and the x-idem-* headers.
sql(q{SELECT idem_outbox_send('props', 'p1', '{"n": 1}', '{"trace": "t-1"}', 'order.paid');});
ok( IPC::Run::run([ 'python3', '-c', 'import pika, sys; c = pika.BlockingConnection(pika.URLParameters(sys.argv[1])); '
			. 'c.channel().queue_declare(queue="props", durable=True); c.close()', $amqp ],
		'>', \$qout, '2>', \$qerr),
	'a queue "props" is declared') or diag($qerr);
my $props_id = sql(q{SELECT id FROM idem.outbox WHERE aggregatetype = 'props'});
ok($ur_run->(), 'the relay stopped (--once)');
my $props_py = <<'PY';
import json, pika, sys
c = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
method, p, body = c.channel().basic_get(queue="props", auto_ack=True)
h = p.headers or {}
def s(v):
    return v.decode() if isinstance(v, bytes) else v
print(json.dumps({"delivery_mode": p.delivery_mode, "content_type": p.content_type,
                  "message_id": p.message_id, "type": p.type, "app_id": p.app_id,
                  "topic": s(h.get("x-idem-topic")), "key": s(h.get("x-idem-key")),
                  "attempt": s(h.get("x-idem-attempt")), "headers": s(h.get("x-idem-headers")),
                  "body": json.loads(body)}, sort_keys=True))
c.close()
PY
($qout, $qerr) = ('', '');
ok(IPC::Run::run([ 'python3', '-c', $props_py, $amqp ], '>', \$qout, '2>', \$qerr), 'the message is read back')
  or diag($qerr);
my $props = eval { JSON::PP->new->decode($qout) } // {};
is_deeply($props,
	{ delivery_mode => 2, content_type => 'application/json', message_id => $props_id, type => 'order.paid',
	  app_id => 'idem-relay', topic => 'props', key => 'p1', attempt => '1',
	  headers => '{"trace": "t-1"}', body => { n => 1 } },
	'persistent, JSON, with its id, type, origin and x-idem-* headers') or diag($qout);

# A queue that refuses messages once full (x-overflow reject-publish)
# answers basic.nack: that message is retried with the reason, not
# acknowledged; the one it took is delivered.
($qout, $qerr) = ('', '');
ok( IPC::Run::run([ 'python3', '-c', 'import pika, sys; c = pika.BlockingConnection(pika.URLParameters(sys.argv[1])); '
			. 'c.channel().queue_declare(queue="fullq", durable=True, arguments={"x-max-length": 1, '
			. '"x-overflow": "reject-publish"}); c.close()', $amqp ],
		'>', \$qout, '2>', \$qerr),
	'a queue "fullq" that holds one message is declared') or diag($qerr);
sql(q{SELECT idem_outbox_configure('fullq', 10, '1 hour', '1 hour');
SELECT idem_outbox_send('fullq', 'f1', '{"n": 1}'), idem_outbox_send('fullq', 'f2', '{"n": 2}');});
ok($ur_run->(), 'the relay stopped (--once)');
is( sql(q{SELECT count(*) || '|' || string_agg(k.attempts || '|' || k.dead || '|' || k.last_error, ',')
             FROM idem.outbox o JOIN idem.outbox_keys k ON k.topic = o.aggregatetype AND k.key = o.aggregateid
            WHERE o.aggregatetype = 'fullq'}),
	'1|1|false|rabbitmq: the broker refused the message (basic.nack)',
	'one message taken, the other refused by the queue: retried, with the reason');

########################################################################
# An idle connection closed by the broker
########################################################################

# The broker closes the relay's connection while the relay is idle: the
# relay finds it closed before its next lease and connects again, so the
# next message is published once, at its first attempt.
($qout, $qerr) = ('', '');
ok( IPC::Run::run([ 'python3', '-c', 'import pika, sys; c = pika.BlockingConnection(pika.URLParameters(sys.argv[1])); '
			. 'c.channel().queue_declare(queue="idle", durable=True); c.close()', $amqp ],
		'>', \$qout, '2>', \$qerr),
	'a queue "idle" is declared') or diag($qerr);
sql(q{SELECT idem_outbox_configure('idle', 10, '1 second', '1 second')});
my $ri = start_relay('relay-idle');
my $i1 = sql(q{SELECT idem_outbox_send('idle', 'i1', '{"n": 1}')});
ok(wait_for('i1 to be delivered', sub { sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'idle'}) == 0 }),
	'the relay delivered a first message and is idle');
my ($lrc, $conns) = rabbitmqctl('list_connections', '-q', '--no-table-headers', 'name');
my @before = grep { /\S/ } split /\n/, $conns;
ok(scalar(@before) >= 1, 'the relay has a connection to the broker') or diag($conns);
my $log_before = length(slurp_file("$tmp/relay-idle.err"));
my ($crc, $cout, $cerr) = rabbitmqctl('close_all_connections', '-p', '/', 'closed while idle');
is($crc, 0, 'the broker closes it') or diag("$cout$cerr");
# the broker is done with it: the close is on its way to the relay
ok( wait_for('the connection to be gone', sub {
			my ($rc, $now) = rabbitmqctl('list_connections', '-q', '--no-table-headers', 'name');
			return $rc == 0 && !grep { my $c = $_; grep { $_ eq $c } split /\n/, $now } @before; }),
	'the broker no longer lists it');
my $i2 = sql(q{SELECT idem_outbox_send('idle', 'i2', '{"n": 2}')});
ok(wait_for('i2 to be delivered', sub { sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'idle'}) == 0 }),
	'the next message is delivered');
$ri->signal('TERM');
$ri->finish;
my $idle_log = substr(slurp_file("$tmp/relay-idle.err"), $log_before);
my $reconnected_then_delivered = join('(?:.*\n)*?',
	'rabbitmq: connection to .* closed by the broker .*\n', '.*rabbitmq: connected to .* again\n',
	".*delivered \Q$i2\E \\(topic idle, key i2, attempt 1\\)");
like($idle_log, qr/$reconnected_then_delivered/,
	'the relay found the connection closed, connected again, and then delivered the next message')
  or diag($idle_log);
unlike($idle_log, qr/ retry \S+ \(topic idle|could not publish/, 'no publish failed: nothing was retried');
my $idle_py = <<'PY';
import json, pika, sys
c = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = c.channel()
got = []
while True:
    method, p, body = ch.basic_get(queue="idle", auto_ack=True)
    if method is None:
        break
    a = (p.headers or {}).get("x-idem-attempt")
    got.append([p.message_id, a.decode() if isinstance(a, bytes) else a])
print(json.dumps(got))
c.close()
PY
($qout, $qerr) = ('', '');
ok(IPC::Run::run([ 'python3', '-c', $idle_py, $amqp ], '>', \$qout, '2>', \$qerr), 'the queue is read back')
  or diag($qerr);
is_deeply(eval { JSON::PP->new->decode($qout) } // $qout, [ [ $i1, '1' ], [ $i2, '1' ] ],
	'each message is in the queue once, at its first attempt: the closed connection cost no attempt');

########################################################################
# An exchange of its own and a routing key made from the message
########################################################################

# A topic exchange whose queue takes the routing keys "typed.order.*":
# rabbitmq.routing_key {topic}.{type} routes a message of topic "typed" and
# type "order.paid" there (its topic alone, or the default exchange, would
# route it nowhere, and it would be retried rather than delivered).
my $typed_py = <<'PY';
import pika, sys
c = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = c.channel()
ch.exchange_declare(exchange="idem.events", exchange_type="topic", durable=True)
ch.queue_declare(queue="typed", durable=True)
ch.queue_bind(queue="typed", exchange="idem.events", routing_key="typed.order.*")
c.close()
PY
($qout, $qerr) = ('', '');
ok(IPC::Run::run([ 'python3', '-c', $typed_py, $amqp ], '>', \$qout, '2>', \$qerr),
	'a topic exchange and a queue bound to it are declared') or diag($qerr);
sql(q{SELECT idem_outbox_configure('typed', 10, '1 hour', '1 hour')});
my $typed = sql(q{SELECT idem_outbox_send('typed', 't1', '{"n": 1}', NULL, 'order.paid')});
IPC::Run::run([ $relay, '--name', 'relay-typed', @relay_args, '--once',
		'--set', 'rabbitmq.exchange=idem.events', '--set', 'rabbitmq.routing_key={topic}.{type}' ],
	'>', "$tmp/relay-typed.out", '2>', "$tmp/relay-typed.err",
	init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; },
	IPC::Run::timeout(120));
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'typed'}), 0,
	'the message is delivered: confirmed by the broker, routed to a queue')
  or diag(slurp_file("$tmp/relay-typed.err"));
my $typed_get = <<'PY';
import json, pika, sys
c = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
method, p, body = c.channel().basic_get(queue="typed", auto_ack=True)
print(json.dumps(None if method is None else [method.exchange, method.routing_key, p.message_id]))
c.close()
PY
($qout, $qerr) = ('', '');
ok(IPC::Run::run([ 'python3', '-c', $typed_get, $amqp ], '>', \$qout, '2>', \$qerr), 'the queue is read')
  or diag($qerr);
is_deeply(eval { JSON::PP->new->decode($qout) } // $qout, [ 'idem.events', 'typed.order.paid', $typed ],
	'it is in the bound queue, published to the exchange with the routing key {topic}.{type}');

########################################################################
# A broker that stops reading: a memory alarm blocks publishers
########################################################################

# librabbitmq sends with no time limit: the relay gives a send up after its
# timeout, and a second SIGTERM ends it at once.  Reconnections back off
# further and further while nothing is confirmed, so that a broker that takes
# connections but no messages does not make them spend their attempts every
# 250 ms.
sql(q{SELECT idem_outbox_configure('alarm', 10, '10 milliseconds', '10 milliseconds')});
sql(q{SELECT count(idem_outbox_send('alarm', 'a' || i, jsonb_build_object('pad', repeat('x', 200000))))
        FROM generate_series(1, 100) i});
my ($arc) = rabbitmqctl('set_vm_memory_high_watermark', 'absolute', '10MB');
is($arc, 0, 'a memory alarm is raised');
# batches of 100 messages of 200 kB: more than the socket's buffers take
my $ra = started(IPC::Run::start([ $relay, '--name', 'relay-alarm', @relay_args, '--set', 'rabbitmq.mandatory=false',
		'--batch', '100', '--reconnect-max', '30s' ],
	'>', "$tmp/relay-alarm.out", '2>', "$tmp/relay-alarm.err",
	init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; },
	IPC::Run::timeout(120)));
ok(wait_for('a send given up', sub { slurp_file("$tmp/relay-alarm.err") =~ /took no message within 1000 ms/ }),
	'a publish the broker does not read is given up after the timeout');
# 250 ms, 500 ms, 1 s, ... between the attempts (without the growing
# backoff, a lease every 1.25 s: 10 attempts within 12 s, and dead)
sleep(11);
is(sql(q{SELECT count(*) FROM idem.outbox_keys WHERE topic = 'alarm' AND (dead OR attempts > 7)}), 0,
	'the messages did not spend their attempts meanwhile');
$ra->signal('TERM');
$ra->signal('TERM');
$ra->finish;
# with a timeout of 30 s, only the second signal can end the send at once
my $rc30 = started(IPC::Run::start([ $relay, '--name', 'relay-alarm30', @relay_args, '--set', 'rabbitmq.mandatory=false',
		'--batch', '100', '--timeout', '30s', '--lease', '70s' ],
	'>', "$tmp/relay-alarm30.out", '2>', "$tmp/relay-alarm30.err",
	init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; },
	IPC::Run::timeout(120)));
ok(wait_for('a batch leased', sub { sql(q{SELECT count(*) FROM idem.outbox_keys
                                            WHERE topic = 'alarm' AND leased_by = 'relay-alarm30'}) > 0 }),
	'a relay with a timeout of 30 s leases a batch');
sleep(2);
my $t0 = time;
$rc30->signal('TERM');
sleep(1);
ok($rc30->pumpable, 'the first SIGTERM lets the blocked send go on');
$rc30->signal('TERM');
$rc30->finish;
ok(time - $t0 < 6, 'a second SIGTERM ends its blocked send at once');
like(slurp_file("$tmp/relay-alarm30.err"), qr/interrupted by shutdown while publishing/, 'and says so');
# The broker dies while a publish is blocked by the alarm: the publish is
# cut for sure, not only perhaps.  Nothing of the batch is acknowledged, the
# batch is given back for its next attempt, and the relay connects again to
# the broker started again (whose alarm went with the old one) and delivers
# every message.  (Attempts enough for every failure here.)
sql(q{SELECT idem_outbox_configure('alarm', 1000, '10 milliseconds', '10 milliseconds')});
my $rcut = started(IPC::Run::start([ $relay, '--name', 'relay-cut', @relay_args, '--set', 'rabbitmq.mandatory=false',
		'--batch', '100', '--timeout', '30s', '--lease', '70s', '--reconnect-max', '1s' ],
	'>', "$tmp/relay-cut.out", '2>', "$tmp/relay-cut.err",
	init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; },
	IPC::Run::timeout(180)));
ok(wait_for('a batch leased', sub { sql(q{SELECT count(*) FROM idem.outbox_keys
                                            WHERE topic = 'alarm' AND leased_by = 'relay-cut'}) > 0 }),
	'relay-cut leases a batch under the alarm');
sleep(2);    # its publish blocked: the broker reads nothing
kill 'KILL', broker_pid();
$broker->finish;
ok(wait_for('the batch given back', sub { sql(q{SELECT count(*) FROM idem.outbox_keys
                                                  WHERE topic = 'alarm' AND leased_by = 'relay-cut'
                                                    AND available_at > now() + interval '30 seconds'}) == 0 }),
	'the publish cut by the broker\'s death fails, and the batch is given back long before its lease ends')
  or diag(slurp_file("$tmp/relay-cut.err"));
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'alarm'}), '100',
	'nothing of it was acknowledged');
ok(start_broker(), 'rabbitmq-server started again, without the alarm');
ok(wait_for('the delivery after the cut', sub { sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'alarm'}) == 0 }),
	'the relay connects again and delivers every message') or diag(slurp_file("$tmp/relay-cut.err"));
$rcut->signal('TERM');
$rcut->finish;
is($rcut->full_result(0), 0, 'relay-cut stops on SIGTERM');
($arc) = rabbitmqctl('set_vm_memory_high_watermark', '0.4');
is($arc, 0, 'the alarm is cleared');
my $rb = IPC::Run::run([ $relay, '--name', 'relay-alarm2', @relay_args, '--once', '--set', 'rabbitmq.mandatory=false' ],
	'>', "$tmp/relay-alarm2.out", '2>', "$tmp/relay-alarm2.err",
	init => sub { $ENV{$_} = $pgenv{$_} for keys %pgenv; },
	IPC::Run::timeout(120));
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'alarm'}), 0,
	'once the alarm is over, every message is delivered')
  or diag(slurp_file("$tmp/relay-alarm2.err"));

########################################################################
# Nothing left running
########################################################################

# The END block stops the broker and its epmd whatever happens: here as if
# the test died while the broker was starting, before its pid file was
# written, with the broker running.
ok(port_open($amqp_port) && port_open($epmd_port), 'the broker and its epmd listen');
unlink "$rdir/rabbit.pid";
ok(stop_broker(), 'the processes with the broker\'s environment are gone');
ok(!port_open($amqp_port), 'the broker no longer listens');
ok(!port_open($epmd_port), 'nor does its epmd');

done_testing();
