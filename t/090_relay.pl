
# Copyright (c) idem contributors
#
# idem-relay against a real server, run as a role that has only the grants
# the README gives a relay, connected through the libpq environment (PGHOST,
# PGPORT, PGDATABASE, PGUSER) without a connection string:
#
# - options, configuration and exit codes 0, 1, 2 and 3; durations of at
#   most a day; a value in double quotes keeps its spaces; sinks' settings
#   that cannot work refused (a control character in a header, port 0, a
#   rabbitmq URL without a host or with an empty virtual host, a Kafka
#   message.timeout.ms of 0 or above the timeout, ...), at start and at a
#   reload;
# - the stdout sink: every message once, in order per key, with its fields;
#   a reader that went away ends the relay with exit code 4, not SIGPIPE; a
#   regular file is synced before the ack, and a sync that fails ends the
#   relay with exit code 4 (test/relay/fdatasync_shim.c, built here);
# - waking up: an idle relay is woken by the notification of a send (its
#   poll interval is an hour), and a prepared transaction's message, which
#   cannot notify, is found by polling;
# - the linger: a relay that waits after a short lease acknowledges
#   messages sent one at a time in a few batches, not one each;
# - the webhook sink against a local receiver (test/relay/receiver.py):
#   2xx delivered, 500 with Retry-After and 429 retried, 503 with
#   Retry-After (seconds, HTTP date) waiting as long, 400 refused for good,
#   the Idempotency-Key and X-Idem-* headers, per-topic routes from a
#   configuration file; a Retry-After on an interim 103 not applied to the
#   final answer, a 2xx whose body stalls or is cut short delivered, headers
#   of more than 1 MiB refused for good, an empty configured header sent,
#   the relay's own headers refused in the configuration;
# - the counts: an ack or a nack that failed counts nothing;
# - no message is started with less than the timeout left of its lease;
#   a nack names its relay: late, it does not end another relay's lease;
# - a relay killed with SIGKILL in the middle of a batch: a second relay
#   delivers everything, the killed relay's unacknowledged deliveries again
#   with the same Idempotency-Key, and nothing out of order per key;
# - runs of two topics routed to two URLs: each outcome back to its message;
# - SIGTERM in the middle of a batch finishes and acknowledges it, a second
#   signal releases what is not published yet (with runs, from each run's
#   first message not delivered) and acknowledges what was; exit code 0;
# - SIGHUP reads the configuration file again (the name excepted), the
#   command line still winning over it; a file with an error leaves the
#   configuration in force;
# - with --exit-on-error, a connection lost in the middle of a statement is
#   made again, not an exit;
# - a sink whose broker cannot be reached: the relay leases nothing until it
#   is back, so that no message spends an attempt (or dies) meanwhile.

use strict;
use warnings;
use utf8;

use FindBin;
use lib $FindBin::RealBin;

use Encode qw(encode_utf8);
use IO::Socket::INET;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use IdemTest;

my $bindir = `pg_config --bindir`;
chomp $bindir;
my $relay = "$bindir/idem-relay";
ok(-x $relay, "idem-relay is installed beside the server's programs");

# track_functions: the linger's test counts the relay's acks
my $node = idem_node('relay', 'max_prepared_transactions = 5', "track_functions = 'all'");
my $tmp = PostgreSQL::Test::Utils::tempdir;
# $json reads and writes bytes (UTF-8), $jtext characters (for SQL)
my $json = JSON::PP->new->utf8->canonical;
my $jtext = JSON::PP->new->canonical;

# The relay's role: the three grants of the README, nothing else.
$node->safe_psql('postgres', q{
	CREATE ROLE relay LOGIN;
	GRANT EXECUTE ON FUNCTION idem_outbox_lease(text, int, interval, int, bigint), idem_outbox_ack(uuid[]),
	                          idem_outbox_nack(uuid, text, interval, text, boolean) TO relay;
	CREATE DATABASE noidem;
});

# The libpq environment of every relay run, and nothing else from PG*.
my %pgenv = (
	PGHOST => $node->host,
	PGPORT => $node->port,
	PGDATABASE => 'postgres',
	PGUSER => 'relay');

sub relay_env
{
	my (%extra) = @_;
	my %env = (%pgenv, %extra);
	return sub {
		delete $ENV{$_} for grep { /^PG/ } keys %ENV;
		$ENV{$_} = $env{$_} for grep { defined $env{$_} } keys %env;
	};
}

# Runs the relay to its end: exit code, stdout, stderr.
sub run_relay
{
	my ($env, @args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ $relay, @args ], '>', \$out, '2>', \$err,
		init => relay_env(%$env),
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return ($? >> 8, $out, $err);
}

# Starts the relay in the background, its output going to files.
my $nrelays = 0;
sub start_relay
{
	my ($env, @args) = @_;
	my $n = ++$nrelays;
	my %r = (out => "$tmp/relay$n.out", err => "$tmp/relay$n.err");
	$r{h} = IPC::Run::start([ $relay, '--name', "relay-$n", @args ],
		'>', $r{out}, '2>', $r{err}, init => relay_env(%$env));
	return \%r;
}

