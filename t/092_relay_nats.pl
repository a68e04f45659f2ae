
# Copyright (c) idem contributors
#
# idem-relay's nats sink end to end, against a real nats-server with
# JetStream on loopback (a free port, its store in the test's directory), and
# examples/consumer_nats.py as the consumer:
#
# - a stream with a duplicate window, created over the NATS protocol
#   (test/relay/nats_js.py);
# - 240 messages on 12 keys through the outbox, half before the relays
#   start and half while nats-server is down;
# - two relays: relay A, whose role may not call idem_outbox_ack, publishes
#   a batch (JetStream stores it) and is killed with SIGKILL before it can
#   acknowledge it; relay B delivers everything, A's batch again once its
#   leases ran out, and the stream's duplicate window absorbs those
#   redeliveries (PubAck "duplicate": true, nothing stored twice);
# - nats-server restarted once during the run: relay B and the consumers
#   reconnect; while it is down, relay B leases nothing, so that the outage,
#   longer than the topic's max_attempts leases would take, kills no message;
# - two consumers sharing a durable pull consumer, which they create with
#   their own settings (checked in the server's info of it), one of which
#   dies between its commit and its ack: JetStream redelivers that message,
#   idem_claim says it is a duplicate, nothing is applied twice;
# - in the end every message is stored once in the stream and applied once,
#   in order per key;
# - then a message without Nats-Msg-Id, terminated (+TERM), not redelivered;
#   the consumer's database backend terminated while its business write
#   waits for a lock, and new connections refused for a while: it connects
#   again and applies the same message; a message whose business write
#   violates a CHECK goes to the dead letters once, and the messages after
#   it are applied; messages whose Nats-Msg-Id idem_claim cannot take (600
#   bytes, a NUL character, not UTF-8) are terminated too, and a --namespace
#   over 63 bytes stops the consumer at start-up;
# - with a LATIN1 database, a Nats-Msg-Id LATIN1 cannot hold is terminated,
#   and an Idem-Key or a payload it cannot hold is a dead letter, and a
#   --namespace or --name it cannot hold stops the consumer once it reaches
#   the database; messages on a subject that is not UTF-8 are processed as
#   any other;
# - the headers a message carries, read back from the stream;
# - servers of their own that require a user and password (with a small
#   max_payload) or a token: wrong credentials make the sink down (exit
#   code 4 with --once, no attempt spent), the right ones deliver, and a
#   message over max_payload is refused for good without being sent.
#
# Without nats-server the test fails: it does not skip.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use IdemTest;

# a port free on this machine, so that two runs of the suite do not collide
my $NATS_PORT = PostgreSQL::Test::Cluster::get_free_port();
my $nats_url = "127.0.0.1:$NATS_PORT";
my $nkeys = 12;
my $per_key = 20;
my $total = $nkeys * $per_key;

my $bindir = `pg_config --bindir`;
chomp $bindir;
my $relay = "$bindir/idem-relay";
# Debian's python3 (with python3-psycopg2), whatever else is in PATH
my $python = -x '/usr/bin/python3' ? '/usr/bin/python3' : 'python3';
my $js_tool = "$FindBin::RealBin/../test/relay/nats_js.py";
my $consumer_py = "$FindBin::RealBin/../examples/consumer_nats.py";
my ($nats_bin) = grep { -x $_ } map { "$_/nats-server" } (split(/:/, $ENV{PATH}), '/usr/sbin', '/usr/bin');
my $json = JSON::PP->new->utf8->canonical;

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $node = idem_node('relay_nats');