# Stops a background relay with the signals given; its exit code.
sub stop_relay
{
	my ($r, @signals) = @_;
	$r->{h}->signal($_) for @signals;
	$r->{h}->finish;
	# the exit code, or the signal that ended the relay (result() would be 0)
	my $status = $r->{h}->full_result(0);
	return ($status & 127) ? 'signal ' . ($status & 127) : $status >> 8;
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

sub sql
{
	my ($query) = @_;
	return $node->safe_psql('postgres', encode_utf8($query));
}

sub q_lit
{
	my ($s) = @_;
	$s =~ s/'/''/g;
	return "'$s'";
}

# Sends a message; its id.
sub send_msg
{
	my ($topic, $key, $payload, $headers, $type) = @_;
	return sql(sprintf('SELECT idem_outbox_send(%s, %s, %s::jsonb, %s, %s)',
			q_lit($topic), q_lit($key), q_lit($jtext->encode($payload)),
			defined $headers ? q_lit($jtext->encode($headers)) . '::jsonb' : 'NULL',
			defined $type ? q_lit($type) : 'NULL'));
}

sub final_counts
{
	my ($err) = @_;
	return $err =~ /stopped: (leased \d+, delivered \d+, retried \d+, dead \d+, errors \d+) in all/
	  ? $1 : "(no final line in: $err)";
}

########################################################################
# Options, configuration and exit codes
########################################################################

my ($rc, $out, $err) = run_relay({}, '--help');
is($rc, 0, '--help exits with 0');
like($out, qr/Usage:.*--dbname.*--config.*Exit codes:/s, '--help describes options and exit codes');

($rc, $out, $err) = run_relay({}, '--version');
like($out, qr/^idem-relay \d+\.\d+\.\d+$/m, '--version');

my @usage_errors = (
	[ [ '--batch', '0' ], qr/batch must be an integer from 1 to 10000/ ],
	[ [ '--lease', '10s', '--timeout', '6s' ], qr/timeout \(6000 ms, command line\) must be at most half the lease \(10000 ms, command line\)/ ],
	[ [ '--poll', 'soon' ], qr/poll must be a duration/ ],
	# decimal seconds only: strtod alone read 16 s and 1000 s
	[ [ '--once', '--poll', '0x10' ], qr/poll must be a duration/ ],
	[ [ '--once', '--poll', '1e3' ], qr/poll must be a duration/ ],
	[ [ '--linger', 'soon' ], qr/linger must be a duration of zero or more/ ],
	[ [ '--set', 'linger=-1ms' ], qr/linger must be a duration of zero or more/ ],
	[ [ '--poll', '2ms', '--linger', '5ms' ],
	  qr/linger \(5 ms, command line\) must be at most the poll interval \(2 ms, command line\)/ ],
	# under a millisecond: rounded to 0, it turned the counts off
	[ [ '--log-interval', '0.1ms' ], qr/log_interval must be 0 or at least 1ms .*not "0\.1ms" \(command line\)/ ],
	[ [ '--lease', '0.0004' ], qr/lease must be at least 1ms .*not "0\.0004" \(command line\)/ ],
	# a lease, like a nack's wait, is at most a day
	[ [ '--once', '--exit-on-error', '--lease', '25h' ], qr/lease must be a duration above zero and at most a day, such as 5s or 500ms, not "25h" \(command line\)/ ],
	[ [ '--sink', 'carrier-pigeon' ], qr/unknown sink "carrier-pigeon"/ ],
	[ [ '--sink', 'webhook' ], qr/the webhook sink needs a URL/ ],
	# a URL libcurl cannot use, found at start rather than by every message
	[ [ '--sink', 'webhook', '--webhook-url', 'http://127.0.0.1:99999/' ], qr/webhook\.url ".*" is not valid/ ],
	[ [ '--sink', 'webhook', '--webhook-url', 'http://a b/' ],
	  qr/webhook\.url ".*" is not valid: .* \(webhook\.url: command line\)/ ],
	# the database would refuse the name in every lease
	[ [ '--name', "relay\xff" ], qr/name must be valid UTF-8/ ],
	[ [ '--name', "relay\xc0\xaf" ], qr/name must be valid UTF-8/ ],
	[ [ '--set', 'webhook.uri=http://x' ], qr/unknown setting "webhook.uri"/ ],
	# a header the relay sets itself would be sent twice
	[ [ '--once', '--sink', 'webhook', '--webhook-url', 'http://127.0.0.1/', '--set', 'webhook.header.idempotency-KEY=1' ],
	  qr/webhook\.header\.idempotency-KEY: the relay sets this header itself/ ],
	[ [ '--once', '--sink', 'webhook', '--webhook-url', 'http://127.0.0.1/', '--set', 'webhook.header.X-Idem-Attempt=1' ],
	  qr/webhook\.header\.X-Idem-Attempt: the relay sets this header itself/ ],
	[ [ '--once', '--sink', 'webhook', '--webhook-url', 'http://127.0.0.1/', '--set', 'webhook.header.Content-Length=1' ],
	  qr/webhook\.header\.Content-Length: the relay sets this header itself/ ],
	[ [ '--set', 'topic.a.b.sink=stdout' ], qr/unknown setting "topic.a.b.sink"/ ],
	[ [ '--config', "$tmp/missing.conf" ], qr/could not open configuration file/ ],
	[ [ '--no-such-flag' ], qr/unrecognized option/ ],
	[ [ 'extra' ], qr/unexpected argument "extra"/ ]);
for my $case (@usage_errors)
{
	($rc, $out, $err) = run_relay({}, @{ $case->[0] });
	is($rc, 1, "exit code 1 for @{ $case->[0] }");
	like($err, $case->[1], "message for @{ $case->[0] }");
}

# Settings that cannot work, or that would break every request: refused at
# start rather than found by every message, until each is dead.
{
	my @hook = ('--sink', 'webhook', '--webhook-url', 'http://127.0.0.1/');
	my @mock = ('--sink', 'kafka', '--set', 'kafka.property.test.mock.num.brokers=1');
	for my $case (
		# a line break would end the header and start one of the value's
		[ 'a header value with a line break', [ @hook, '--set', "webhook.header.X-A=a\nX-B: b" ],
		  qr/webhook\.header\.X-A: the value holds a control character \(byte 0x0a\); a header's value may hold tabs, but no other control character \(webhook\.header\.X-A: command line\)/ ],
		[ 'a header value with a control character', [ @hook, '--set', "webhook.header.X-A=a\x01b" ],
		  qr/webhook\.header\.X-A: the value holds a control character \(byte 0x01\)/ ],
		[ 'a header value with DEL', [ @hook, '--set', "webhook.header.X-A=a\x7fb" ],
		  qr/webhook\.header\.X-A: the value holds a control character \(byte 0x7f\)/ ],
		[ 'a header name with a space', [ @hook, '--set', 'webhook.header.X A=1' ],
		  qr/webhook\.header\.X A: not a valid HTTP header name \(a token: .*\) \(webhook\.header\.X A: command line\)/ ],
		[ 'a header name with a parenthesis', [ @hook, '--set', 'webhook.header.X(A)=1' ],
		  qr/webhook\.header\.X\(A\): not a valid HTTP header name/ ],
		[ 'a webhook URL with port 0', [ '--sink', 'webhook', '--webhook-url', 'http://127.0.0.1:0/' ],
		  qr/webhook\.url "http:\/\/127\.0\.0\.1:0\/" is not valid: the port must be from 1 to 65535/ ],
		[ 'a rabbitmq URL with port 0', [ '--sink', 'rabbitmq', '--set', 'rabbitmq.url=amqp://127.0.0.1:0' ],
		  qr/rabbitmq\.url "amqp:\/\/127\.0\.0\.1:0" is not valid: the port must be from 1 to 65535 \(rabbitmq\.url: command line\)/ ],
		# amqp_parse_url makes the host localhost
		# and a password is not shown
		[ 'a rabbitmq URL without a host', [ '--sink', 'rabbitmq', '--set', 'rabbitmq.url=amqp://relay:s3cret@:5672/shop' ],
		  qr/rabbitmq\.url "amqp:\/\/relay:xxxxx\@:5672\/shop" is not valid: it names no host/ ],
		[ 'a rabbitmq URL with a password and %00', [ '--sink', 'rabbitmq', '--set', 'rabbitmq.url=amqp://relay:s3:c@ret@127.0.0.1/%00' ],
		  qr/rabbitmq\.url "amqp:\/\/relay:xxxxx\@127\.0\.0\.1\/%00" is not valid: each "%" must be followed/ ],
		[ 'a webhook URL with a password and port 0', [ '--sink', 'webhook', '--webhook-url', 'http://hook:s3cret@127.0.0.1:0/x?a=b' ],
		  qr/webhook\.url "http:\/\/hook:xxxxx\@127\.0\.0\.1:0\/x\?a=b" is not valid: the port must be from 1 to 65535/ ],
		[ 'a webhook URL with a password and no scheme', [ '--sink', 'webhook', '--webhook-url', 'hook:s3cret@127.0.0.1/' ],
		  qr/webhook\.url "hook:xxxxx\@127\.0\.0\.1\/" is not http:\/\/ or https:\/\// ],
		[ 'a nats URL with credentials', [ '--sink', 'nats', '--nats-url', 'nats://relay:s3cret@127.0.0.1:4222' ],
		  qr/nats\.url "nats:\/\/relay:xxxxx\@127\.0\.0\.1:4222": give the credentials in nats\.user and nats\.password, or nats\.token, not in the URL/ ],
		# librdkafka reads a port with atoi: it would connect to port 0
		[ 'a kafka broker with port 0', [ '--sink', 'kafka', '--set', 'kafka.brokers=127.0.0.1:9092, 127.0.0.1:0' ],
		  qr/kafka\.brokers \(bootstrap\.servers\) "127\.0\.0\.1:9092, 127\.0\.0\.1:0" is not valid: broker "127\.0\.0\.1:0": the port must be from 1 to 65535/ ],
		[ 'a kafka broker whose port is not a number', [ '--sink', 'kafka', '--set', 'kafka.brokers=PLAINTEXT://k1:9o92' ],
		  qr/broker "PLAINTEXT:\/\/k1:9o92": the port must be from 1 to 65535/ ],
		[ 'a kafka broker with an empty port', [ '--sink', 'kafka', '--set', 'kafka.brokers=k1:' ],
		  qr/broker "k1:": the port must be from 1 to 65535/ ],
		[ 'a kafka broker with port 65536, as a property', [ '--sink', 'kafka', '--set', 'kafka.property.bootstrap.servers=[::1]:65536' ],
		  qr/broker "\[::1\]:65536": the port must be from 1 to 65535/ ],
		# one host for librdkafka, "k1:9092 k2"
		[ 'kafka brokers without a comma between them', [ '--sink', 'kafka', '--set', 'kafka.brokers=k1:9092 k2:9092' ],
		  qr/broker "k1:9092 k2:9092": a blank in it \(separate brokers with commas\)/ ],
		[ 'kafka brokers that name no host', [ '--sink', 'kafka', '--set', 'kafka.brokers= , PLAINTEXT://' ],
		  qr/the kafka sink needs brokers: set kafka\.brokers/ ],
		# a "/" in the password: the URL cannot be parsed, and is shown
		[ 'a rabbitmq URL with a "/" in its password', [ '--sink', 'rabbitmq', '--set', 'rabbitmq.url=amqp://relay:s3/c@127.0.0.1:0' ],
		  qr/rabbitmq\.url "amqp:\/\/relay:xxxxx\@127\.0\.0\.1:0" is not/ ],
		[ 'a webhook URL with a "#" in its password', [ '--sink', 'webhook', '--webhook-url', 'http://h:s3#c@127.0.0.1:0/' ],
		  qr/webhook\.url "http:\/\/h:xxxxx\@127\.0\.0\.1:0\/" is not valid/ ],
		# 0 is no limit in librdkafka; the relay purges at its timeout anyway
		[ 'kafka message.timeout.ms 0', [ @mock, '--set', 'kafka.property.message.timeout.ms=0' ],
		  qr/kafka\.property\.message\.timeout\.ms must be from 1 to timeout \(10000 ms, default\), not "0": .* \(kafka\.property\.message\.timeout\.ms: command line\)/ ],
		[ 'kafka delivery.timeout.ms above the timeout',
		  [ @mock, '--timeout', '5s', '--set', 'kafka.property.delivery.timeout.ms=5001' ],
		  qr/kafka\.property\.delivery\.timeout\.ms must be from 1 to timeout \(5000 ms, command line\), not "5001"/ ],
		# the alias written last wins, as for one name
		[ 'kafka message.timeout.ms 0 after its alias',
		  [ @mock, '--set', 'kafka.property.delivery.timeout.ms=1000', '--set', 'kafka.property.message.timeout.ms=0' ],
		  qr/kafka\.property\.message\.timeout\.ms must be from 1 to timeout/ ],
		[ 'a kafka topic too long whatever its placeholders give',
		  [ @mock, '--set', 'kafka.topic=' . ('t' x 250) . '{key}' ],
		  qr/kafka\.topic is 250 bytes long without its placeholders; a Kafka topic name has at most 249/ ],
		# the host would have been "127.0.0.1/x"
		[ 'a nats URL with a path', [ '--sink', 'nats', '--nats-url', 'nats://127.0.0.1/x' ],
		  qr/nats\.url "nats:\/\/127\.0\.0\.1\/x" is not nats:\/\/HOST:PORT/ ])
	{
		my ($what, $args, $why) = @$case;
		($rc, $out, $err) = run_relay({}, '--once', '--log-interval', '0', @$args);
		is($rc, 1, "exit code 1 for $what");
		like($err, $why, "message for $what") or diag($err);
		unlike($err, qr/s3/, "no password in the message for $what") if grep { /s3/ } @$args;
	}
	# a tab may be in a value; message.timeout.ms up to the timeout, by
	# either name
	($rc, $out, $err) = run_relay({}, '--once', '--log-interval', '0', @hook, '--set', "webhook.header.X-A=a\tb");
	is($rc, 0, 'a header value with a tab is accepted') or diag($err);
	($rc, $out, $err) = run_relay({}, '--once', '--log-interval', '0', @mock, '--timeout', '5s',
		'--set', 'kafka.property.delivery.timeout.ms=5000');
	is($rc, 0, 'kafka delivery.timeout.ms equal to the timeout is accepted') or diag($err);
	($rc, $out, $err) = run_relay({}, '--once', '--log-interval', '0', @mock,
		'--set', 'kafka.property.message.timeout.ms=0', '--set', 'kafka.property.delivery.timeout.ms=1000');
	is($rc, 0, 'kafka message.timeout.ms 0 overridden by its alias written after it is accepted') or diag($err);
	# brokers that are not reached before a message is sent: a bare IPv6
	# address has no port, a path after PROTO://HOST is left out, atoi
	# skips leading zeros; a long list is read whole
	($rc, $out, $err) = run_relay({}, '--once', '--log-interval', '0', '--sink', 'kafka',
		'--set', 'kafka.brokers=[::1]:9092, PLAINTEXT://127.0.0.1:9092/,localhost,::1,k0:009092,,'
		  . join(',', map { sprintf('broker-%02d.kafka.example.internal:9092', $_) } 1 .. 20));
	is($rc, 0, 'kafka brokers with valid ports, or none, in a long list are accepted') or diag($err);
}

# a day itself is a duration
($rc, $out, $err) = run_relay({}, '--once', '--lease', '24h', '--timeout', '12h', '--log-interval', '0');
is($rc, 0, 'a lease of 24h and a timeout of 12h are accepted') or diag($err);
like($err, qr/lease 86400000 ms, .*timeout 43200000 ms/, 'and in force');

open(my $bad, '>', "$tmp/bad.conf") or die;
print $bad "# a comment\nbatch = 10\nthis line has no equals sign\n";
close($bad);
($rc, $out, $err) = run_relay({}, '--config', "$tmp/bad.conf");
is($rc, 1, 'exit code 1 for a malformed configuration file');
like($err, qr/bad\.conf:3: expected "key = value"/, 'the file and line are named');
# a NUL byte would cut the line short: batch 5 and the rest lost
open($bad, '>', "$tmp/nul.conf") or die;
print $bad "batch = 5\0000\n";
close($bad);
($rc, $out, $err) = run_relay({}, '--config', "$tmp/nul.conf");
is($rc, 1, 'exit code 1 for a NUL byte in a line');
like($err, qr/nul\.conf:1: a NUL byte in the line/, 'the file and line are named');
# the origin of a topic's sink, whatever the length of the topic's key
open($bad, '>', "$tmp/longtopic.conf") or die;
print $bad 'topic."' . ('""' x 600) . qq{".sink = nosuch\n};
close($bad);
($rc, $out, $err) = run_relay({}, '--config', "$tmp/longtopic.conf");
is($rc, 1, 'exit code 1 for an unknown sink of a topic with a long quoted name');
like($err, qr/longtopic\.conf:1/, 'its file and line are named') or diag($err);
# a topic's name longer than any topic can be: said so, not "malformed"
open($bad, '>', "$tmp/toolong.conf") or die;
print $bad "batch = 5\ntopic." . ('t' x 1200) . ".sink = stdout\n";
close($bad);
($rc, $out, $err) = run_relay({}, '--config', "$tmp/toolong.conf");
is($rc, 1, 'exit code 1 for a topic whose name is too long');
like($err, qr/a setting of a topic whose name is too long \(.*toolong\.conf:2\): a topic has at most 255 bytes/,
	'the message says the name is too long, with its file and line') or diag($err);

# A check of two settings names where each comes from.
open($bad, '>', "$tmp/cross.conf") or die;
print $bad "lease = 10s\ntimeout = 6s\n";
close($bad);
($rc, $out, $err) = run_relay({}, '--config', "$tmp/cross.conf");
is($rc, 1, 'exit code 1 for a timeout above half the lease');
like($err, qr/timeout \(6000 ms, .*cross\.conf:2\) must be at most half the lease \(10000 ms, .*cross\.conf:1\)/,
	'the file and line of each setting are named');
($rc, $out, $err) = run_relay({}, '--config', "$tmp/cross.conf", '--lease', '11s');
like($err, qr/timeout \(6000 ms, .*cross\.conf:2\) must be at most half the lease \(11000 ms, command line\)/,
	'the command line is named where it wins over the file');

# A sink's setting that it refuses: the file and line of the one in force
# (the topic's, over the one of every topic).
open($bad, '>', "$tmp/sink.conf") or die;
print $bad "sink = webhook\nwebhook.url = ftp://x/\n";
close($bad);
($rc, $out, $err) = run_relay({}, '--config', "$tmp/sink.conf");
is($rc, 1, 'exit code 1 for a webhook URL that is not http');
like($err, qr/webhook\.url "ftp:\/\/x\/" is not http:\/\/ or https:\/\/ \(webhook\.url: .*sink\.conf:2\)/,
	'a sink setting refused: its file and line are named');
open($bad, '>', "$tmp/sink.conf") or die;
print $bad "webhook.url = http://127.0.0.1/\ntopic.t1.sink = webhook\ntopic.t1.webhook.url = ftp://y/\n";
close($bad);
($rc, $out, $err) = run_relay({}, '--config', "$tmp/sink.conf");
like($err, qr/webhook\.url "ftp:\/\/y\/" is not http:\/\/ or https:\/\/ \(topic\.t1\.webhook\.url: .*sink\.conf:3\)$/m,
	'the topic\'s setting, which is the one in force, is named');
# A setting's name inside a value the error quotes is not taken for it.
open($bad, '>', "$tmp/sink.conf") or die;
print $bad "sink = webhook\nwebhook.header.X-A = 1\nwebhook.url = ftp://x/ webhook.header.X-A\n";
close($bad);
($rc, $out, $err) = run_relay({}, '--config', "$tmp/sink.conf");
like($err, qr/is not http:\/\/ or https:\/\/ \(webhook\.url: \S*sink\.conf:3\)$/m,
	'a setting named inside the quoted value is not named as set');
($rc, $out, $err) = run_relay({}, '--sink', 'nats', '--set', 'nats.user=a', '--set', 'nats.password=p',
	'--set', 'nats.token=b');
is($rc, 1, 'exit code 1 for nats.token beside nats.user');
like($err, qr/nats\.token and nats\.user cannot both be set \(nats\.user: command line; nats\.token: command line\)/,
	'both are named, with where they were set');

# A byte order mark before the first key is not part of it.
open($bad, '>', "$tmp/bom.conf") or die;
print $bad "\xEF\xBB\xBFbatch = 0\n";
close($bad);
($rc, $out, $err) = run_relay({}, '--config', "$tmp/bom.conf");
is($rc, 1, 'exit code 1 for batch = 0 after a byte order mark');
like($err, qr/batch must be an integer from 1 to 10000, not "0" \(.*bom\.conf:1\)/,
	'the first key after a byte order mark is read as the key');

# A value in double quotes keeps the spaces at its ends: they are part of
# the relay's name in its leases.
open($bad, '>', "$tmp/quoted.conf") or die;
print $bad qq{name = " relay x "\nlog_interval = 0\n};
close($bad);
send_msg('quoted', 'k', { n => 1 });
($rc, $out, $err) = run_relay({}, '--once', '--config', "$tmp/quoted.conf");
is($rc, 0, 'a relay named by a quoted value') or diag($err);
like($err, qr/starting as " relay x "/, 'its name keeps its spaces');
is(sql(q{SELECT '[' || leased_by || ']' FROM idem.outbox_keys WHERE topic = 'quoted'}), '[ relay x ]',
	'and the message was leased in that name');
sql(q{DELETE FROM idem.outbox WHERE aggregatetype = 'quoted'; DELETE FROM idem.outbox_keys WHERE topic = 'quoted'});

# A connection string libpq cannot parse, or a service it cannot find, is a
# configuration error (exit code 1), not a database that is down (retried,
# or exit code 2 with --exit-on-error).
($rc, $out, $err) = run_relay({}, '--dbname', 'host=/tmp bogus_option=1', '--exit-on-error',
	'--connect-attempts', '1', '--once');
is($rc, 1, 'exit code 1 for a dbname with an unknown option');
like($err, qr/dbname is not valid: invalid connection option "bogus_option" \(command line\)/,
	'libpq\'s error and where dbname was set') or diag($err);
($rc, $out, $err) = run_relay({ PGSERVICE => 'nosuch' }, '--exit-on-error', '--connect-attempts', '1', '--once');
is($rc, 1, 'exit code 1 for a PGSERVICE that names no service');
like($err, qr/the connection settings of the environment are not valid: definition of service "nosuch" not found/,
	'and says so') or diag($err);
($rc, $out, $err) = run_relay({}, '--dbname', 'service=nosuch', '--exit-on-error', '--connect-attempts', '1', '--once');
is($rc, 1, 'exit code 1 for a service in dbname that does not exist');

# Settings of a sink that no topic goes to would be ignored: a relay given a
# webhook's URL and not --sink webhook delivered to standard output instead.
send_msg('unrouted', 'k', { n => 1 });
for my $case (
	[ [ '--webhook-url', 'http://127.0.0.1:9/orders' ], qr/webhook\.url is set, but no topic's sink is webhook \(command line\)/ ],
	[ [ '--nats-url', 'nats://127.0.0.1:9' ], qr/nats\.url is set, but no topic's sink is nats/ ],
	[ [ '--set', 'kafka.brokers=127.0.0.1:9' ], qr/kafka\.brokers is set, but no topic's sink is kafka/ ],
	[ [ '--sink', 'webhook', '--webhook-url', 'http://127.0.0.1:9/', '--set', 'rabbitmq.exchange=x' ],
	  qr/rabbitmq\.exchange is set, but no topic's sink is rabbitmq/ ],
	[ [ '--set', 'topic.unrouted.webhook.url=http://127.0.0.1:9/' ],
	  qr/topic\.unrouted\.webhook\.url is set, but the sink of topic "unrouted" is stdout \(command line\)/ ],
	[ [ '--sink', 'webhook', '--webhook-url', 'http://127.0.0.1:9/', '--set', 'topic.unrouted.sink=stdout',
		'--set', 'topic.unrouted.webhook.header.X-A=1' ],
	  qr/topic\.unrouted\.webhook\.header\.X-A is set, but the sink of topic "unrouted" is stdout/ ])
{
	($rc, $out, $err) = run_relay({}, '--once', @{ $case->[0] });
	is($rc, 1, "exit code 1 for @{ $case->[0] }");
	like($err, $case->[1], "message for @{ $case->[0] }") or diag($err);
}
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'unrouted'}), 1,
	'the message was not delivered elsewhere meanwhile');
# a setting of every topic that one topic's route uses is in use
($rc, $out, $err) = run_relay({}, '--once', '--log-interval', '0', '--set', 'topic.unrouted.sink=webhook',
	'--set', 'topic.other.sink=stdout', '--set', 'webhook.url=http://127.0.0.1:9/', '--timeout', '50ms',
	'--lease', '1s');
is($rc, 0, 'webhook.url for the one topic whose sink is webhook is accepted') or diag($err);
sql(q{DELETE FROM idem.outbox WHERE aggregatetype = 'unrouted'; DELETE FROM idem.outbox_keys WHERE topic = 'unrouted'});

# A topic whose name holds "=": the key ends at the first "=" after its
# closing quote (a quote inside the name is doubled).
send_msg('a=b', 'k', { n => 1 });
send_msg('c"=d', 'k', { n => 2 });
open($bad, '>', "$tmp/eq.conf") or die;
print $bad qq{topic."c""=d".sink = stdout\nlog_interval = 0\n};
close($bad);
($rc, $out, $err) = run_relay({}, '--once', '--config', "$tmp/eq.conf", '--set', 'topic."a=b".sink=stdout');
is($rc, 0, 'topics with "=" in their names, in the file and on the command line') or diag($err);
like($err, qr/topic "a=b": sink stdout/, 'the command line\'s topic is "a=b"');
like($err, qr/topic "c"=d": sink stdout/, 'the file\'s topic is c"=d');
is(join(',', sort map { $jtext->decode($_)->{topic} } split /\n/, $out), 'a=b,c"=d',
	'their messages are delivered');
sql(q{DELETE FROM idem.outbox WHERE aggregatetype IN ('a=b', 'c"=d'); DELETE FROM idem.outbox_keys WHERE topic IN ('a=b', 'c"=d')});

# Exit code 2: no server where the environment points.
($rc, $out, $err) = run_relay({ PGHOST => "$tmp/nowhere" },
	'--exit-on-error', '--connect-attempts', '2', '--reconnect-max', '50ms');
is($rc, 2, 'exit code 2: cannot connect, --exit-on-error');
like($err, qr/could not connect after 2 attempts/, 'after the attempts given');

# Exit code 3: a database without idem; then a role without the grants.
($rc, $out, $err) = run_relay({ PGDATABASE => 'noidem' }, '--exit-on-error');
is($rc, 3, 'exit code 3: idem is not installed, --exit-on-error');
like($err, qr/the extension idem is not installed in database "noidem"/, 'and says so');
sql('CREATE ROLE nobody LOGIN');
($rc, $out, $err) = run_relay({ PGUSER => 'nobody' }, '--exit-on-error');
is($rc, 3, 'exit code 3: a role without the grants');
like($err, qr/idem_outbox_lease failed: permission denied .*\(SQLSTATE 42501\)/,
	'the error and its SQLSTATE are logged');

########################################################################
# stdout: every message once, in order per key
########################################################################

# Keys that JSON must escape; first messages of each key in transactions
# of their own, then the rest in transactions of several sends.
my @keys = ('plain', 'q"uote', "new\nline", "back\\slash", "caf\x{e9} \x{43c}\x{438}\x{440}");
my (%sent, @order);
my $seq = 0;
for my $round (0 .. 7)
{
	my @stmts;
	for my $k (@keys)
	{
		$seq++;
		my $payload = { seq => $seq, key => $k, text => "m\x{e9}ssage $seq" };
		my $headers = $seq % 3 ? undef : { trace => "t-$seq" };
		push @stmts, sprintf('SELECT idem_outbox_send(%s, %s, %s::jsonb, %s, %s);',
			q_lit('orders'), q_lit($k), q_lit($jtext->encode($payload)),
			defined $headers ? q_lit($jtext->encode($headers)) . '::jsonb' : 'NULL',
			$seq % 2 ? q_lit('order.paid') : 'NULL');
		push @order, [ $k, $payload, $headers, $seq % 2 ? 'order.paid' : undef ];
	}
	my @ids = split /\n/, sql(join("\n", 'BEGIN;', @stmts, 'COMMIT;'));
	is(scalar(@ids), scalar(@keys), "round $round sent");
	$order[ $#order - $#keys + $_ ][4] = $ids[$_] for 0 .. $#ids;
}
my $nsent = scalar @order;

($rc, $out, $err) = run_relay({}, '--once', '--batch', '3', '--log-interval', '0');
is($rc, 0, 'stdout relay with --once exits with 0');
is(final_counts($err), "leased $nsent, delivered $nsent, retried 0, dead 0, errors 0",
	'the final log line counts every message');
like($err, qr/connected to database "postgres" as "relay"/,
	'connected through the environment as the relay role');
# a nack names its relay: relays in containers share host names and PIDs,
# so the default name carries a random part
like($err, qr/starting as "[^"]+:\d+:[0-9a-f]{8}"/, 'the default name is HOST:PID:RANDOM');

my @lines = map { $json->decode($_) } split /\n/, $out;
is(scalar(@lines), $nsent, 'one line per message');
my (%byid, %perkey);
$byid{ $_->{id} }++ for @lines;
is(scalar(grep { $byid{ $_->[4] } && $byid{ $_->[4] } == 1 } @order), $nsent,
	'every message id appears exactly once');
push @{ $perkey{ $_->{key} } }, $_->{payload}{seq} for @lines;
my $in_order = 1;
for my $k (@keys)
{
	my @want = map { $_->[1]{seq} } grep { $_->[0] eq $k } @order;
	$in_order = 0 unless join(',', @{ $perkey{$k} // [] }) eq join(',', @want);
}
ok($in_order, 'the messages of each key come in the order they were sent');
my %sent_by_id = map { $_->[4] => $_ } @order;
my $fields_ok = 1;
for my $l (@lines)
{
	my $s = $sent_by_id{ $l->{id} } or do { $fields_ok = 0; next };
	$fields_ok = 0
	  unless $l->{topic} eq 'orders'
	  && $l->{key} eq $s->[0]
	  && $json->encode($l->{payload}) eq $json->encode($s->[1])
	  && $json->encode($l->{headers}) eq $json->encode($s->[2])
	  && ($l->{type} // '') eq ($s->[3] // '')
	  && $l->{attempt} == 1
	  && $l->{created_at} =~ /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/;
}
ok($fields_ok, 'id, topic, key (escaped), type, payload, headers, attempt and created_at as sent');
is(sql('SELECT count(*) FROM idem.outbox'), 0, 'every message acknowledged');

########################################################################
# Waking up: LISTEN, and polling for what cannot notify
########################################################################

# A poll interval of an hour: only the notification can wake the relay.
# (The backend of a relay that stopped may still be there for a moment:
# each wait for the idle relay first waits until none is.)
sub relays_gone
{
	return wait_for('the backends of earlier relays to exit',
		sub { sql(q{SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idem-relay'}) == 0 });
}
my $idle_sql = q{SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
	WHERE l.locktype = 'advisory' AND l.objsubid = 3 AND l.mode = 'RowExclusiveLock'
	  AND a.application_name = 'idem-relay'};
ok(relays_gone(), 'no relay connected');
my $r = start_relay({}, '--poll', '1h', '--log-interval', '0');
ok(wait_for('the relay to go idle', sub { sql($idle_sql) == 1 }), 'the relay is idle');
my $woken = send_msg('wake', 'w1', { hello => 1 });
ok( wait_for('the message on stdout', sub { -s $r->{out} && slurp_file($r->{out}) =~ /\Q$woken\E/ }),
	'a send wakes the idle relay through its notification');
is(stop_relay($r, 'TERM'), 0, 'SIGTERM: exit code 0');
my $rerr = slurp_file($r->{err});
like($rerr, qr/stopping/, 'the relay says it stops');
is(final_counts($rerr), 'leased 1, delivered 1, retried 0, dead 0, errors 0', 'its final counts');

# A prepared transaction's message: no notification, the poll finds it.
ok(relays_gone(), 'the first relay is gone');
$r = start_relay({}, '--poll', '100ms', '--log-interval', '0');
ok(wait_for('the relay to go idle', sub { sql($idle_sql) == 1 }), 'the second relay is idle');
my $prepared = sql(q{BEGIN;
	SELECT idem_outbox_send('wake', 'w2', '{"prepared": true}');
	PREPARE TRANSACTION 'relay-2pc';});
sql(q{COMMIT PREPARED 'relay-2pc'});
ok( wait_for('the prepared message on stdout',
		sub { -s $r->{out} && slurp_file($r->{out}) =~ /"prepared": true/ }),
	'a message committed by COMMIT PREPARED is found by polling');
is(stop_relay($r, 'INT'), 0, 'SIGINT: exit code 0');

########################################################################
# Linger: after a lease that found fewer than --batch, wait for more
########################################################################

# Ten messages of ten keys (a lease hands out one message per key) sent
# 100 ms apart, each in a transaction of its own (each notifies); how many
# acks (batches) the relay makes of them.
sub acks_of_trickle
{
	my ($tag, @args) = @_;
	ok(relays_gone(), "$tag: no relay connected");
	my $r = start_relay({}, '--poll', '5s', '--log-interval', '0', @args);
	ok(wait_for('the relay to go idle', sub { sql($idle_sql) == 1 }), "$tag: the relay is idle");
	sql('SELECT pg_stat_reset()');
	sql(join("\n", map {
		"SELECT idem_outbox_send('linger', 'l$_', '{\"n\": $_}'); SELECT pg_sleep(0.1);"
	} 1 .. 10));
	ok( wait_for('ten messages on stdout',
			sub { -s $r->{out} && (() = slurp_file($r->{out}) =~ /"linger"/g) == 10 }),
		"$tag: the ten messages are delivered");
	is(stop_relay($r, 'TERM'), 0, "$tag: exit code 0");
	my @n = sort { $a <=> $b } (slurp_file($r->{out}) =~ /"n": (\d+)/g);
	is("@n", '1 2 3 4 5 6 7 8 9 10', "$tag: each once");
	# a backend's function statistics reach the server when it exits
	ok( wait_for('the relay\'s backend to exit',
			sub { sql(q{SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idem-relay'}) == 0 }),
		"$tag: the relay's backend exited");
	return sql(q{SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions
		WHERE funcname = 'idem_outbox_ack'});
}

# Without a linger, each message is leased as it commits: the trickle is
# slow enough to tell the two apart.
my $acks = acks_of_trickle('no linger', '--linger', '0');
cmp_ok($acks, '>=', 6, "no linger: a batch for about every message ($acks acks)");
# With a linger of 2 s, the first message's lease is short: the relay waits,
# and the next lease finds the rest (one more wait, then an empty lease).
$acks = acks_of_trickle('linger 2s', '--linger', '2s');
cmp_ok($acks, '<=', 3, "linger 2s: the ten messages in at most three batches ($acks acks)");

# --max-bytes: a lease takes no more message once those taken weigh that
# much (at least one), so that a batch of large messages is not held in
# memory at once: six messages of about 100 kB in leases of 150 kB (the
# second takes each past it) are three leases of two, and the empty one
# that ends --once, where the default of 64MB takes them in one.
sub leases_of_big
{
	my (@args) = @_;
	sql('SELECT pg_stat_reset()');
	sql(q{SELECT count(idem_outbox_send('big', 'b' || i, jsonb_build_object('pad', repeat(md5(i::text), 3200))))
	        FROM generate_series(1, 6) i});
	my ($rc, $out, $err) = run_relay({}, '--once', '--batch', '10', '--log-interval', '0', @args);
	is($rc, 0, "--once @args: exit code 0") or diag($err);
	is(scalar(() = $out =~ /"topic": "big"/g), 6, "--once @args: the six messages are delivered");
	ok( wait_for('the relay\'s backend to exit',
			sub { sql(q{SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idem-relay'}) == 0 }),
		"--once @args: the relay's backend exited");
	return sql(q{SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname = 'idem_outbox_lease'});
}
is(leases_of_big('--max-bytes', '150kB'), 4, '--max-bytes 150kB: three leases of two messages, then an empty one');
is(leases_of_big(), 2, 'the default (64MB): one lease of six, then an empty one');
like((run_relay({}, '--once', '--max-bytes', '1PB'))[2], qr/max_bytes must be a size of zero or more, in bytes or with kB, MB, GB or TB, such as 64MB, not "1PB"/,
	'a size in another unit is a configuration error');

########################################################################
# webhook
########################################################################

my $hooklog = "$tmp/hooks.jsonl";
my $receiver = IPC::Run::start(
	[ 'python3', "$FindBin::RealBin/../test/relay/receiver.py", "$tmp/port", $hooklog ],
	'>', "$tmp/receiver.out", '2>', "$tmp/receiver.err");
ok(wait_for('the receiver', sub { -s "$tmp/port" }), 'the HTTP receiver listens')
  or diag(slurp_file("$tmp/receiver.err"));
my $port = slurp_file("$tmp/port");
my $url = "http://127.0.0.1:$port";

sub received
{
	return [] unless -s $hooklog;
	# whole lines only: the receiver may be writing the last one
	(my $text = slurp_file($hooklog)) =~ s/[^\n]*\z//;
	return [ map { $json->decode($_) } split /\n/, $text ];
}

# Short backoffs for the test's topics; hooks.v1 dies after one attempt.
sql(q{SELECT idem_outbox_configure('hooks', 5, '50 milliseconds', '100 milliseconds');
      SELECT idem_outbox_configure('hooks.v1', 1, '50 milliseconds', '100 milliseconds');});

my %hook;
$hook{ok1} = send_msg('hooks', 'ok', { n => 1 }, { trace => 'abc' }, 'hook.ok');
$hook{ok2} = send_msg('hooks', 'ok', { n => 2 }, { trace => "a\x{7f}b" });
$hook{ok3} = send_msg('hooks', 'ok', { n => 3 });
$hook{enc} = send_msg('hooks', "caf\x{e9} /1", { n => 4 }, undef, "t\x{fc}p\n2");
$hook{r500} = send_msg('hooks', 'r500', { reply => [ '500 ra=0', '200' ] });
$hook{r429} = send_msg('hooks', 'r429', { reply => [ '429', '200' ] });
$hook{r408} = send_msg('hooks', 'r408', { reply => [ '408', '200' ] });
$hook{r503s} = send_msg('hooks', 'r503s', { reply => ['503 ra=3600'] });
$hook{r503d} = send_msg('hooks', 'r503d', { reply => ['503 date=+7200'] });
$hook{r400} = send_msg('hooks', 'r400', { reply => ['400'] });
$hook{r400b} = send_msg('hooks', 'r400', { behind => 'the refused one' });
$hook{v1} = send_msg('hooks.v1', 'k', { reply => ['404'] });
$hook{audit} = send_msg('audit', 'a', { audit => 1 });

open(my $conf, '>', "$tmp/relay.conf") or die;
print $conf <<"EOF";
# every topic to the webhook, audit to stdout, hooks.v1 to its own path
sink = webhook
webhook.url = $url/hooks
webhook.header.Authorization = Bearer t0ken
topic.audit.sink = stdout
topic."hooks.v1".webhook.url = $url/v1
batch = 20
lease = 10s
timeout = 5s
poll = 100ms
log_interval = 0
EOF
close($conf);

$r = start_relay({}, '--config', "$tmp/relay.conf");
# delivered: ok x3, enc, r500, r429 and audit; left: r503s, r503d, r400 and
# the message behind it, v1 (dead)
ok( wait_for('the webhook deliveries', sub {
			sql(q{SELECT count(*) FROM idem.outbox}) == 5
			  && sql(q{SELECT count(*) FROM idem.outbox_keys
			           WHERE last_error IS NOT NULL AND leased_by IS NULL}) == 4 }),
	'the relay delivered what it could');
is(stop_relay($r, 'TERM'), 0, 'webhook relay stopped with exit code 0');
$rerr = slurp_file($r->{err});
is(final_counts($rerr), 'leased 15, delivered 8, retried 5, dead 2, errors 0',
	'final counts: 8 delivered, 500, 429, 408 and two 503 retried, 400 and 404 refused');

my $got = received();
my %by_key;
push @{ $by_key{ $_->{idempotency_key} } }, $_ for @$got;
is(join(',', map { scalar @{ $by_key{ $hook{$_} } // [] } } qw(ok1 ok2 ok3 enc r500 r429 r408 r503s r503d r400 v1)),
	'1,1,1,1,2,2,2,1,1,1,1', 'requests per message: one each, two for the retried 500, 429 and 408');
ok(!exists $by_key{ $hook{r400b} }, 'the message behind the refused one is held back');
ok(!exists $by_key{ $hook{audit} }, 'the audit topic went elsewhere');
like(slurp_file($r->{out}), qr/"id": "$hook{audit}", "topic": "audit"/, 'to stdout, by its topic route');

my $ok1 = $by_key{ $hook{ok1} }[0];
is($ok1->{content_type}, 'application/json', 'Content-Type: application/json');
is($ok1->{idempotency_key}, $hook{ok1}, 'Idempotency-Key: the message id');
is_deeply([ $ok1->{topic}, $ok1->{key}, $ok1->{type}, $ok1->{attempt} ],
	[ 'hooks', 'ok', 'hook.ok', '1' ], 'X-Idem-Topic, X-Idem-Key, X-Idem-Type, X-Idem-Attempt');
is($ok1->{headers}, '{"trace": "abc"}', 'X-Idem-Headers: the message headers');
is($by_key{ $hook{ok2} }[0]{headers}, '{"trace": "a\\u007fb"}',
	'a DEL, which no header value may hold, escaped in the JSON');
is_deeply($ok1->{body}, { n => 1 }, 'the body is the payload');
is($ok1->{authorization}, 'Bearer t0ken', 'a header of the configuration');
is($ok1->{path}, '/hooks', 'to the URL for every topic');
my $enc = $by_key{ $hook{enc} }[0];
is_deeply([ $enc->{key}, $enc->{type} ], [ 'caf%C3%A9%20%2F1', 't%C3%BCp%0A2' ],
	'key and type percent-encoded (UTF-8)');
is(join(',', map { $_->{body}{n} } grep { $_->{key} eq 'ok' } @$got), '1,2,3',
	'the messages of a key in order');
is(join(',', map { $_->{attempt} } @{ $by_key{ $hook{r500} } }), '1,2',
	'a 500 is retried: second attempt delivered');
is($by_key{ $hook{v1} }[0]{path}, '/v1', 'a quoted topic with a dot has its own URL');

is( sql(qq{SELECT available_at > now() + interval '50 minutes'
	           AND available_at <= now() + interval '1 hour', last_error
	      FROM idem.outbox_keys WHERE key = 'r503s'}),
	't|webhook: HTTP 503: {"status": 503}',
	'Retry-After in seconds: the message waits that long');
is( sql(qq{SELECT available_at > now() + interval '110 minutes'
	           AND available_at <= now() + interval '2 hours'
	      FROM idem.outbox_keys WHERE key = 'r503d'}),
	't', 'Retry-After as an HTTP date: the message waits until then');
is( sql(qq{SELECT dead, last_error FROM idem.outbox_keys WHERE key = 'r400'}),
	't|permanent: webhook: HTTP 400: {"status": 400}',
	'a 400 is refused for good: dead at once, with its error');
is( sql(qq{SELECT dead, last_error FROM idem.outbox_keys WHERE topic = 'hooks.v1'}),
	't|permanent: webhook: HTTP 404: {"status": 404}',
	'a 404 on the last attempt of its topic: dead at once');
is(sql(q{SELECT dead FROM idem_outbox_stats() WHERE topic = 'hooks.v1'}), 1,
	'counted dead by idem_outbox_stats');

# A batch's nacks in the order of their keys' key_hash, the order in which
# an ack locks key rows (a nack of several keys and another relay's ack of
# the same keys cannot deadlock): twelve keys whose messages all fail with
# the same Retry-After, so that the nack statement, which reads the clock
# at each call, gives later calls a later available_at.  In a UTF8
# database, and in a WIN1252 one, whose bytes of a key other than ASCII are
# not the UTF-8 the relay reads (it hashes the server's bytes there).
$node->safe_psql('postgres',
	q{CREATE DATABASE relay_1252 ENCODING 'WIN1252' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0});
$node->safe_psql('relay_1252', 'CREATE EXTENSION idem');
for my $db ('postgres', 'relay_1252')
{
	$node->safe_psql($db, q{
		SELECT idem_outbox_configure('nackorder', 5, '1 hour', '1 hour');
		SELECT idem_outbox_send('nackorder', 'k' || chr(192 + i),
		                        jsonb_build_object('n', i, 'reply', jsonb_build_array('503 ra=3600')))
		  FROM generate_series(1, 12) i});
	($rc, $out, $err) = run_relay({ PGDATABASE => $db, PGUSER => undef },
		'--sink', 'webhook', '--webhook-url', "$url/nackorder", '--once', '--verbose');
	is($rc, 0, "$db: the relay of failing messages stops at the empty lease");
	is( $node->safe_psql($db, q{
		SELECT count(*), count(*) FILTER (WHERE available_at > now() + interval '50 minutes'),
		       bool_and(ordered)
		  FROM (SELECT available_at,
		               available_at >= lag(available_at, 1, '-infinity')
		                 OVER (ORDER BY idem._outbox_key_hash(topic, key)) AS ordered
		          FROM idem.outbox_keys WHERE topic = 'nackorder') k}),
		'12|12|t', "$db: every failed message nacked, in the order of the keys' key_hash")
	  or diag $err;
	$node->safe_psql($db, q{
		DELETE FROM idem.outbox WHERE aggregatetype = 'nackorder';
		DELETE FROM idem.outbox_keys WHERE topic = 'nackorder'});
}

# Answers that come in parts, and what the relay sends itself: a Retry-After
# on an interim 103 is not the final 503's (the message waits the topic's
# backoff, not an hour); a 2xx whose body stalls or is cut short is
# delivered; a message whose headers are more than libcurl sends is refused
# for good at once; an empty header of the configuration is sent empty.
sql(q{SELECT idem_outbox_configure('more', 5, '50 milliseconds', '100 milliseconds')});
my %more;
$more{e103} = send_msg('more', 'e103', { reply => [ '503 early=3600', '200' ] });
$more{stall} = send_msg('more', 'stall', { reply => [ '200 stall=3', '200' ] });
$more{cut} = send_msg('more', 'cut', { reply => [ '200 cut', '200' ] });
$more{big} = send_msg('more', 'big', { n => 1 }, { big => 'x' x (1100 * 1024) });
$more{plain} = send_msg('more', 'plain', { n => 1 });
# a final 3xx (the relay follows no redirect) and a 425 are retried, not
# taken for a delivery nor refused; a Retry-After beyond a day waits a day
$more{r301} = send_msg('more', 'r301', { reply => [ '301', '200' ] });
$more{r425} = send_msg('more', 'r425', { reply => [ '425', '200' ] });
$more{rday} = send_msg('more', 'rday', { reply => ['503 ra=172800'] });
$r = start_relay({}, '--sink', 'webhook', '--webhook-url', "$url/more",
	'--set', 'webhook.header.X-Empty=', '--lease', '4s', '--timeout', '1s',
	'--poll', '100ms', '--log-interval', '0');
# done: every message delivered, dead, or waiting more than half an hour
# (e103, should the 103's Retry-After be taken)
ok( wait_for('the answers in parts', sub {
			sql(q{SELECT NOT EXISTS (
			        SELECT FROM idem.outbox o JOIN idem.outbox_keys k
			          ON k.topic = o.aggregatetype AND k.key = o.aggregateid
			       WHERE o.aggregatetype = 'more'
			         AND NOT (k.dead OR k.available_at > now() + interval '30 minutes'))}) eq 't' }),
	'the relay is done with the answers in parts');
is(stop_relay($r, 'TERM'), 0, 'exit code 0');
$rerr = slurp_file($r->{err});
is(final_counts($rerr), 'leased 11, delivered 6, retried 4, dead 1, errors 0',
	'final counts: e103, r301, r425 and rday retried once, six delivered, big dead');
my %more_got;
push @{ $more_got{ $_->{idempotency_key} } }, $_ for grep { $_->{path} eq '/more' } @{ received() };
is(join(',', map { scalar @{ $more_got{ $more{$_} } // [] } } qw(e103 stall cut big plain r301 r425 rday)),
	'2,1,1,0,1,2,2,1', 'requests per message: two for e103, r301 and r425, one each for stall, cut, plain and rday, none for big');
is(join(' ', map { join(',', map { $_->{attempt} } @{ $more_got{ $more{$_} } // [] }) } qw(r301 r425)),
	'1,2 1,2', 'a final 301 and a 425 are retried: second attempt delivered');
is( sql(q{SELECT dead, available_at > now() + interval '23 hours 50 minutes'
	                AND available_at <= now() + interval '1 day', last_error
	      FROM idem.outbox_keys WHERE topic = 'more' AND key = 'rday'}),
	'f|t|webhook: HTTP 503: {"status": 503}', 'a Retry-After of two days waits a day, the longest a nack takes');
is(join(',', map { $_->{attempt} } @{ $more_got{ $more{e103} } // [] }), '1,2',
	'a Retry-After on a 103 is not applied to the 503 after it: retried after the backoff');
is( sql(qq{SELECT dead, attempts, last_error LIKE 'permanent: webhook: the request''s headers take % bytes (X-Idem-Headers: %'
	      FROM idem.outbox_keys WHERE topic = 'more' AND key = 'big'}),
	't|1|t', 'headers of more than 1 MiB: refused for good at the first attempt, with the reason');
is($more_got{ $more{plain} }[0]{x_empty}, '', 'an empty header of the configuration is sent, empty');
$node->safe_psql('postgres', q{
	DELETE FROM idem.outbox WHERE aggregatetype = 'more';
	DELETE FROM idem.outbox_keys WHERE topic = 'more'});

# The counts are of what the database took: an ack or a nack that fails
# counts nothing delivered, retried or dead (exit code 3 with
# --exit-on-error, after the final counts).
sql(q{REVOKE EXECUTE ON FUNCTION idem_outbox_ack(uuid[]) FROM relay});
send_msg('acks', 'a', { n => 1 });
($rc, $out, $err) = run_relay({}, '--once', '--exit-on-error', '--log-interval', '0');
is($rc, 3, 'the ack fails: exit code 3');
is(final_counts($err), 'leased 1, delivered 0, retried 0, dead 0, errors 1',
	'a message whose ack failed is not counted delivered');
sql(q{GRANT EXECUTE ON FUNCTION idem_outbox_ack(uuid[]) TO relay;
      REVOKE EXECUTE ON FUNCTION idem_outbox_nack(uuid, text, interval, text, boolean) FROM relay;
      DELETE FROM idem.outbox WHERE aggregatetype = 'acks';
      DELETE FROM idem.outbox_keys WHERE topic = 'acks'});
send_msg('acks', 'r', { reply => ['503'] });
send_msg('acks', 'd', { reply => ['400'] });
($rc, $out, $err) = run_relay({}, '--sink', 'webhook', '--webhook-url', "$url/acks",
	'--once', '--exit-on-error', '--log-interval', '0');
is($rc, 3, 'the nack fails: exit code 3');
is(final_counts($err), 'leased 2, delivered 0, retried 0, dead 0, errors 1',
	'messages whose nack failed are not counted retried or dead');
sql(q{GRANT EXECUTE ON FUNCTION idem_outbox_nack(uuid, text, interval, text, boolean) TO relay;
      DELETE FROM idem.outbox WHERE aggregatetype = 'acks';
      DELETE FROM idem.outbox_keys WHERE topic = 'acks'});

########################################################################
# No publish outlives its lease
########################################################################

# --lease 2s --timeout 1s: the first message of the batch times out after a
# second, and the rest of the batch then has less than the timeout left of
# its lease: it is released, not published, and leased again.
sql(q{SELECT idem_outbox_configure('late', 5, '50 milliseconds', '100 milliseconds')});
my @late;
for my $k (qw(l1 l2 l3))
{
	push @late, send_msg('late', $k, { n => 1, $k eq 'l1' ? (reply => [ '200 sleep=3', '200' ]) : () });
}
$r = start_relay({}, '--sink', 'webhook', '--webhook-url', "$url/late", '--lease', '2s',
	'--timeout', '1s', '--poll', '100ms', '--log-interval', '0');
ok( wait_for('the late batch', sub {
			sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'late'}) == 0 }),
	'the batch is delivered in the end');
is(stop_relay($r, 'TERM'), 0, 'exit code 0');
$rerr = slurp_file($r->{err});
like($rerr, qr/WARNING:  2 of 3 messages were not published: less than the timeout \(1000 ms\) was left of their lease/,
	'a warning says why two messages were not published');
my %late_got;
push @{ $late_got{ $_->{idempotency_key} } }, $_->{attempt} for grep { $_->{topic} eq 'late' } @{ received() };
is(join(' ', map { join(',', @{ $late_got{$_} // [] }) } @late), '1,2 2 2',
	'the first timed out and was retried; the others were published once, at their second lease');

# A nack names its relay: a relay whose lease ran out while it was stopped
# in the middle of a request (SIGSTOP), the message leased meanwhile by
# another relay for an hour, nacks it in vain when it goes on: the other
# relay's lease stands.
sql(q{SELECT idem_outbox_configure('stale', 5, '50 milliseconds', '100 milliseconds')});
my $stale = send_msg('stale', 's', { reply => ['503 sleep=0.9'] });
$r = start_relay({}, '--sink', 'webhook', '--webhook-url', "$url/stale", '--lease', '2s',
	'--timeout', '1s', '--poll', '100ms', '--log-interval', '0');
ok( wait_for('the request', sub { grep { $_->{idempotency_key} eq $stale } @{ received() } }),
	'the relay is publishing the message');
$r->{h}->signal('STOP');
ok( wait_for('the lease to run out', sub {
			sql(q{SELECT available_at < now() FROM idem.outbox_keys WHERE topic = 'stale'}) eq 't' }),
	'its lease ran out while it was stopped');
is(sql(q{SELECT string_agg(topic, ',') FROM idem_outbox_lease('B', 10, '1 hour')}), 'stale',
	'relay B leased the message for an hour');
$r->{h}->signal('CONT');
$r->{h}->signal('TERM');
is(stop_relay($r), 0, 'the stopped relay went on and stopped with exit code 0');
is(final_counts(slurp_file($r->{err})), 'leased 1, delivered 0, retried 1, dead 0, errors 0',
	'it nacked the message');
is( sql(q{SELECT leased_by, available_at > now() + interval '55 minutes'
	      FROM idem.outbox_keys WHERE topic = 'stale'}),
	'B|t', 'the late nack did not end the lease of relay B');
sql(q{DELETE FROM idem.outbox WHERE aggregatetype = 'stale'; DELETE FROM idem.outbox_keys WHERE topic = 'stale'});

########################################################################
# Runs (--per-key)
########################################################################

# Three keys of ten messages, leased in runs of up to 8: a run is published
# one message after the other and stops at a failure, whose nack releases
# the rest of the run.  a4 fails once (500), b7 is refused for good (400).
sql(q{SELECT idem_outbox_configure('runs', 5, '50 milliseconds', '100 milliseconds')});
my %runs;
sql(join(";\n", map {
		my ($k, $n) = @$_;
		my $reply = $k eq 'a' && $n == 4 ? q{, 'reply', jsonb_build_array('500 ra=0', '200')}
		  : $k eq 'b' && $n == 7 ? q{, 'reply', jsonb_build_array('400')} : '';
		"SELECT idem_outbox_send('runs', '$k', jsonb_build_object('n', $n$reply))"
	} map { my $n = $_; map { [ $_, $n ] } qw(a b c) } 1 .. 10));
%runs = map { my ($k, $n, $id) = split /\|/; ("$k$n" => $id) } split /\n/,
  sql(q{SELECT aggregateid || '|' || (payload->>'n') || '|' || id FROM idem.outbox
        WHERE aggregatetype = 'runs'});
my $rbefore = scalar @{ received() };
$r = start_relay({}, '--sink', 'webhook', '--webhook-url', "$url/runs", '--per-key', '8',
	'--batch', '30', '--poll', '100ms', '--log-interval', '0', '--verbose');
ok( wait_for('the runs', sub {
			sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'runs'}) == 4
			  && sql(q{SELECT dead FROM idem.outbox_keys WHERE topic = 'runs' AND key = 'b'}) eq 't' }),
	'a relay leasing runs delivers every key up to its refused message');
is(stop_relay($r, 'TERM'), 0, 'exit code 0');
$rerr = slurp_file($r->{err});
like(final_counts($rerr), qr/delivered 26, retried \d+, dead 1, errors 0/, '26 delivered, b7 dead');
# a4 retried once, with a5 to a8 left after it, and b8 left after b7: those
# left are leased again, and count as retried
{
	my ($l, $d, $rt, $dd) = final_counts($rerr) =~ /leased (\d+), delivered (\d+), retried (\d+), dead (\d+)/;
	is($rt, 6, 'retried: a4 and the five messages left after a failure');
	is($d + $rt + $dd, $l, 'the counts add up to the leases');
}
like($rerr, qr/starting as "relay-\d+": batch 30, per key 8,/, 'the relay says it leases runs');
like($rerr, qr/left \Q$runs{a5}\E \(topic runs, key a\): an earlier message of its key was not delivered/,
	'the messages of a run after a failure are left to the nack of the failure');
my $rall = received();
my @rgot = grep { $_->{topic} eq 'runs' } @$rall[ $rbefore .. $#$rall ];
my %rseq;
push @{ $rseq{ $_->{key} } }, "$_->{body}{n}/$_->{attempt}" for @rgot;
is(join(' ', @{ $rseq{a} }), '1/1 2/1 3/1 4/1 4/2 5/2 6/2 7/2 8/2 9/1 10/1',
	'key a in order: a4 again after its 500, then the rest of its run at their second lease, then a new run');
is(join(' ', @{ $rseq{b} }), '1/1 2/1 3/1 4/1 5/1 6/1 7/1',
	'key b in order, up to its refused message');
is(join(' ', @{ $rseq{c} }), join(' ', map { "$_/1" } 1 .. 10), 'key c in order, each message once');
is(sql(q{SELECT string_agg(payload->>'n', ',' ORDER BY seq) FROM idem.outbox WHERE aggregatetype = 'runs'}),
	'7,8,9,10', 'b7 dead holds back the rest of its key');

# README's configuration file as printed there, its connection and URLs
# made local: every topic to the webhook with its header, audit to
# standard output, "billing.v2" to a URL of its own.
my $readme = slurp_file("$FindBin::RealBin/../README.md");
my ($readme_conf) = $readme =~ m{^```ini\n(# /etc/idem-relay/shop\.conf\n.*?)^```}ms;
ok(defined $readme_conf, "README's configuration file is found");
$readme_conf //= '';
$readme_conf =~ s{^dbname = .*\n}{}m or fail('it has a dbname');
$readme_conf =~ s{https://hooks\.example\.com/outbox}{$url/outbox} or fail('it has the webhook URL');
$readme_conf =~ s{https://billing\.example\.com/events}{$url/events} or fail('it has the URL of billing.v2');
write_conf("$tmp/readme.conf", $readme_conf);
my %rm = (
	shop => send_msg('shop', 'k', { n => 1 }),
	audit => send_msg('audit', 'k', { n => 2 }),
	billing => send_msg('billing.v2', 'k', { n => 3 }));
($rc, $out, $err) = run_relay({}, '--config', "$tmp/readme.conf", '--once');
is($rc, 0, "README's configuration file works as written") or diag($err);
my ($rm_shop) = grep { $_->{idempotency_key} eq $rm{shop} } @{ received() };
my ($rm_billing) = grep { $_->{idempotency_key} eq $rm{billing} } @{ received() };
is( join(' ', map { $_ ? "$_->{path} $_->{authorization}" : 'none' } $rm_shop, $rm_billing),
	'/outbox Bearer 8f0c2e /events Bearer 8f0c2e',
	'its webhook URLs, the topic\'s over every topic\'s, each with its header');
like($out, qr/^\{"id": "\Q$rm{audit}\E", "topic": "audit"/m, 'and the audit topic on standard output');
# README's systemd unit does not restart a relay whose configuration is bad
my ($no_restart) = $readme =~ /^RestartPreventExitStatus=(\d+)$/m;
write_conf("$tmp/bad-readme.conf", "batch = none\n");
($rc, $out, $err) = run_relay({}, '--config', "$tmp/bad-readme.conf");
is($rc, $no_restart // 'none', "README's systemd unit prevents a restart on the exit code of a bad configuration");

# Runs of two topics routed to two URLs, with the same key names: a round
# of runs goes to each route its own messages, and each outcome comes back
# to its message (the keys' first messages alternate between the topics,
# so a batch does too).  r2a's p3 fails once (500): the rest of p's run is
# leased again after it, alone, at attempt 2; r2b's p and both q go on.
sql(q{SELECT idem_outbox_configure('r2a', 5, '50 milliseconds', '100 milliseconds')});
sql(join(";\n", map {
		my ($t, $k, $n) = @$_;
		my $reply = $t eq 'r2a' && $k eq 'p' && $n == 3 ? q{, 'reply', jsonb_build_array('500 ra=0', '200')} : '';
		"SELECT idem_outbox_send('$t', '$k', jsonb_build_object('n', $n$reply))"
	} map { my $n = $_; map { my $k = $_; map { [ $_, $k, $n ] } qw(r2a r2b) } qw(p q) } 1 .. 6));
write_conf("$tmp/routes.conf", <<"EOF");
sink = webhook
webhook.url = $url/r2a
topic.r2b.webhook.url = $url/r2b
per_key = 8
batch = 30
poll = 100ms
log_interval = 0
EOF
$rbefore = scalar @{ received() };
$r = start_relay({}, '--config', "$tmp/routes.conf");
ok( wait_for('the runs of two routes',
		sub { sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype IN ('r2a', 'r2b')}) == 0 }),
	'runs of two topic routes: every message delivered');
is(stop_relay($r, 'TERM'), 0, 'exit code 0');
{
	my ($l, $d, $rt, $dd) = final_counts(slurp_file($r->{err})) =~ /leased (\d+), delivered (\d+), retried (\d+), dead (\d+)/;
	is("$d $dd", '24 0', '24 delivered, none dead');
	is($d + $rt + $dd, $l, 'r2a p3 retried, with the messages left after it: the counts add up to the leases');
}
$rall = received();
my %r2;
push @{ $r2{"$_->{topic} $_->{key} $_->{path}"} }, "$_->{body}{n}/$_->{attempt}"
  for grep { $_->{topic} =~ /^r2[ab]$/ } @$rall[ $rbefore .. $#$rall ];
is_deeply(
	{ map { ($_ => join(' ', @{ $r2{$_} })) } keys %r2 },
	{
		'r2a p /r2a' => '1/1 2/1 3/1 3/2 4/2 5/2 6/2',
		'r2a q /r2a' => '1/1 2/1 3/1 4/1 5/1 6/1',
		'r2b p /r2b' => '1/1 2/1 3/1 4/1 5/1 6/1',
		'r2b q /r2b' => '1/1 2/1 3/1 4/1 5/1 6/1'
	},
	'each topic at its own URL, each key in order, the failed run again from its failure');

# A run cut by its lease: with --lease 4s --timeout 2s no message is started
# 2 s after the lease; the first round takes 2.4 s (x1 and y1 answer after
# 1.2 s each, one after the other), so the second messages are not started:
# released at once, and the rest of each run is left to that release.
sql(q{SELECT idem_outbox_configure('cut', 5, '50 milliseconds', '100 milliseconds')});
sql(join(";\n", map {
		my ($k, $n) = @$_;
		my $reply = $n == 1 ? q{, 'reply', jsonb_build_array('200 sleep=1.2')} : '';
		"SELECT idem_outbox_send('cut', '$k', jsonb_build_object('n', $n$reply))"
	} map { my $n = $_; map { [ $_, $n ] } qw(x y) } 1 .. 4));
$rbefore = scalar @{ received() };
$r = start_relay({}, '--sink', 'webhook', '--webhook-url', "$url/cut", '--per-key', '4',
	'--lease', '4s', '--timeout', '2s', '--poll', '100ms', '--log-interval', '0', '--verbose');
ok( wait_for('the cut runs', sub {
			sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'cut'}) == 0 }),
	'the runs cut by their lease are delivered in the end');
is(stop_relay($r, 'TERM'), 0, 'exit code 0');
$rerr = slurp_file($r->{err});
like($rerr, qr/WARNING:  2 of 8 messages were not published: less than the timeout \(2000 ms\) was left of their lease \(4000 ms\); they are released for another attempt after the topic's backoff/,
	'the second message of each run was not started: too little of the lease was left');
$rall = received();
%rseq = ();
push @{ $rseq{ $_->{key} } }, "$_->{body}{n}/$_->{attempt}"
  for grep { $_->{topic} eq 'cut' } @$rall[ $rbefore .. $#$rall ];
is(join(' ', map { "$_: " . join(' ', @{ $rseq{$_} // [] }) } qw(x y)),
	'x: 1/1 2/2 3/2 4/2 y: 1/1 2/2 3/2 4/2',
	'each run goes on after the cut at the second attempt, in order, each message published once');

# A webhook that never answers: the first messages of each lease time out
# and wait the topic's backoff (an hour), and so does the rest of the batch,
# never sent: released at once, each lease an attempt, it died of its
# attempts within seconds without being sent once.
sql(q{SELECT idem_outbox_configure('hung', 3, '1 hour', '1 hour')});
send_msg('hung', "h$_", { n => $_, reply => ['200 sleep=30'] }) for 1 .. 8;
$r = start_relay({}, '--sink', 'webhook', '--webhook-url', "$url/hung", '--batch', '10',
	'--lease', '3s', '--timeout', '1s', '--poll', '100ms', '--log-interval', '0');
ok( wait_for('two leases of the hanging topic', sub {
			sql(q{SELECT count(*) FROM idem.outbox_keys WHERE topic = 'hung' AND attempts > 0}) == 8 }),
	'every message of the hanging webhook was leased');
sleep 7;
is(stop_relay($r, 'TERM'), 0, 'exit code 0');
is(sql(q{SELECT count(*) FILTER (WHERE dead), max(attempts) FROM idem.outbox_keys WHERE topic = 'hung'}),
	'0|1', 'none is dead: each was leased once, and waits the topic\'s backoff, sent or not');
sql(q{DELETE FROM idem.outbox WHERE aggregatetype = 'hung'; DELETE FROM idem.outbox_keys WHERE topic = 'hung'});

########################################################################
# SIGKILL in the middle of a batch
########################################################################

# Three keys whose first messages are sent in transactions of their own, so
# that the first lease hands them out in that order; the first request of
# k3's first message does not get an answer before the relay is killed.
my @kill;
for my $k (qw(k1 k2 k3))
{
	push @kill, [ $k, 1, send_msg('kill', $k,
			{ n => 1, $k eq 'k3' ? (reply => [ '200 sleep=60', '200' ]) : () }) ];
}
for my $n (2 .. 4)
{
	push @kill, [ $_, $n, send_msg('kill', $_, { n => $n }) ] for qw(k1 k2 k3);
}
my $before = scalar @{ received() };
my @kill_args = ('--sink', 'webhook', '--webhook-url', "$url/kill", '--batch', '10',
	'--lease', '3s', '--timeout', '1500ms', '--poll', '100ms', '--log-interval', '0');
$r = start_relay({}, @kill_args);
ok( wait_for('the request that hangs', sub {
			grep { $_->{idempotency_key} eq $kill[2][2] } @{ received() } }),
	'the relay is in the middle of its batch');
$r->{h}->signal('KILL');
$r->{h}->finish;
is(($r->{h}->full_result(0) & 127), 9, 'the relay was killed by SIGKILL');
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'kill'}), 12,
	'nothing of the topic was acknowledged');

my $r2 = start_relay({}, @kill_args);
ok( wait_for('the second relay', sub {
			sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'kill'}) == 0 }),
	'a second relay delivers every message once the leases ran out');
is(stop_relay($r2, 'TERM'), 0, 'the second relay stops with exit code 0');

my $all = received();
my @kgot = grep { $_->{topic} eq 'kill' } @$all[ $before .. $#$all ];
my %kcount;
$kcount{ $_->{idempotency_key} }++ for @kgot;
is(scalar(grep { $kcount{ $_->[2] } } @kill), 12, 'no message lost');
is(join(',', map { $kcount{ $_->[2] } } @kill[ 0 .. 2 ]), '2,2,2',
	'the killed batch is delivered again: the two delivered but not acknowledged, and the one in flight');
is(scalar(grep { $kcount{ $_->[2] } == 1 } @kill[ 3 .. 11 ]), 9, 'the rest once');
my $ordered = 1;
for my $k (qw(k1 k2 k3))
{
	my @ns = map { $_->{body}{n} } grep { $_->{key} eq $k } @kgot;
	for my $i (1 .. $#ns) { $ordered = 0 if $ns[$i] < $ns[ $i - 1 ] }
}
ok($ordered, 'nothing out of order per key, redeliveries included');

########################################################################
# SIGTERM in the middle of a batch
########################################################################

# The first message of t1 is answered after a second: SIGTERM arrives
# while it is in flight; the relay finishes the batch (t1, t2, t3's first
# messages), acknowledges it and leases nothing more.
my @term;
for my $k (qw(t1 t2 t3))
{
	push @term, send_msg('term', $k, { n => 1, $k eq 't1' ? (reply => ['200 sleep=1']) : () });
}
send_msg('term', $_, { n => 2 }) for qw(t1 t2 t3);
$r = start_relay({}, '--sink', 'webhook', '--webhook-url', "$url/term", '--log-interval', '0');
ok( wait_for('the slow request', sub {
			grep { $_->{idempotency_key} eq $term[0] } @{ received() } }),
	'the relay is publishing the batch');
is(stop_relay($r, 'TERM'), 0, 'SIGTERM in the middle of a batch: exit code 0');
is(sql(q{SELECT string_agg(payload->>'n', ',' ORDER BY aggregateid) FROM idem.outbox WHERE aggregatetype = 'term'}),
	'2,2,2', 'the batch in hand was finished and acknowledged, nothing more leased');
is(sql(q{SELECT leased FROM idem_outbox_stats() WHERE topic = 'term'}), 0,
	'no lease left behind');
is(final_counts(slurp_file($r->{err})), 'leased 3, delivered 3, retried 0, dead 0, errors 0',
	'its final counts');

sql(q{DELETE FROM idem.outbox WHERE aggregatetype = 'term'; DELETE FROM idem.outbox_keys WHERE topic = 'term'});

# Two signals: the request in flight is abandoned and the rest released at
# once (not left to their lease, nor to the topic's backoff of an hour).
sql(q{SELECT idem_outbox_configure('term2', 10, '1 hour', '1 hour')});
my @term2;
for my $k (qw(u1 u2 u3))
{
	push @term2, send_msg('term2', $k, { n => 1, $k eq 'u1' ? (reply => ['200 sleep=60']) : () });
}
$r = start_relay({}, '--sink', 'webhook', '--webhook-url', "$url/term2", '--log-interval', '0');
ok( wait_for('the hanging request', sub {
			grep { $_->{idempotency_key} eq $term2[0] } @{ received() } }),
	'the relay is publishing the batch');
$r->{h}->signal('TERM');
usleep(100_000);
is(stop_relay($r, 'TERM'), 0, 'a second SIGTERM: exit code 0');
is( sql(q{SELECT count(*), count(*) FILTER (WHERE leased_by IS NULL AND available_at <= now())
	      FROM idem.outbox_keys WHERE topic = 'term2'}),
	'3|3', 'every message of the batch is released, available again at once');
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'term2'}), 3,
	'and none of them acknowledged');
is( sql(q{SELECT string_agg(last_error, ' / ' ORDER BY key) FROM idem.outbox_keys WHERE topic = 'term2'}),
	'webhook: interrupted by shutdown / not published: idem-relay was stopped / '
	  . 'not published: idem-relay was stopped',
	'the one in flight interrupted, the others not published');
# (left out of the next relays' leases: u1 would hang again)
sql(q{DELETE FROM idem.outbox WHERE aggregatetype = 'term2'; DELETE FROM idem.outbox_keys WHERE topic = 'term2'});

# The same with a large batch: the nack that releases it after the second
# signal is not itself cancelled (a statement is cancelled only when it
# still runs a second after the signal and after it was sent).
sql(q{SELECT idem_outbox_configure('term3', 10, '1 hour', '1 hour')});
my $hang3 = send_msg('term3', 'v0000', { n => 0, reply => ['200 sleep=60'] });
sql(q{SELECT count(idem_outbox_send('term3', 'v' || lpad(i::text, 4, '0'), jsonb_build_object('n', i)))
        FROM generate_series(1, 2999) i});
$r = start_relay({}, '--sink', 'webhook', '--webhook-url', "$url/term3", '--log-interval', '0',
	'--batch', '3000', '--lease', '10min', '--timeout', '60s');
ok( wait_for('the hanging request of the large batch', sub {
			grep { $_->{idempotency_key} eq $hang3 } @{ received() } }),
	'the relay is publishing a batch of 3,000');
$r->{h}->signal('TERM');
usleep(100_000);
is(stop_relay($r, 'TERM'), 0, 'a second SIGTERM: exit code 0');
is( sql(q{SELECT count(*), count(*) FILTER (WHERE leased_by IS NULL AND available_at <= now())
	      FROM idem.outbox_keys WHERE topic = 'term3'}),
	'3000|3000', 'every message of the large batch is released, available again at once');
is( sql(q{SELECT count(*) FILTER (WHERE attempts = 1 AND last_error = 'not published: idem-relay was stopped'),
	             count(*) FILTER (WHERE attempts = 1 AND last_error = 'webhook: interrupted by shutdown'
	                                AND key = 'v0000')
	      FROM idem.outbox_keys WHERE topic = 'term3'}),
	'2999|1', 'each leased once and released by the nacks, the one in flight interrupted');
unlike(slurp_file($r->{err}), qr/cancelled/, 'the nack that released them was not cancelled');
sql(q{DELETE FROM idem.outbox WHERE aggregatetype = 'term3'; DELETE FROM idem.outbox_keys WHERE topic = 'term3'});

# The same with runs: v1 is delivered and w1 hangs when the signals come.
# The nack of v2 (not published) and of w1 (interrupted) release their
# runs; the messages after them are neither acknowledged nor nacked, and
# follow them in order, at their second attempt.
sql(q{SELECT idem_outbox_configure('term4', 10, '1 hour', '1 hour')});
my %term4;
for my $n (1 .. 4)
{
	for my $k (qw(v w))
	{
		$term4{"$k$n"} = send_msg('term4', $k,
			{ n => $n, $k eq 'w' && $n == 1 ? (reply => [ '200 sleep=60', '200' ]) : () });
	}
}
my $tbefore = scalar @{ received() };
$r = start_relay({}, '--sink', 'webhook', '--webhook-url', "$url/term4", '--per-key', '4',
	'--log-interval', '0');
ok( wait_for('v1 delivered and w1 hanging', sub {
			my %got = map { $_->{idempotency_key} => 1 } @{ received() };
			$got{ $term4{v1} } && $got{ $term4{w1} } }),
	'a relay leasing runs delivered v1 and is publishing w1');
$r->{h}->signal('TERM');
usleep(100_000);
is(stop_relay($r, 'TERM'), 0, 'a second SIGTERM while runs are published: exit code 0');
is( sql(q{SELECT string_agg(aggregateid || (payload->>'n'), ',' ORDER BY aggregateid, seq)
	      FROM idem.outbox WHERE aggregatetype = 'term4'}),
	'v2,v3,v4,w1,w2,w3,w4', 'only v1 was acknowledged');
is( sql(q{SELECT string_agg(k.key || ':' || (SELECT o.aggregateid || (o.payload->>'n') FROM idem.outbox o
	                                        WHERE o.id = k.head_id)
	                        || ':' || (leased_by IS NULL) || ':' || (available_at <= now()) || ':' || last_error,
	                        ' / ' ORDER BY k.key)
	      FROM idem.outbox_keys k WHERE k.topic = 'term4'}),
	'v:v2:true:true:not published: idem-relay was stopped / w:w1:true:true:webhook: interrupted by shutdown',
	'each run released at once from its first message not delivered, with its error');
$r = start_relay({}, '--sink', 'webhook', '--webhook-url', "$url/term4", '--log-interval', '0');
ok( wait_for('the rest of the runs', sub {
			sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'term4'}) == 0 }),
	'another relay delivers the rest');
is(stop_relay($r, 'TERM'), 0, 'exit code 0');
my %tseq;
my $tall = received();
push @{ $tseq{ $_->{key} } }, "$_->{body}{n}/$_->{attempt}"
  for grep { $_->{topic} eq 'term4' } @$tall[ $tbefore .. $#$tall ];
is(join(' ', map { "$_: " . join(' ', @{ $tseq{$_} // [] }) } qw(v w)),
	'v: 1/1 2/2 3/2 4/2 w: 1/1 1/2 2/2 3/2 4/2',
	'each run goes on in order from the message the signals cut, at the second attempt');

# A lease that waits for a lock (ALTER EXTENSION idem UPDATE takes one on
# idem's tables): two signals cancel it, and the relay stops at once rather
# than when the lock goes.
my $locker = IPC::Run::start(
	[ 'psql', '-X', '-h', $node->host, '-p', $node->port, '-d', 'postgres', '-c',
		'BEGIN; LOCK TABLE idem.outbox_keys IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(600); COMMIT;' ],
	'>', "$tmp/locker.out", '2>', "$tmp/locker.err");
ok(wait_for('the lock', sub { sql(q{SELECT count(*) FROM pg_locks WHERE relation = 'idem.outbox_keys'::regclass
                                       AND mode = 'AccessExclusiveLock' AND granted}) == 1 }),
	'another session holds a lock on idem.outbox_keys');
$r = start_relay({}, '--log-interval', '0');
ok( wait_for('the relay waiting', sub { sql(q{SELECT count(*) FROM pg_stat_activity
                                                WHERE application_name = 'idem-relay' AND wait_event_type = 'Lock'}) == 1 }),
	'the relay\'s lease waits for it');
$r->{h}->signal('TERM');
usleep(100_000);
is(stop_relay($r, 'TERM'), 0, 'two signals while waiting for the lock: exit code 0');
ok($locker->pumpable, 'while the lock is still held');
like(slurp_file($r->{err}), qr/idem_outbox_lease cancelled: stopping/, 'the lease was cancelled');
sql(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'BEGIN; LOCK TABLE idem.outbox_keys%'});
$locker->finish;

# With --exit-on-error too, a connection lost in the middle of a statement
# (the backend of a lease that waits for a lock terminated) is not a failed
# statement: the relay connects again and goes on.
$locker = IPC::Run::start(
	[ 'psql', '-X', '-h', $node->host, '-p', $node->port, '-d', 'postgres', '-c',
		'BEGIN; LOCK TABLE idem.outbox_keys IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(600); COMMIT;' ],
	'>', "$tmp/locker.out", '2>', "$tmp/locker.err");
ok(wait_for('the lock', sub { sql(q{SELECT count(*) FROM pg_locks WHERE relation = 'idem.outbox_keys'::regclass
                                       AND mode = 'AccessExclusiveLock' AND granted}) == 1 }),
	'another session holds a lock on idem.outbox_keys');
$r = start_relay({}, '--exit-on-error', '--poll', '100ms', '--log-interval', '0');
ok( wait_for('the relay waiting', sub { sql(q{SELECT count(*) FROM pg_stat_activity
                                                WHERE application_name = 'idem-relay' AND wait_event_type = 'Lock'}) == 1 }),
	'the lease of a relay with --exit-on-error waits for it');
sql(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'idem-relay'});
ok(wait_for('the loss logged', sub { slurp_file($r->{err}) =~ /idem_outbox_lease failed/ }),
	'its backend terminated: the lease failed');
sql(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'BEGIN; LOCK TABLE idem.outbox_keys%'});
$locker->finish;
my $lost = send_msg('lost', 'k', { n => 1 });
ok( wait_for('the message or the exit', sub {
			!$r->{h}->pumpable || slurp_file($r->{out}) =~ /\Q$lost\E/ }),
	'the relay is done waiting');
like(slurp_file($r->{out}), qr/\Q$lost\E/, 'it connected again and delivered the next message');
is(stop_relay($r, 'TERM'), 0, 'it was still running: SIGTERM, exit code 0');

# A connection lost while the relay waits is logged on one line, although
# libpq's message has several.
$r = start_relay({}, '--log-interval', '0', '--poll', '10s');
ok( wait_for('the idle relay', sub { sql(q{SELECT count(*) FROM pg_stat_activity
                                             WHERE application_name = 'idem-relay' AND state = 'idle'
                                               AND state_change < now() - interval '1 second'}) == 1 }),
	'a relay waits, idle (not between its first statements)');
sql(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'idem-relay'});
ok(wait_for('the loss logged', sub { slurp_file($r->{err}) =~ /connection lost/ }), 'the relay logs the lost connection');
is(stop_relay($r, 'TERM'), 0, 'and stops on SIGTERM');
my @broken = grep { !/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC idem-relay\[\d+\] [A-Z]+:  \S/ }
  split /\n/, slurp_file($r->{err});
is(join(' | ', @broken), '', 'each line of its log is one message, libpq\'s included');

########################################################################
# SIGHUP: the configuration file read again
########################################################################

sub write_conf
{
	my ($file, $text) = @_;
	open(my $fh, '>', "$file.new") or die;
	print $fh $text;
	close($fh);
	rename("$file.new", $file) or die;
}

sub paths_of
{
	my ($id) = @_;
	return join(',', map { $_->{path} } grep { $_->{idempotency_key} eq $id } @{ received() });
}

my $hupconf = "$tmp/hup.conf";
write_conf($hupconf, "sink = webhook\nwebhook.url = $url/hup1\npoll = 100ms\nbatch = 5\n");
$r = start_relay({}, '--config', $hupconf, '--log-interval', '0');
my $hup1 = send_msg('hup', 'h', { n => 1 });
ok(wait_for('the first path', sub { paths_of($hup1) eq '/hup1' }), 'delivered to the URL of the file');

# a new URL, batch and poll interval: in force from the next lease
write_conf($hupconf, "sink = webhook\nwebhook.url = $url/hup2\npoll = 200ms\nbatch = 7\n");
$r->{h}->signal('HUP');
ok( wait_for('the reload', sub { slurp_file($r->{err}) =~ /configuration reloaded from \Q$hupconf\E/ }),
	'SIGHUP: the relay reads its configuration file again');
like(slurp_file($r->{err}), qr/configuration reloaded from \S+: batch 7, per key 1, max bytes 67108864, lease 30000 ms, poll 200 ms/,
	'and says what is in force');
my $hup2 = send_msg('hup', 'h', { n => 2 });
ok(wait_for('the second path', sub { paths_of($hup2) eq '/hup2' }), 'the next message goes to the new URL');

# a file with an error: the configuration in force is kept
my $before = length(slurp_file($r->{err}));
write_conf($hupconf, "sink = webhook\nwebhook.url = $url/hup3\nbatch = many\n");
$r->{h}->signal('HUP');
ok( wait_for('the refused reload', sub {
			substr(slurp_file($r->{err}), $before) =~ /configuration not reloaded, the one in force is kept: batch must be an integer/ }),
	'a configuration with an error is not applied, and the relay says why');
# a long value: the error is cut, not the file and line it ends with
$before = length(slurp_file($r->{err}));
write_conf($hupconf, "sink = webhook\nwebhook.url = ftp://" . ('x' x 1100) . "/\n");
$r->{h}->signal('HUP');
ok( wait_for('the refused reload', sub {
			substr(slurp_file($r->{err}), $before) =~ /configuration not reloaded, the one in force is kept: webhook\.url "ftp:/ }),
	'a sink setting refused at a reload');
like(substr(slurp_file($r->{err}), $before), qr/x \(webhook\.url: \S*hup\.conf:2\)$/m,
	'the reload error keeps the origin after a long value');
my $hup3 = send_msg('hup', 'h', { n => 3 });
ok(wait_for('the third message', sub { paths_of($hup3) eq '/hup2' }), 'the relay goes on with the one it had');
is(stop_relay($r, 'TERM'), 0, 'exit code 0 after the reloads');

# A reload that names the relay otherwise: the name it started with stays
# (its leases are in it).  Named by the file only, as a name on the command
# line would win over the file's anyway.
my $nameconf = "$tmp/name.conf";
write_conf($nameconf, "name = first\nsink = webhook\nwebhook.url = $url/name\npoll = 100ms\nlog_interval = 0\n");
$r = { out => "$tmp/name.out", err => "$tmp/name.err" };
$r->{h} = IPC::Run::start([ $relay, '--config', $nameconf ], '>', $r->{out}, '2>', $r->{err},
	init => relay_env());
my $name1 = send_msg('named', 'n', { n => 1 });
ok(wait_for('the first message', sub { paths_of($name1) eq '/name' }), 'a relay named by its file');
write_conf($nameconf, "name = second\nsink = webhook\nwebhook.url = $url/name\npoll = 100ms\nlog_interval = 0\n");
$r->{h}->signal('HUP');
ok(wait_for('the reload', sub { slurp_file($r->{err}) =~ /configuration reloaded/ }), 'reloaded with another name');
ok( wait_for('the warning', sub { slurp_file($r->{err}) =~ /the name cannot change while the relay runs: still "first"/ }),
	'the relay says it keeps its name');
my $name2 = send_msg('named', 'n', { n => 2 });
ok(wait_for('the second message', sub { paths_of($name2) eq '/name' }), 'the next message is delivered');
is(sql(q{SELECT leased_by FROM idem.outbox_keys WHERE topic = 'named'}), 'first',
	'leased in the name the relay started with');
is(stop_relay($r, 'TERM'), 0, 'exit code 0');

# The command line still wins over the file read again: its webhook URL
# stays, the file's batch is taken.
my $cliconf = "$tmp/cli.conf";
write_conf($cliconf, "sink = webhook\nwebhook.url = $url/file\npoll = 100ms\nbatch = 5\n");
$r = start_relay({}, '--config', $cliconf, '--sink', 'webhook', '--webhook-url', "$url/cli",
	'--log-interval', '0');
ok(wait_for('the start', sub { slurp_file($r->{err}) =~ /starting as/ }), 'a relay with a URL on its command line');
write_conf($cliconf, "sink = webhook\nwebhook.url = $url/file\npoll = 100ms\nbatch = 7\n");
$r->{h}->signal('HUP');
ok( wait_for('the reload', sub { slurp_file($r->{err}) =~ /configuration reloaded from \S+: batch 7,/ }),
	'SIGHUP: the file\'s new batch is in force');
my $cli1 = send_msg('cli', 'c', { n => 1 });
ok(wait_for('the message', sub { paths_of($cli1) ne '' }), 'the next message is delivered');
is(paths_of($cli1), '/cli', 'to the command line\'s URL, not the file\'s');
is(stop_relay($r, 'TERM'), 0, 'exit code 0');

# A reload whose dbname libpq cannot parse, that sets a sink no topic goes
# to, or a sink's setting that cannot work, is refused like any other error:
# the connection and the sink in force stay.
my $dbconf = "$tmp/db.conf";
write_conf($dbconf, "poll = 100ms\nlog_interval = 0\n");
$r = start_relay({}, '--config', $dbconf);
send_msg('dbhup', 'k', { n => 1 });
ok(wait_for('the first line', sub { slurp_file($r->{out}) =~ /"dbhup"/ }), 'a relay with the environment\'s connection');
for my $case ([ "dbname = host=$pgenv{PGHOST} port=$pgenv{PGPORT} connect_timeot=3\n",
		qr/dbname is not valid: invalid connection option "connect_timeot" \(\S*db\.conf:1\)/ ],
	[ "webhook.url = http://127.0.0.1:9/\n", qr/webhook\.url is set, but no topic's sink is webhook/ ],
	# a sink's setting that cannot work, as at start
	[ "sink = webhook\nwebhook.url = http://127.0.0.1:9/\nwebhook.header.X-A = a\x01b\n",
		qr/webhook\.header\.X-A: the value holds a control character \(byte 0x01\).* \(webhook\.header\.X-A: \S*db\.conf:3\)/ ],
	[ "sink = kafka\nkafka.property.test.mock.num.brokers = 1\nkafka.property.message.timeout.ms = 0\n",
		qr/kafka\.property\.message\.timeout\.ms must be from 1 to timeout \(10000 ms, default\), not "0": .* \(kafka\.property\.message\.timeout\.ms: \S*db\.conf:3\)/ ])
{
	my ($text, $why) = @$case;
	my $at = length(slurp_file($r->{err}));
	write_conf($dbconf, $text . "poll = 100ms\nlog_interval = 0\n");
	$r->{h}->signal('HUP');
	ok( wait_for('the reload', sub { substr(slurp_file($r->{err}), $at) =~ /configuration (not )?reloaded/ }),
		'SIGHUP read the file');
	like(substr(slurp_file($r->{err}), $at), qr/configuration not reloaded, the one in force is kept: $why/,
		'the file is refused, and the relay says why');
}
send_msg('dbhup', 'k', { n => 2 });
if (slurp_file($r->{err}) =~ /configuration reloaded/)
{
	fail('the relay still delivers after the refused reloads');
}
else
{
	ok(wait_for('the second line', sub { scalar(() = slurp_file($r->{out}) =~ /"dbhup"/g) == 2 }),
		'the relay still delivers after the refused reloads');
}
is(stop_relay($r, 'TERM'), 0, 'exit code 0');

########################################################################
# A broker that is down: nothing leased, no attempt spent
########################################################################

# A port nothing listens on: the rabbitmq sink cannot connect.  The topic
# allows two attempts; a relay that leased while its broker is down would
# make the messages dead within a few of its reconnection attempts.
my $sock = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 1) or die;
my $closed_port = $sock->sockport;
close($sock);
sql(q{SELECT idem_outbox_configure('down', 2, '10 milliseconds', '10 milliseconds')});
send_msg('down', "d$_", { n => $_ }) for 1 .. 3;
$r = start_relay({}, '--sink', 'rabbitmq', '--set', "rabbitmq.url=amqp://127.0.0.1:$closed_port",
	'--reconnect-max', '100ms', '--poll', '50ms', '--log-interval', '0');
ok( wait_for('six failed connections', sub {
			my @n = (slurp_file($r->{err}) =~ /rabbitmq: could not connect/g);
			return @n >= 6; }),
	'the rabbitmq sink cannot reach its broker, and tries again and again');
like(slurp_file($r->{err}), qr/sink rabbitmq is down: leasing nothing until it is back/,
	'the relay says it leases nothing meanwhile');
is( sql(q{SELECT count(*), count(*) FILTER (WHERE attempts = 0 AND NOT dead AND leased_by IS NULL)
	      FROM idem.outbox_keys WHERE topic = 'down'}),
	'3|3', 'no message leased: none has spent an attempt, none is dead');
is(stop_relay($r, 'TERM'), 0, 'SIGTERM while the sink is down: exit code 0');
($rc, $out, $err) = run_relay({}, '--sink', 'rabbitmq', '--set', "rabbitmq.url=amqp://127.0.0.1:$closed_port",
	'--once', '--log-interval', '0');
is($rc, 4, '--once with the sink down: exit code 4');
like($err, qr/sink rabbitmq is down: exiting \(--once\)/, 'and says why');
is(sql(q{SELECT count(*) FROM idem.outbox_keys WHERE topic = 'down' AND attempts = 0}), 3,
	'nothing leased either');

# A reload that leaves out the sink that was down: the relay forgets it (it
# kept its place in the old list of sinks, past the end of the new one)
my $downconf = "$tmp/down.conf";
write_conf($downconf, "sink = stdout\ntopic.a.sink = stdout\ntopic.b.sink = stdout\n"
	  . "topic.down.sink = rabbitmq\nrabbitmq.url = amqp://127.0.0.1:$closed_port\n"
	  . "reconnect_max = 100ms\npoll = 50ms\nlog_interval = 0\n");
# (started without a name, unlike start_relay's relays)
$r = { out => "$tmp/down.out", err => "$tmp/down.err" };
$r->{h} = IPC::Run::start([ $relay, '--config', $downconf ], '>', $r->{out}, '2>', $r->{err},
	init => relay_env());
ok(wait_for('the sink down', sub { slurp_file($r->{err}) =~ /sink rabbitmq of topic down is down/ }),
	'a relay with a sink down');
write_conf($downconf, "sink = stdout\npoll = 50ms\nlog_interval = 0\n");
$r->{h}->signal('HUP');
ok(wait_for('the reload', sub { slurp_file($r->{err}) =~ /configuration reloaded/ }), 'reloaded without it');
ok(wait_for('the messages', sub { scalar(() = slurp_file($r->{out}) =~ /"topic": "down"/g) == 3 }),
	'the messages of that topic go to standard output now');
unlike(slurp_file($r->{err}), qr/is back: leasing again/, 'no sink of the old list is said to be back');
unlike(slurp_file($r->{err}), qr/the name cannot change/,
	'a reload of a file that names no relay does not warn of a new name');
is(stop_relay($r, 'TERM'), 0, 'exit code 0');

# Started with standard output (and input) closed: nothing is delivered, or
# acknowledged (the relay's own pipe took descriptor 1, and read the lines)
send_msg('closed', 'c', { n => $_ }) for 1 .. 2;
{
	my ($cout, $cerr) = ('', '');
	IPC::Run::run([ 'sh', '-c', 'exec "$0" --once --log-interval 0 <&- >&-', $relay ],
		'2>', \$cerr, init => relay_env(),
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	is($? >> 8, 4, 'a relay started with standard output closed stops with exit code 4');
	like($cerr, qr/could not write to standard output/, 'and says why');
}
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'closed'}), 2, 'no message was acknowledged');
sql(q{SELECT idem_outbox_ack(array_agg(id)) FROM idem.outbox WHERE aggregatetype = 'closed'});
($rc, $out, $err) = run_relay({}, '--once', '--log-interval', '0');

# A file whose last line was cut short (a relay stopped in the middle of it,
# a full disk): the next relay appending to it ends that line first, so that
# its own first line is whole; a file that ends in a newline gets no blank line.
for my $case ([ 'cut', qq({"id": "cut sh) ], [ 'whole', qq({"id": "whole"}\n) ])
{
	my ($name, $start) = @$case;
	my $file = "$tmp/$name.out";
	my $cerr = '';
	open(my $fh, '>', $file) or die;
	print $fh $start;
	close($fh);
	send_msg("append_$name", 'k', { n => 1 });
	IPC::Run::run([ $relay, '--once', '--log-interval', '0' ], '>>', $file, '2>', \$cerr,
		init => relay_env(), IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	my @lines = split /\n/, slurp_file($file), -1;
	is(scalar(@lines), 3, "$name: the line before, the relay's line, nothing after its newline");
	is($lines[0] . ($name eq 'whole' ? "\n" : ''), $start, "$name: the line before is left as it was");
	my $line = eval { $jtext->decode($lines[1]) };
	is($line && $line->{topic}, "append_$name", "$name: the relay's line stands alone");
}

# Two topics to standard output, each its own route: the cut line is ended
# once, not once by each route.
{
	my $file = "$tmp/two.out";
	my $cerr = '';
	open(my $fh, '>', $file) or die;
	print $fh '{"cut';
	close($fh);
	send_msg('two1', 'k', { n => 1 });
	send_msg('two2', 'k', { n => 2 });
	IPC::Run::run([ $relay, '--once', '--log-interval', '0', '--set', 'topic.two2.sink=stdout' ],
		'>>', $file, '2>', \$cerr, init => relay_env(),
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	my @lines = split /\n/, slurp_file($file), -1;
	is(scalar(@lines), 4, 'two routes: the line before, two lines, nothing after the last newline')
	  or diag(slurp_file($file));
	is(join(',', sort map { my $l = eval { $jtext->decode($_) }; $l ? $l->{topic} : "<$_>" } @lines[ 1 .. 2 ]),
		'two1,two2', 'each route\'s line stands alone, with no empty line between them');
}

# A reader that stops reading: the relay gives the line up after its
# timeout, releases the rest of its batch and stops with exit code 4 (a sink
# that cannot go on)
sql(q{SELECT idem_outbox_send('slow', 'k' || i, jsonb_build_object('pad', repeat('x', 2000))) FROM generate_series(1, 100) i});
{
	my $slow_err = "$tmp/slow.err";
	# the reader: a FIFO opened for reading and never read, until the relay
	# has exited
	my $h = IPC::Run::start([ 'bash', '-c',
			'mkfifo "$1/slow.fifo" || exit 9; ( exec 3<"$1/slow.fifo"; exec sleep 600 ) & '
			  . '"$0" --name slow --lease 4s --timeout 1s --log-interval 0 >"$1/slow.fifo"; rc=$?; '
			  . 'kill $!; exit $rc', $relay, $tmp ],
		'2>', $slow_err, init => relay_env());
	ok(wait_for('the stuck write', sub { slurp_file($slow_err) =~ /could not write to standard output: the reader took nothing/ }),
		'a line that the reader does not take within the timeout is given up');
	$h->finish;
	is($h->result(0), 4, 'the relay stops with exit code 4');
}
is( sql(q{SELECT count(*) > 0, count(*) FILTER (WHERE k.leased_by IS NOT NULL OR k.available_at > now())
	        FROM idem.outbox o JOIN idem.outbox_keys k ON k.topic = o.aggregatetype AND k.key = o.aggregateid
	       WHERE o.aggregatetype = 'slow'}),
	't|0', 'what the reader did not take is not acknowledged, and is available again at once');
($rc, $out, $err) = run_relay({}, '--once', '--log-interval', '0');

# A reader that went away: the write fails (SIGPIPE is ignored, not the
# death of the relay), the relay stops with exit code 4, and the message is
# released.
send_msg('gone', 'k', { n => 1 });
{
	my $gerr = '';
	pipe(my $rd, my $wr) or die;
	close($rd);
	my $env = relay_env();
	# (with SIGPIPE's default action, whatever the test's is)
	IPC::Run::run([ $relay, '--once', '--log-interval', '0' ], '>', $wr, '2>', \$gerr,
		init => sub { $SIG{PIPE} = 'DEFAULT'; $env->() },
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	close($wr);
	is($? & 127, 0, 'a relay whose reader went away is not killed by SIGPIPE');
	is($? >> 8, 4, 'it stops with exit code 4');
	like($gerr, qr/could not write to standard output: Broken pipe/, 'and says why');
}
is( sql(q{SELECT count(*), count(*) FILTER (WHERE k.leased_by IS NULL AND k.available_at <= now())
	        FROM idem.outbox o JOIN idem.outbox_keys k ON k.topic = o.aggregatetype AND k.key = o.aggregateid
	       WHERE o.aggregatetype = 'gone'}),
	'1|1', 'the message is not acknowledged, and is available again at once');
($rc, $out, $err) = run_relay({}, '--once', '--log-interval', '0');

# Standard output a regular file: synced (fdatasync) before the ack; a sync
# that fails stops the relay with exit code 4, the message released.
# test/relay/fdatasync_shim.c, built here, logs each fdatasync and fails it
# when asked.
my $shim = "$tmp/fdatasync_shim.so";
my ($ccout, $ccerr) = ('', '');
ok( IPC::Run::run([ 'cc', '-Wall', '-shared', '-fPIC', '-o', $shim,
			"$FindBin::RealBin/../test/relay/fdatasync_shim.c" ], '>', \$ccout, '2>', \$ccerr),
	'the fdatasync shim builds') or diag($ccerr);
for my $fail (0, 1)
{
	my $tag = $fail ? 'a sync that fails' : 'a sync';
	my $synclog = "$tmp/sync$fail.log";
	my $serr = '';
	send_msg("synced$fail", 'k', { n => 1 });
	IPC::Run::run([ $relay, '--once', '--log-interval', '0' ], '>', "$tmp/synced$fail.out", '2>', \$serr,
		init => relay_env(LD_PRELOAD => $shim, IDEM_SHIM_SYNC_LOG => $synclog,
			IDEM_SHIM_SYNC_FAIL => $fail ? '1' : undef,
			# a relay built with ASan (scripts/sanitize.sh) refuses a
			# preloaded library ahead of its runtime
			ASAN_OPTIONS => defined $ENV{ASAN_OPTIONS}
			? "$ENV{ASAN_OPTIONS}:verify_asan_link_order=0" : undef),
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	like(slurp_file("$tmp/synced$fail.out"), qr/"topic": "synced$fail"/, "$tag: the line is written");
	like(-e $synclog ? slurp_file($synclog) : '', qr/^fdatasync 1$/m, "$tag: standard output is synced");
	if ($fail)
	{
		is($? >> 8, 4, "$tag: exit code 4");
		like($serr, qr/could not sync standard output: Input\/output error/, "$tag: the relay says why");
		is( sql(q{SELECT count(*), count(*) FILTER (WHERE k.leased_by IS NULL AND k.available_at <= now())
			        FROM idem.outbox o JOIN idem.outbox_keys k ON k.topic = o.aggregatetype AND k.key = o.aggregateid
			       WHERE o.aggregatetype = 'synced1'}),
			'1|1', "$tag: the message is not acknowledged, and is available again at once");
	}
	else
	{
		is($? >> 8, 0, "$tag: exit code 0") or diag($serr);
		is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'synced0'}), 0,
			"$tag: the message is acknowledged");
	}
}
($rc, $out, $err) = run_relay({}, '--once', '--log-interval', '0');

# A name longer than idem_outbox_lease takes is a configuration error
($rc, $out, $err) = run_relay({}, '--once', '--name', 'n' x 256);
is($rc, 1, 'a name over 255 bytes: exit code 1');
like($err, qr/name must be at most 255 bytes long/, 'and says why');

$receiver->kill_kill;
$node->stop;
done_testing();