# Whatever this test started goes away with it, also when it dies.
my @started;
END
{
	for my $h (@started)
	{
		$h->kill_kill if $h->pumpable;
	}
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

sub file { return -e $_[0] ? slurp_file($_[0]) : ''; }

########################################################################
# nats-server with JetStream
########################################################################

my $nats;
my $nats_log = "$tmp/nats.log";

# Starts nats-server and waits until it is ready; fails loudly if it cannot.
sub start_nats
{
	my $offset = -s $nats_log // 0;
	if (!defined $nats_bin)
	{
		fail('nats-server is installed (Debian package nats-server)');
		BAIL_OUT('nats-server not found: the NATS test cannot run');
	}
	$nats = IPC::Run::start(
		[ $nats_bin, '-js', '-a', '127.0.0.1', '-p', $NATS_PORT, '-n', 'idem-test',
		  '-sd', "$tmp/jetstream", '-l', $nats_log ],
		'>', "$tmp/nats.out", '2>', "$tmp/nats.err");
	push @started, $nats;
	my $ready = wait_for('nats-server', sub {
			return 1 if substr(file($nats_log), $offset) =~ /Server is ready/;
			return 1 unless $nats->pumpable;
			return 0; });
	if (!$ready || substr(file($nats_log), $offset) !~ /Server is ready/)
	{
		fail("nats-server listens on port $NATS_PORT");
		diag(substr(file($nats_log), $offset) . file("$tmp/nats.err"));
		BAIL_OUT("nats-server did not start on port $NATS_PORT: the NATS test cannot run");
	}
	pass("nats-server with JetStream listens on port $NATS_PORT");
}

sub stop_nats
{
	$nats->signal('TERM');
	$nats->finish;
}

# nats_js.py against ADDRESS ([USER:PASSWORD@ or TOKEN@]HOST:PORT)
sub js_at
{
	my ($address, @args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ $python, $js_tool, $address, @args ], '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default))
	  or die "nats_js.py @args failed: $err";
	return $out;
}

sub js { return js_at($nats_url, @_); }

sub js_count { return $json->decode(js('stream-info', $_[0]))->{messages}; }

start_nats();
my $created = $json->decode(js('stream-create', 'IDEM', 'orders', 120));
is($created->{config}{duplicate_window}, 120_000_000_000,
	'stream IDEM on subject "orders" with a duplicate window of two minutes');

########################################################################
# The database: roles, the topic, the business table
########################################################################

# Relay A may lease and nack but not acknowledge: it publishes its batch
# and then fails, like a relay that dies between the broker's confirmation
# and its ack.
sql(q{
	CREATE ROLE relay_a LOGIN;
	CREATE ROLE relay_b LOGIN;
	GRANT EXECUTE ON FUNCTION idem_outbox_lease(text, int, interval, int, bigint),
	                          idem_outbox_nack(uuid, text, interval, text, boolean) TO relay_a, relay_b;
	GRANT EXECUTE ON FUNCTION idem_outbox_ack(uuid[]) TO relay_b;
	REVOKE EXECUTE ON FUNCTION idem_outbox_ack(uuid[]) FROM PUBLIC;
	SELECT idem_outbox_configure('orders', 1000, '50 milliseconds', '500 milliseconds');
	CREATE TABLE applied (n bigserial PRIMARY KEY, msg_id text NOT NULL, key text NOT NULL,
	                      payload jsonb NOT NULL, consumer text NOT NULL,
	                      CONSTRAINT no_poison CHECK (NOT payload ? 'poison'));
	CREATE TABLE dead_letters (msg_id text NOT NULL, key text NOT NULL, error text NOT NULL,
	                           sqlstate text NOT NULL);
});

my @keys = map { sprintf('k%02d', $_) } 1 .. $nkeys;
my %sent;    # id -> [key, seq]

# Sends rounds FROM..TO: one message per key a round, a transaction a round;
# POISON, KEY:SEQ, is a message with "poison" in its payload, which the CHECK
# of applied refuses.
sub send_rounds
{
	my ($from, $to, $poison) = @_;
	$poison //= '';
	for my $seq ($from .. $to)
	{
		my @ids = split /\n/, sql(join("\n", 'BEGIN;',
				(map {
					my $more = "$_:$seq" eq $poison ? ', "poison": true' : '';
					"SELECT idem_outbox_send('orders', '$_', '{\"key\": \"$_\", \"seq\": $seq$more}');"
				} @keys),
				'COMMIT;'));
		$sent{ $ids[$_] } = [ $keys[$_], $seq ] for 0 .. $#ids;
	}
}

send_rounds(1, $per_key / 2);

########################################################################
# Two consumers, one of which dies between commit and ack
########################################################################

my %pgenv = (PGHOST => $node->host, PGPORT => $node->port, PGDATABASE => 'postgres');

sub env_init
{
	my (%env) = (%pgenv, @_);
	return sub {
		delete $ENV{$_} for grep { /^PG/ } keys %ENV;
		$ENV{$_} = $env{$_} for keys %env;
	};
}

my %consumer;
for my $c ([ 'c1', '--die-after-commit', '5' ], [ 'c2' ])
{
	my ($name, @extra) = @$c;
	$consumer{$name} = { out => "$tmp/$name.out" };
	$consumer{$name}{h} = IPC::Run::start(
		[ $python, $consumer_py, '--nats', $nats_url, '--stream', 'IDEM', '--durable', 'workers',
		  '--name', $name, '--ack-wait', '2', @extra ],
		'>', $consumer{$name}{out}, '2>&1', init => env_init(PGUSER => 'postgres', PGAPPNAME => $name));
	push @started, $consumer{$name}{h};
}

########################################################################
# Two relays; A is killed after publishing, before acknowledging
########################################################################

my %relay;
sub start_relay
{
	my ($name, $role, @args) = @_;
	$relay{$name} = { err => "$tmp/relay-$name.err" };
	$relay{$name}{h} = IPC::Run::start(
		[ $relay, '--name', "relay-$name", '--sink', 'nats', '--nats-url', "nats://$nats_url",
		  '--lease', '3s', '--timeout', '1s', '--poll', '100ms', '--log-interval', '0', '--verbose', @args ],
		'>', "$tmp/relay-$name.out", '2>', $relay{$name}{err}, init => env_init(PGUSER => $role));
	push @started, $relay{$name}{h};
}

start_relay('a', 'relay_a', '--batch', '4');
ok( wait_for('relay A to fail its ack', sub { file($relay{a}{err}) =~ /idem_outbox_ack failed/ }),
	'relay A published a batch and could not acknowledge it');
start_relay('b', 'relay_b', '--batch', '50');
ok(wait_for('relay B to deliver', sub { file($relay{b}{err}) =~ /DEBUG:  delivered / }),
	'relay B delivers while relay A runs');
$relay{a}{h}->signal('KILL');
$relay{a}{h}->finish;
is(($relay{a}{h}->full_result(0) & 127), 9, 'relay A was killed with SIGKILL');
my %a_stored = map { $_ => 1 } (file($relay{a}{err}) =~ /nats: (\S+) stored in stream IDEM/g);
ok(scalar(keys %a_stored) > 0, 'relay A had messages stored in the stream, not acknowledged: '
	  . scalar(keys %a_stored));
is(sql("SELECT count(*) FROM idem.outbox WHERE id = ANY('{" . join(',', keys %a_stored) . "}'::uuid[])"),
	scalar(keys %a_stored), 'none of them acknowledged in the outbox');

########################################################################
# nats-server restarted during the run
########################################################################

# The first half delivered (A's batch too, once its leases ran out); then
# nats-server goes away, the second half is sent, relay B fails to reach
# it, and nats-server comes back with its store.
ok(wait_for('the first half', sub { sql('SELECT count(*) FROM idem.outbox') == 0 }),
	'relay B delivered the first half, relay A\'s batch included');
# Three attempts per message while nats-server is away: a relay that kept
# leasing during the outage would make the second half dead.
sql(q{SELECT idem_outbox_configure('orders', 3, '50 milliseconds', '500 milliseconds')});
# what relay B logs from here on: taken before nats-server stops, since the
# relay may say it is down before this script reads its log again
my $b_log_before = length(file($relay{b}{err}));
stop_nats();
send_rounds($per_key / 2 + 1, $per_key);
ok( wait_for('relay B to miss nats-server five times', sub {
			my @n = (substr(file($relay{b}{err}), $b_log_before) =~
				  /nats: could not connect to .*Connection refused/g);
			return @n >= 5; }),
	'with nats-server down, relay B cannot publish and tries to connect again and again');
like(substr(file($relay{b}{err}), $b_log_before), qr/sink nats is down: leasing nothing until it is back/,
	'relay B leases nothing meanwhile');
is(sql(q{SELECT count(*) FROM idem.outbox}), $total / 2, 'nothing of the second half acknowledged meanwhile');
# (a key row whose message was acknowledged still names it: only rows that
# name a message still there count)
is(sql(q{SELECT count(*) FROM idem.outbox_keys k JOIN idem.outbox o ON o.id = k.head_id
          WHERE k.attempts > 0 OR k.dead}), 0,
	'and no message spent an attempt: none is dead after more reconnections than max_attempts');
start_nats();
ok(wait_for('the second half', sub { sql('SELECT count(*) FROM idem.outbox') == 0 }),
	'relay B reconnected and delivered the second half');
like(substr(file($relay{b}{err}), $b_log_before), qr/nats: connected to nats:\/\/\Q$nats_url\E \(idem-test /,
	'relay B says it connected again');

########################################################################
# The consumers
########################################################################

ok(wait_for('the consumers', sub { sql('SELECT count(*) FROM applied') == $total }),
	"the consumers applied $total messages");
# They created the durable consumer, with their --ack-wait and the default
# max_ack_pending of 1 (one message at a time: the stream's order).
my $durable = $json->decode(js('consumer-info', 'IDEM', 'workers'))->{config};
is_deeply([ @$durable{qw(durable_name ack_policy ack_wait max_ack_pending deliver_policy max_deliver)} ],
	[ 'workers', 'explicit', 2_000_000_000, 1, 'all', -1 ],
	'the consumers made the durable consumer: explicit acks, ack_wait 2 s, max_ack_pending 1, every message, '
	  . 'no delivery limit')
  or diag($json->encode($durable));
$consumer{c1}{h}->finish;
is($consumer{c1}{h}->result(0), 3, 'consumer c1 died after a commit, before its ack (exit code 3)');
my ($died) = file($consumer{c1}{out}) =~ /dying after the commit of ([0-9a-f-]+)/;
ok(defined $died, 'c1 logged the message it died after');
ok( defined $died && wait_for('the redelivery', sub { file($consumer{c2}{out}) =~ /duplicate \Q$died\E/ }),
	'JetStream redelivered that message to c2, and idem_claim said it was a duplicate');

########################################################################
# Every message once, in order per key
########################################################################

my $b_log = file($relay{b}{err});
my %b_dup = map { $_ => 1 } ($b_log =~ /nats: (\S+) was a duplicate: stream IDEM has it already/g);
is(scalar(grep { $b_dup{$_} } keys %a_stored), scalar(keys %a_stored),
	'relay B published relay A\'s batch again: the stream answered "duplicate" for each message');

my $state = $json->decode(js('stream-info', 'IDEM'));
is($state->{messages}, $total, "the stream holds $total messages: the duplicate window absorbed the redeliveries");
my @stored = map { $json->decode($_) } split /\n/, js('stream-dump', 'IDEM');
my %stored_ids;
$stored_ids{ $_->{msg_id} }++ for @stored;
is(scalar(grep { $stored_ids{$_} && $stored_ids{$_} == 1 } keys %sent), $total,
	'each message stored once, with its id as Nats-Msg-Id');
my %stream_order;
push @{ $stream_order{ $_->{payload}{key} } }, $_->{payload}{seq} for @stored;
is(scalar(grep { join(',', @{ $stream_order{$_} // [] }) eq join(',', 1 .. $per_key) } @keys), $nkeys,
	'the stream has the messages of each key in the order they were sent');
my $h = $stored[0]{headers};
is_deeply([ $h->{'Idem-Topic'}, $h->{'Idem-Key'}, $h->{'Content-Type'} ],
	[ 'orders', $sent{ $stored[0]{msg_id} }[0], 'application/json' ],
	'Idem-Topic, Idem-Key and Content-Type headers');

is(sql(q{SELECT count(*), count(DISTINCT msg_id) FROM applied}), "$total|$total",
	'every message applied exactly once');
is(sql(q{SELECT count(*) FROM idem.claims WHERE ns = 'nats'}), $total, 'and claimed once in namespace nats');
my %applied_order;
for my $row (split /\n/, sql(q{SELECT key, payload->>'seq' FROM applied ORDER BY n}))
{
	my ($k, $s) = split /\|/, $row;
	push @{ $applied_order{$k} }, $s;
}
is(scalar(grep { join(',', @{ $applied_order{$_} // [] }) eq join(',', 1 .. $per_key) } @keys), $nkeys,
	'the messages of each key were applied in the order they were sent');
is(sql(q{SELECT count(*) FROM applied WHERE msg_id = '} . ($died // '') . q{'}), 1,
	'the message whose consumer died before the ack was applied once');
is(sql(q{SELECT count(*) FROM idem.outbox_keys WHERE dead}), 0, 'no message dead');

########################################################################
# A message without Nats-Msg-Id, the database lost, a poison message
########################################################################

# c2's business write is held by a lock on applied.  A message without
# Nats-Msg-Id (not from idem-relay) is published, then two rounds, k03's
# 21st message with "poison" in its payload.  c2 terminates the first (left
# unacknowledged, it would come back after every ack_wait and, with
# max_ack_pending 1, hold back the rest) and waits for the lock on the next.
my $c2_from = length(file($consumer{c2}{out}));
my $locker = IdemTest::Session->new($node, 'postgres');
$locker->query('BEGIN; LOCK TABLE applied IN EXCLUSIVE MODE;');
like(js('publish', 'orders', '{"key": "none"}'), qr/"stream": ?"IDEM"/,
	'a message without Nats-Msg-Id is stored in the stream');
send_rounds($per_key + 1, $per_key + 2, 'k03:' . ($per_key + 1));
ok( wait_for('c2 to wait for the lock', sub {
			sql(q{SELECT count(*) FROM pg_stat_activity WHERE application_name = 'c2'
			        AND wait_event_type = 'Lock'}) == 1 }),
	'c2 went past the message without Nats-Msg-Id, and its business write waits for the lock')
  or diag(file($consumer{c2}{out}));
like(substr(file($consumer{c2}{out}), $c2_from), qr/no Nats-Msg-Id on a message of orders: terminated/,
	'c2 terminated that message');

# c2's backend is terminated, with new connections to the database refused:
# c2 fails to connect until they are allowed again, and then applies that
# message and the rest.
$node->safe_psql('template1', q{ALTER DATABASE postgres ALLOW_CONNECTIONS false});
is( $node->safe_psql('template1', q{SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000))
	                                   FROM pg_stat_activity WHERE application_name = 'c2'}),
	1, "c2's database backend is terminated");
ok( wait_for('c2 to be refused', sub {
			substr(file($consumer{c2}{out}), $c2_from) =~ /not currently accepting connections[^\n]*; reconnecting/ }),
	'c2 tries to connect again, and is refused') or diag(file($consumer{c2}{out}));
$locker->query('ROLLBACK;');
$locker->close;
$node->safe_psql('template1', q{ALTER DATABASE postgres ALLOW_CONNECTIONS true});
my $all = $total + 2 * $nkeys;
ok(wait_for('c2 after its lost connection', sub { sql('SELECT count(*) FROM applied') == $all - 1 }),
	'c2 applied the messages on a new connection, but the one CHECK refuses')
  or diag(file($consumer{c2}{out}));
like(substr(file($consumer{c2}{out}), $c2_from),
	qr/PostgreSQL: (?:terminating connection|server closed the connection)[^\n]*; reconnecting/,
	'after the error of its terminated connection');

# k03's 21st message violates the CHECK of applied (SQLSTATE class 23), the
# same way each time: it goes to the dead letters once, with its claim, and
# the messages of the other keys and the next one of k03 are applied.
my ($poison) = grep { $sent{$_}[0] eq 'k03' && $sent{$_}[1] == $per_key + 1 } keys %sent;
is(sql(q{SELECT msg_id || '|' || key || '|' || sqlstate || '|' || error FROM dead_letters}),
	"$poison|k03|23514|new row for relation \"applied\" violates check constraint \"no_poison\"",
	'the message CHECK refuses is in the dead letters, once, with its key, SQLSTATE and error');
is(sql(q{SELECT count(*), count(DISTINCT msg_id) FROM applied}), ($all - 1) . '|' . ($all - 1),
	'every message applied once, but the dead letter');
is(sql(q{SELECT count(*) FROM idem.claims WHERE ns = 'nats'}), $all, 'and claimed once');
%applied_order = ();
for my $row (split /\n/, sql(q{SELECT key, payload->>'seq' FROM applied ORDER BY n}))
{
	my ($k, $s) = split /\|/, $row;
	push @{ $applied_order{$k} }, $s;
}
is( scalar(grep {
			my $k = $_;
			join(',', @{ $applied_order{$k} // [] }) eq
			  join(',', grep { $k ne 'k03' || $_ != $per_key + 1 } 1 .. $per_key + 2)
		} @keys),
	$nkeys, 'the messages of each key were applied in order, k03 without its dead letter');
my $state_c = $json->decode(js('consumer-info', 'IDEM', 'workers'));
is($state_c->{num_ack_pending} . '|' . $state_c->{num_pending}, '0|0',
	'the durable consumer has no message pending: the one without Nats-Msg-Id was not left to come back');
is(scalar(() = file($consumer{c2}{out}) =~ /no Nats-Msg-Id/g), 1, 'and c2 was given it once');

# Messages of another publisher whose Nats-Msg-Id idem_claim cannot take:
# one of 600 bytes, which idem_claim refuses (22001), one with a NUL
# character, and one that is not UTF-8; then one with a good id.  The first
# three cannot be deduplicated: each is terminated as a message without
# Nats-Msg-Id is, rather than delivered again for ever (which, with
# max_ack_pending 1, held back the messages after it), ending the consumer
# (psycopg2's ValueError), or claimed as U+FFFD, which other bytes give too.
$c2_from = length(file($consumer{c2}{out}));
like(js('publish-headers', 'orders', '{"key": "f1"}', 'Nats-Msg-Id', unpack('H*', 'x' x 600)),
	qr/"stream": ?"IDEM"/, 'a message with a Nats-Msg-Id of 600 bytes is stored in the stream');
like(js('publish-headers', 'orders', '{"key": "f2"}', 'Nats-Msg-Id', unpack('H*', "a\x00b")),
	qr/"stream": ?"IDEM"/, 'one with a NUL character in it');
like(js('publish-headers', 'orders', '{"key": "f4"}', 'Nats-Msg-Id', 'fffe'),
	qr/"stream": ?"IDEM"/, 'one that is not UTF-8');
js('publish-headers', 'orders', '{"key": "f3"}', 'Nats-Msg-Id', unpack('H*', 'foreign-3'), 'Idem-Key', unpack('H*', 'f3'));
ok(wait_for('foreign-3', sub { sql(q{SELECT count(*) FROM applied WHERE msg_id = 'foreign-3'}) == 1 }),
	'the message after them is applied') or diag(file($consumer{c2}{out}));
my $c2_log = substr(file($consumer{c2}{out}), $c2_from);
like($c2_log, qr/idem_claim refuses a Nats-Msg-Id: msg_id is too long \(SQLSTATE 22001\)/,
	'idem_claim refused the id of 600 bytes');
is(scalar(() = $c2_log =~ /a Nats-Msg-Id idem_claim cannot take \([^\n]*\) on a message of orders: terminated/g), 3,
	'c2 terminated that message, the one with a NUL and the one not UTF-8, once each');
is(sql(q{SELECT count(*) FROM idem.claims WHERE ns = 'nats'}) . '|' . sql('SELECT count(*) FROM dead_letters'),
	($all + 1) . '|1', 'nothing claimed or dead-lettered for them');
$state_c = $json->decode(js('consumer-info', 'IDEM', 'workers'));
is($state_c->{num_ack_pending} . '|' . $state_c->{num_pending}, '0|0',
	'the durable consumer has no message pending: they were not left to come back');

# A message of another publisher with a status line in its headers
# ("NATS/1.0 404", as the server's answer to a pull finding no message),
# then a good one.  It is a message of the stream all the same: applied and
# acknowledged, where it was taken for the server's status and left
# unacknowledged, to come back after every ack_wait and, with
# max_ack_pending 1, hold back the messages after it.
sub raw_headers { return unpack('H*', join('', map { "$_\r\n" } @_) . "\r\n"); }
$c2_from = length(file($consumer{c2}{out}));
like(js('publish-raw', 'orders', raw_headers('NATS/1.0 404', 'Nats-Msg-Id: status-1', 'Idem-Key: s1'),
		unpack('H*', '{"key": "s1"}')),
	qr/"stream": ?"IDEM"/, 'a message with a status line in its headers is stored in the stream');
js('publish-headers', 'orders', '{"key": "s2"}', 'Nats-Msg-Id', unpack('H*', 'status-2'), 'Idem-Key', unpack('H*', 's2'));
ok(wait_for('status-2', sub { sql(q{SELECT count(*) FROM applied WHERE msg_id = 'status-2'}) == 1 }),
	'the message after it is applied') or diag(file($consumer{c2}{out}));
is(sql(q{SELECT string_agg(msg_id || '|' || key || '|' || (payload->>'key'), ',' ORDER BY n) FROM applied
		 WHERE msg_id LIKE 'status-%'}),
	'status-1|s1|s1,status-2|s2|s2', 'so is the one with the status line, before it');

# Messages of another publisher with a Nats-Msg-Id idem_claim takes, but an
# Idem-Key or a payload PostgreSQL's text cannot hold: an Idem-Key whose
# percent-encoding is not UTF-8 (%FF), one with a NUL (%00), one whose
# bytes are not UTF-8, a payload that is not UTF-8, and one with a NUL;
# then a good one.  Each is claimed and dead-lettered, as a business write
# that fails for good is, rather than ending the consumer (psycopg2's
# ValueError for a NUL, UnicodeDecodeError for the payload) or applied with
# U+FFFD in place of its bytes, which other keys give too.
$c2_from = length(file($consumer{c2}{out}));
for ([ 'unfit-1', unpack('H*', '%FF') ], [ 'unfit-2', unpack('H*', 'a%00b') ], [ 'unfit-3', 'fffe' ])
{
	like(js('publish-headers', 'orders', '{"key": "u"}', 'Nats-Msg-Id', unpack('H*', $_->[0]), 'Idem-Key', $_->[1]),
		qr/"stream": ?"IDEM"/, "$_->[0] is stored in the stream");
}
for ([ 'unfit-4', 'ff7b7d' ], [ 'unfit-5', unpack('H*', qq({"a": "\x00"})) ])
{
	like(js('publish-raw', 'orders', raw_headers('NATS/1.0', "Nats-Msg-Id: $_->[0]", 'Idem-Key: u'), $_->[1]),
		qr/"stream": ?"IDEM"/, "$_->[0] is stored in the stream");
}
js('publish-headers', 'orders', '{"key": "u"}', 'Nats-Msg-Id', unpack('H*', 'unfit-6'), 'Idem-Key', unpack('H*', 'u'));
ok(wait_for('unfit-6', sub { sql(q{SELECT count(*) FROM applied WHERE msg_id = 'unfit-6'}) == 1 }),
	'the message after them is applied') or diag(file($consumer{c2}{out}));
is( sql(q{SELECT string_agg(msg_id || '|' || replace(key, U&'\FFFD', '<U+FFFD>') || '|' || sqlstate || '|' || error,
		                    E'\n' ORDER BY msg_id)
		  FROM dead_letters WHERE msg_id LIKE 'unfit-%'}),
	join("\n",
		'unfit-1|\xff|22021|the key is not UTF-8',
		'unfit-2|a\x00b|22021|the key has a NUL character',
		'unfit-3|<U+FFFD><U+FFFD>|22021|the key is not UTF-8',
		'unfit-4|u|22021|the payload is not UTF-8',
		'unfit-5|u|22021|the payload has a NUL character'),
	'the five before it are dead letters, with their keys, SQLSTATEs and errors')
  or diag(file($consumer{c2}{out}));
is(sql(q{SELECT count(*) FROM idem.claims WHERE ns = 'nats' AND msg_id LIKE 'unfit-%'}), 6, 'all six claimed');
$c2_log = substr(file($consumer{c2}{out}), $c2_from);
is(scalar(() = $c2_log =~ /^c2 dead unfit-\d$/mg), 5, 'c2 logged five dead letters') or diag($c2_log);
unlike($c2_log, qr/Traceback/, 'and went on');
$state_c = $json->decode(js('consumer-info', 'IDEM', 'workers'));
is($state_c->{num_ack_pending} . '|' . $state_c->{num_pending}, '0|0',
	'the durable consumer has no message pending: they were acknowledged');

# A namespace idem_claim refuses for every message (over 63 bytes) is an
# error of the command line: the consumer stops at once.
my $ns_h = IPC::Run::start(
	[ $python, $consumer_py, '--nats', $nats_url, '--stream', 'IDEM', '--durable', 'ns-check',
	  '--name', 'ns-check', '--namespace', 'n' x 64 ],
	'>', "$tmp/ns-check.out", '2>&1', init => env_init(PGUSER => 'postgres'));
push @started, $ns_h;
ok(wait_for('the consumer with a namespace of 64 bytes to stop', sub { !$ns_h->pumpable }),
	'a consumer given a namespace of 64 bytes stops') or $ns_h->kill_kill;
$ns_h->finish;
is($ns_h->full_result(0) >> 8, 2, 'with exit code 2');
like(file("$tmp/ns-check.out"), qr/--namespace must be 1 to 63 bytes long/, 'saying why');

$consumer{c2}{h}->signal('TERM');
$consumer{c2}{h}->finish;
is($consumer{c2}{h}->full_result(0), 0, 'consumer c2 stops on SIGTERM');
$relay{b}{h}->signal('TERM');
$relay{b}{h}->finish;
is($relay{b}{h}->full_result(0), 0, 'relay B stops with exit code 0');

########################################################################
# A database not in UTF-8
########################################################################

# A consumer of a LATIN1 database, whose encoding has no equivalent of some
# characters (U+20AC), on a stream of the subjects latin.>: a message whose
# Nats-Msg-Id has one cannot be claimed, and is terminated; one whose
# Idem-Key (percent-encoded) or payload has one is claimed and
# dead-lettered with 22P05, its key written as Python writes it, so that the
# dead letter can be stored, rather than ending the consumer (psycopg2's
# UnicodeEncodeError, not an error of the database); a key LATIN1 holds
# (U+00E9) is applied.  Then, on a subject that is not UTF-8 (latin.\xff,
# which the stream's wildcard takes), a message without Nats-Msg-Id,
# terminated, and one with a good one, applied, rather than ending the
# consumer (UnicodeDecodeError), which logs the subject as Python writes it.
$node->safe_psql('postgres', q{CREATE DATABASE latin1 TEMPLATE template0 ENCODING 'LATIN1' LOCALE 'C'});
$node->safe_psql('latin1', q{
	CREATE EXTENSION idem;
	CREATE TABLE applied (n bigserial PRIMARY KEY, msg_id text NOT NULL, key text NOT NULL,
	                      payload jsonb NOT NULL, consumer text NOT NULL);
	CREATE TABLE dead_letters (msg_id text NOT NULL, key text NOT NULL, error text NOT NULL,
	                           sqlstate text NOT NULL);
});
sub sql_latin1 { return $node->safe_psql('latin1', $_[0]); }
like(js('stream-create', 'LATIN', 'latin.>', 120), qr/"did_create": ?true/, 'stream LATIN on the subjects latin.>');
$consumer{cl} = { out => "$tmp/cl.out" };
$consumer{cl}{h} = IPC::Run::start(
	[ $python, $consumer_py, '--nats', $nats_url, '--stream', 'LATIN', '--durable', 'latin', '--name', 'cl',
	  '--ack-wait', '2' ],
	'>', $consumer{cl}{out}, '2>&1', init => env_init(PGUSER => 'postgres', PGAPPNAME => 'cl', PGDATABASE => 'latin1'));
push @started, $consumer{cl}{h};
for ([ 'latin.a', '{"key": "l1"}', "l1-\xe2\x82\xac", 'l1' ], [ 'latin.a', '{"key": "l2"}', 'l2', '%E2%82%AC' ],
	[ 'latin.a', qq({"a": "\xe2\x82\xac"}), 'l3', 'l3' ], [ 'latin.a', qq({"key": "\xc3\xa9"}), 'l4', '%C3%A9' ])
{
	my ($subject, $payload, $id, $key) = @$_;
	like(js('publish-headers', $subject, $payload, 'Nats-Msg-Id', unpack('H*', $id), 'Idem-Key', unpack('H*', $key)),
		qr/"stream": ?"LATIN"/, "message $key is stored in the stream");
}
# SUBJECT, a header block and a payload, in hex, as they are
my $publish_subject_py = <<'PY';
import sys
sys.path.insert(0, sys.argv[1])
from consumer_nats import Nats
host, port = sys.argv[2].rsplit(':', 1)
nc = Nats(host, port, name='publish_subject')
subject, head, payload = (bytes.fromhex(a) for a in sys.argv[3:6])
nc.next += 1
reply = '%s.%d' % (nc.inbox, nc.next)
nc._send(b'HPUB ' + subject + (' %s %d %d\r\n' % (reply, len(head), len(head) + len(payload))).encode()
         + head + payload + b'\r\n')
while True:
    op = nc._op(5.0)
    if op[0] == 'MSG' and op[1] == reply:
        break
print(op[5].decode())
PY
for my $h ([ 'Idem-Key: l5' ], [ 'Nats-Msg-Id: l6', 'Idem-Key: l6' ])
{
	my ($pout, $perr) = ('', '');
	IPC::Run::run([ $python, '-c', $publish_subject_py, "$FindBin::RealBin/../examples", $nats_url,
			unpack('H*', "latin.\xff"), raw_headers('NATS/1.0', @$h), unpack('H*', '{"key": "u"}') ],
		'>', \$pout, '2>', \$perr, IPC::Run::timeout(60));
	like($pout, qr/"stream": ?"LATIN"/, "a message on subject latin.\\xff with @$h is stored in the stream")
	  or diag($perr);
}
ok(wait_for('l6', sub { sql_latin1(q{SELECT count(*) FROM applied WHERE msg_id = 'l6'}) == 1 }),
	'the last one, on a subject that is not UTF-8, is applied') or diag(file($consumer{cl}{out}));
is( sql_latin1(q{SELECT string_agg(msg_id || '|' || (key = U&'\00E9') || '|' || (payload->>'key' = U&'\00E9'), ','
		                            ORDER BY n) FROM applied}),
	'l4|true|true,l6|false|false', 'and the one before with its key and payload in LATIN1');
is( sql_latin1(q{SELECT string_agg(msg_id || '|' || key || '|' || sqlstate || '|' || error, E'\n' ORDER BY msg_id)
		  FROM dead_letters}),
	join("\n",
		'l2|\u20ac|22P05|the key has a character with no equivalent in LATIN1',
		'l3|l3|22P05|the payload has a character with no equivalent in LATIN1'),
	'the one whose Idem-Key, and the one whose payload, LATIN1 cannot hold are dead letters')
  or diag(file($consumer{cl}{out}));
is(sql_latin1(q{SELECT count(*) FROM idem.claims WHERE ns = 'nats'}), 4, 'those three claimed, and the last one');
my $cl_log = file($consumer{cl}{out});
like($cl_log, qr/idem_claim cannot take a Nats-Msg-Id with a character with no equivalent in LATIN1\n.*a Nats-Msg-Id idem_claim cannot take \('l1-\xe2\x82\xac'\) on a message of latin\.a: terminated/,
	'the one whose Nats-Msg-Id LATIN1 cannot hold is terminated') or diag($cl_log);
like($cl_log, qr/^cl no Nats-Msg-Id on a message of latin\.\\xff: terminated$/m,
	'so is the one without Nats-Msg-Id on latin.\xff, its subject written as Python writes it') or diag($cl_log);
unlike($cl_log, qr/Traceback|PostgreSQL: /, 'and cl went on, without an error of the database');
$state_c = $json->decode(js('consumer-info', 'LATIN', 'latin'));
is($state_c->{num_ack_pending} . '|' . $state_c->{num_pending}, '0|0',
	'the durable consumer has no message pending: each was acknowledged or terminated');
$consumer{cl}{h}->signal('TERM');
$consumer{cl}{h}->finish;
is($consumer{cl}{h}->full_result(0), 0, 'consumer cl stops on SIGTERM');
# A --namespace or a --name (written with each business row) the LATIN1
# database cannot hold: the consumer stops with exit code 2 once it reaches
# the database, with the first message of its new durable consumer (before,
# that message ended it with a traceback).
for my $opt ('--namespace', '--name')
{
	my ($cout, $cerr) = ('', '');
	my $crc = eval {
		IPC::Run::run(
			[ $python, $consumer_py, '--nats', $nats_url, '--stream', 'LATIN', '--durable', "latin$opt",
			  '--name', 'cn', '--ack-wait', '2', $opt, "n\xe2\x82\xac" ],
			'>', \$cout, '2>', \$cerr, init => env_init(PGUSER => 'postgres', PGDATABASE => 'latin1'),
			IPC::Run::timeout(60));
		$? >> 8;
	};
	is($crc, 2, "a consumer of the LATIN1 database given $opt with a euro sign stops with exit code 2")
	  or diag($@ . $cout . $cerr);
	like($cerr, qr/\Q$opt\E has a character with no equivalent in LATIN1/, 'saying why');
}

########################################################################
# Configuration errors, and a subject no stream takes
########################################################################

for my $case (
	[ [ '--nats-url', 'https://127.0.0.1:4222' ], qr/nats\.url "https:\/\/127.0.0.1:4222" is not nats:\/\/.* \(nats\.url: command line\)/ ],
	[ [ '--nats-url', 'nats://relay:pw@127.0.0.1' ], qr/give the credentials in nats.user and nats.password/ ],
	[ [ '--set', 'nats.subject=orders.*' ], qr/nats.subject "orders.\*" is not a valid NATS subject/ ],
	[ [ '--set', 'nats.user=relay' ], qr/nats\.user and nats\.password go together \(nats\.user: command line\)/ ])
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ $relay, '--sink', 'nats', @{ $case->[0] } ], '>', \$out, '2>', \$err,
		init => env_init(PGUSER => 'relay_b'));
	is($? >> 8, 1, "exit code 1 for @{ $case->[0] }");
	like($err, $case->[1], "message for @{ $case->[0] }");
}

sql(q{SELECT idem_outbox_configure('elsewhere', 5, '1 hour', '1 hour');
      SELECT idem_outbox_send('elsewhere', 'e1', '{"n": 1}');});
IPC::Run::run([ $relay, '--sink', 'nats', '--nats-url', "nats://$nats_url", '--once', '--log-interval', '0',
		'--set', 'topic.elsewhere.nats.subject=no.stream.here' ], '>', \my $eout, '2>', \my $eerr,
	init => env_init(PGUSER => 'relay_b'));
is( sql(q{SELECT attempts, last_error FROM idem.outbox_keys WHERE topic = 'elsewhere'}),
	'1|nats: no stream takes subject "no.stream.here" (503 no responders)',
	'a subject no stream takes: retried, with the reason (topic.NAME.nats.subject)');

# a subject in UTF-8 is a subject (nats-server takes it), not refused for good
sql(q{SELECT idem_outbox_configure('accented', 5, '1 hour', '1 hour');
      SELECT idem_outbox_send('accented', 'a1', '{"n": 1}');});
IPC::Run::run([ $relay, '--sink', 'nats', '--nats-url', "nats://$nats_url", '--once', '--log-interval', '0',
		'--set', "topic.accented.nats.subject=no.stream.\xc3\xa9t\xc3\xa9" ], '>', \my $aout, '2>', \my $aerr,
	init => env_init(PGUSER => 'relay_b'));
# (the error kept in the database has its bytes outside ASCII as '?')
like(sql(q{SELECT attempts, dead, last_error FROM idem.outbox_keys WHERE topic = 'accented'}),
	qr/^1\|f\|nats: no stream takes subject "no\.stream\.\?\?t\?\?" \(503 no responders\)$/,
	'a subject in UTF-8 is published to') or diag $aerr;

# A stream that refuses a message (full, discarding new ones) answers with
# an error: that message is retried with the stream's reason, not
# acknowledged; the one it took is delivered.
my $full = $json->decode(js('stream-create', 'FULL', 'full', 120, 1));
is($full->{config}{max_msgs}, 1, 'stream FULL holds one message and refuses more');
sql(q{SELECT idem_outbox_configure('full', 5, '1 hour', '1 hour');
      SELECT idem_outbox_send('full', 'f1', '{"n": 1}'), idem_outbox_send('full', 'f2', '{"n": 2}');});
IPC::Run::run([ $relay, '--sink', 'nats', '--nats-url', "nats://$nats_url", '--once', '--log-interval', '0',
		'--set', 'topic.full.nats.subject=full' ], '>', \my $fout, '2>', \my $ferr,
	init => env_init(PGUSER => 'relay_b'), IPC::Run::timeout(60));
like(sql(q{SELECT count(*) || '|' || string_agg(k.attempts || '|' || k.dead || '|' || k.last_error, ',')
             FROM idem.outbox o JOIN idem.outbox_keys k ON k.topic = o.aggregatetype AND k.key = o.aggregateid
            WHERE o.aggregatetype = 'full'}),
	qr/^1\|1\|false\|nats: the stream refused the message: maximum messages exceeded/,
	'one message stored, the other refused by the stream: retried, with its reason') or diag $ferr;
is(js_count('FULL'), 1, 'the stream holds the one it took');

# A stream that refuses the message itself (larger than its max_msg_size,
# below the server's max_payload) answers 400: refused for good at the
# first attempt, as the other sinks refuse such a message, not retried
# until the key's later messages have waited for all its attempts.
my $small = $json->decode(js('stream-create', 'SMALL', 'small', 120, -1, 1024));
is($small->{config}{max_msg_size}, 1024, 'stream SMALL takes messages of at most 1024 bytes (headers and body)');
sql(q{SELECT idem_outbox_configure('small', 5, '1 hour', '1 hour');
      SELECT idem_outbox_send('small', 's1', jsonb_build_object('pad', repeat('x', 4000))),
             idem_outbox_send('small', 's2', '{"n": 2}');});
IPC::Run::run([ $relay, '--sink', 'nats', '--nats-url', "nats://$nats_url", '--once', '--log-interval', '0' ],
	'>', \my $sout, '2>', \my $serr, init => env_init(PGUSER => 'relay_b'), IPC::Run::timeout(60));
like(sql(q{SELECT count(*) || '|' || string_agg(k.attempts || '|' || k.dead || '|' || k.last_error, ',')
             FROM idem.outbox o JOIN idem.outbox_keys k ON k.topic = o.aggregatetype AND k.key = o.aggregateid
            WHERE o.aggregatetype = 'small'}),
	qr/^1\|1\|true\|permanent: nats: the stream refused the message: .*\(err_code 10054\)$/,
	'a message larger than the stream takes: dead at its first attempt, with the stream\'s reason') or diag $serr;
is(js_count('SMALL'), 1, 'the stream holds the small one');

# A topic that names one of the server's own subjects ($JS.API...) is no
# subject to publish to: whoever may send to the outbox would otherwise have
# the relay ask the server, with its credentials, to delete a stream
sql(q{SELECT idem_outbox_send('$JS.API.STREAM.DELETE.SMALL', 'd1', '{}')});
IPC::Run::run([ $relay, '--sink', 'nats', '--nats-url', "nats://$nats_url", '--once', '--log-interval', '0' ],
	'>', \my $dout, '2>', \my $derr, init => env_init(PGUSER => 'relay_b'), IPC::Run::timeout(60));
like(sql(q{SELECT k.attempts || '|' || k.dead || '|' || k.last_error FROM idem.outbox_keys k
            WHERE k.topic = '$JS.API.STREAM.DELETE.SMALL'}),
	qr/^1\|true\|permanent: nats: topic "\$JS\.API\.STREAM\.DELETE\.SMALL" is not a valid NATS subject/,
	'a topic naming a subject of the server is refused for good, not published') or diag $derr;
is(js_count('SMALL'), 1, 'and the stream it named is still there');

########################################################################
# What a message carries
########################################################################

# Read back from the stream: the id as Nats-Msg-Id, the topic and the key
# percent-encoded, the type, the attempt, the message's own headers (their
# JSON) and Content-Type; a message without a type or headers has no
# Idem-Type or Idem-Headers.  h1 is at its second attempt: its first lease
# was given back by hand.
js('stream-create', 'HDRS', 'hdrs', 120);
my $h1 = sql(q{SELECT idem_outbox_send('hdrs', 'cl} . "\xc3\xa9" . q{ 1/} . "\xc3\xa4"
	  . q{', '{"n": 1}', '{"trace": "t-1", "n": 2}', 'order.paid')});
is(sql(q{SELECT string_agg(id || ' ' || idem_outbox_nack(id, 'given back', '0 seconds'), ',')
           FROM idem_outbox_lease('by-hand', 100, '1 minute')}),
	"$h1 true", 'h1 leased once and given back by hand');
my $h2 = sql(q{SELECT idem_outbox_send('hdrs', 'h2', '[2]')});
IPC::Run::run([ $relay, '--sink', 'nats', '--nats-url', "nats://$nats_url", '--once', '--log-interval', '0' ],
	'>', \my $hout, '2>', \my $herr, init => env_init(PGUSER => 'relay_b'), IPC::Run::timeout(60));
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'hdrs'}), 0, 'both delivered') or diag $herr;
my %by_id = map { my $m = $json->decode($_); ($m->{msg_id} // '') => $m } split /\n/, js('stream-dump', 'HDRS');
is_deeply(
	[ $by_id{$h1}{headers}, $by_id{$h1}{payload} ],
	[ { 'Nats-Msg-Id' => $h1, 'Idem-Topic' => 'hdrs', 'Idem-Key' => 'cl%C3%A9%201%2F%C3%A4',
		'Idem-Type' => 'order.paid', 'Idem-Attempt' => '2', 'Idem-Headers' => '{"n": 2, "trace": "t-1"}',
		'Content-Type' => 'application/json' }, { n => 1 } ],
	'a message with a type and headers: Nats-Msg-Id, Idem-Topic, Idem-Key (percent-encoded), Idem-Type, '
	  . 'Idem-Attempt, Idem-Headers, Content-Type, and the payload as the body');
is_deeply(
	[ $by_id{$h2}{headers}, $by_id{$h2}{payload} ],
	[ { 'Nats-Msg-Id' => $h2, 'Idem-Topic' => 'hdrs', 'Idem-Key' => 'h2', 'Idem-Attempt' => '1',
		'Content-Type' => 'application/json' }, [2] ],
	'one without: no Idem-Type, no Idem-Headers');

stop_nats();

########################################################################
# Authentication, and the server's max_payload
########################################################################

# nats-server started from a configuration file, or with options of its own,
# on a port of its own; fails loudly if it cannot start.
sub start_nats_with
{
	my ($name, @args) = @_;
	my $log = "$tmp/nats-$name.log";
	my $h = IPC::Run::start([ $nats_bin, '-l', $log, @args ],
		'>', "$tmp/nats-$name.out", '2>', "$tmp/nats-$name.err");
	push @started, $h;
	ok(wait_for("nats-server $name", sub { file($log) =~ /Server is ready/ || !$h->pumpable })
		  && file($log) =~ /Server is ready/, "nats-server $name is ready")
	  or BAIL_OUT("nats-server $name did not start: " . file($log) . file("$tmp/nats-$name.err"));
	return $h;
}

# A relay run with --once against ADDRESS: its exit code and its log.
sub relay_once
{
	my ($address, @args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ $relay, '--sink', 'nats', '--nats-url', "nats://$address", '--once', '--log-interval', '0',
			'--lease', '10s', '--timeout', '2s', '--verbose', @args ],
		'>', \$out, '2>', \$err, init => env_init(PGUSER => 'relay_b'), IPC::Run::timeout(60));
	return ($? >> 8, $err);
}

# What the outbox holds of TOPIC: key, attempts, dead and error of its keys
# that still have a message.
sub keys_of
{
	my ($topic) = @_;
	return sql(qq{SELECT string_agg(concat_ws(' ', k.key, k.attempts, k.dead::text, k.last_error), E'\\n' ORDER BY k.key)
	                FROM idem.outbox_keys k
	               WHERE k.topic = '$topic'
	                 AND EXISTS (SELECT FROM idem.outbox o WHERE o.aggregatetype = k.topic AND o.aggregateid = k.key)});
}

# A user and password (nats.user, nats.password), and a max_payload of 8 kB.
my $up_port = PostgreSQL::Test::Cluster::get_free_port();
my $up_addr = "127.0.0.1:$up_port";
open(my $conf, '>', "$tmp/nats-userpass.conf") or die;
print $conf qq{listen: "$up_addr"\nserver_name: "idem-userpass"\nmax_payload: 8192\n}
  . qq{jetstream { store_dir: "$tmp/jetstream-userpass" }\n}
  . qq{authorization { user: "relay", password: "s3cret" }\n};
close($conf);
my $up_nats = start_nats_with('userpass', '-c', "$tmp/nats-userpass.conf");
js_at("relay:s3cret\@$up_addr", 'stream-create', 'AUTHED', 'authed', 120);
sql(q{SELECT idem_outbox_configure('authed', 5, '1 hour', '1 hour');
      SELECT idem_outbox_send('authed', 'u1', '{"n": 1}');});
my $u1 = sql(q{SELECT id FROM idem.outbox WHERE aggregatetype = 'authed'});

my ($rc, $err) = relay_once($up_addr, '--set', 'nats.user=relay', '--set', 'nats.password=wrong');
is($rc, 4, 'a wrong password: the sink is down, and with --once the relay exits with 4') or diag $err;
like($err, qr/nats: the server at nats:\/\/\Q$up_addr\E refused the connection: -ERR 'Authorization Violation'/,
	'with the server\'s refusal in the log');
like($err, qr/sink nats is down: exiting \(--once\)/, 'and that the sink is down');
is(sql(q{SELECT count(*) FROM idem.outbox o
          WHERE o.aggregatetype = 'authed'
            AND NOT EXISTS (SELECT FROM idem.outbox_keys k
                             WHERE k.topic = 'authed' AND k.key = o.aggregateid AND (k.attempts > 0 OR k.dead))}),
	1, 'the message is still there, and spent no attempt');
($rc, $err) = relay_once($up_addr);
is($rc, 4, 'no credentials: refused the same way');
like($err, qr/refused the connection: -ERR 'Authorization Violation'/, 'with the server\'s refusal');

($rc, $err) = relay_once($up_addr, '--set', 'nats.user=relay', '--set', 'nats.password=s3cret');
is($rc, 0, 'the right password: the relay delivers and stops (--once)') or diag $err;
like($err, qr/nats: connected to nats:\/\/\Q$up_addr\E \(idem-userpass /, 'it logged in');
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'authed'}), 0, 'the message is acknowledged');
is_deeply([ map { $json->decode($_)->{msg_id} } split /\n/, js_at("relay:s3cret\@$up_addr", 'stream-dump', 'AUTHED') ],
	[$u1], 'and stored in the stream');

# max_payload counts the headers and the payload, as the server does: m2's
# payload is over it, m3's headers take it over; both are refused for good,
# at their first attempt, without being sent (the server would close the
# connection), and the others of the batch are delivered, m4 just under the
# limit.
my %big = map { my ($k, $id) = split /\|/; ($k => $id) } split /\n/, sql(q{
	SELECT 'm1|' || idem_outbox_send('authed', 'm1', '{"n": 1}');
	SELECT 'm2|' || idem_outbox_send('authed', 'm2', jsonb_build_object('x', repeat('a', 9000)));
	SELECT 'm3|' || idem_outbox_send('authed', 'm3', jsonb_build_object('x', repeat('a', 7000)),
	                                 jsonb_build_object('h', repeat('b', 1500)));
	SELECT 'm4|' || idem_outbox_send('authed', 'm4', jsonb_build_object('x', repeat('a', 7500)));});
($rc, $err) = relay_once($up_addr, '--set', 'nats.user=relay', '--set', 'nats.password=s3cret');
is($rc, 0, 'the relay stopped (--once)') or diag $err;
like(keys_of('authed'),
	qr/^m2 1 true permanent: nats: the message has 9\d{3} bytes, more than the server's max_payload \(8192\)
m3 1 true permanent: nats: the message has 8\d{3} bytes, more than the server's max_payload \(8192\)$/,
	'the messages over max_payload are dead at their first attempt, with the reason') or diag $err;
unlike($err, qr/closed by the server|Maximum Payload/, 'nothing too large was sent: the connection was kept');
is_deeply([ sort map { $json->decode($_)->{msg_id} } split /\n/, js_at("relay:s3cret\@$up_addr", 'stream-dump', 'AUTHED') ],
	[ sort $u1, $big{m1}, $big{m4} ], 'the others of the batch are in the stream');
$up_nats->signal('TERM');
$up_nats->finish;

# A token (nats.token).
my $tok_port = PostgreSQL::Test::Cluster::get_free_port();
my $tok_addr = "127.0.0.1:$tok_port";
my $tok_nats = start_nats_with('token', '-js', '-a', '127.0.0.1', '-p', $tok_port, '-n', 'idem-token',
	'-sd', "$tmp/jetstream-token", '--auth', 't0ken-8f0c2e');
js_at("t0ken-8f0c2e\@$tok_addr", 'stream-create', 'TOKENED', 'tokened', 120);
sql(q{SELECT idem_outbox_configure('tokened', 5, '1 hour', '1 hour')});
my $t1 = sql(q{SELECT idem_outbox_send('tokened', 't1', '{"n": 1}')});
($rc, $err) = relay_once($tok_addr, '--set', 'nats.token=wrong');
is($rc, 4, 'a wrong token: exit code 4 (--once)') or diag $err;
like($err, qr/refused the connection: -ERR 'Authorization Violation'/, 'with the server\'s refusal');
is(keys_of('tokened'), 't1 0 false', 'the message spent no attempt');
($rc, $err) = relay_once($tok_addr, '--set', 'nats.token=t0ken-8f0c2e');
is($rc, 0, 'the right token: the relay delivers and stops (--once)') or diag $err;
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'tokened'}), 0, 'the message is acknowledged');
is_deeply([ map { $json->decode($_)->{msg_id} } split /\n/, js_at("t0ken-8f0c2e\@$tok_addr", 'stream-dump', 'TOKENED') ],
	[$t1], 'and stored in the stream');
$tok_nats->signal('TERM');
$tok_nats->finish;

$node->stop;
done_testing();
