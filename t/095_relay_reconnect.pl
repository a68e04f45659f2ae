
# Copyright (c) idem contributors
#
# idem-relay and its connections, without --exit-on-error (see "Running the
# relay" in README.md):
#
# - a lost database connection: the backend of an idle relay terminated,
#   then the server stopped for more failed connections than
#   --connect-attempts, and started again; the relay connects again, LISTENs
#   again (its poll interval is an hour) and delivers what is sent after,
#   each message once; its errors count each failed connection;
# - a connection lost in the middle of a batch (its ack fails): the ack is
#   sent again on the new connection, and the message is not published
#   again; when no connection could be made before less than the timeout
#   was left of the lease, the message comes again once the lease ran out,
#   with the same id, and the key's next message only after it; the failed
#   ack counts nothing delivered; an ack sent again and cut again is sent
#   once more on the next connection; a nack lost after its batch's ack went
#   through is sent again past that deadline too; a relay asked to stop
#   connects once more on its way out to send a cut ack; a cut ack is not
#   sent to the database of a reload that changed the dbname;
# - settings of the relay's role (SERIALIZABLE by default, array_nulls off, a short
#   idle_session_timeout) break neither its nacks nor its idle connection;
# - SIGHUP with a new dbname connects to that database and delivers from
#   there, and back to the environment's database; a reload that keeps the
#   dbname keeps the connection;
# - the line of counts every log_interval: the counts of its interval only
#   (the lines add up to the final line), the last error of the interval;
# - a sink that had to connect again in the middle of a batch (nats): no
#   message is started once less than the timeout is left of its lease, also
#   when the connection took that time; such a message is released and comes
#   at its next lease.  The NATS server is this script, which decides when
#   each of its answers is sent;
# - a server that accepts the connection and never answers: the relay's
#   default connect_timeout (10 s) ends the attempt.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IO::Select;
use IO::Socket::INET;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);
use IdemTest;

my $bindir = `pg_config --bindir`;
chomp $bindir;
my $relay = "$bindir/idem-relay";
my $node = idem_node('relay_reconnect');
my $tmp = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->utf8->canonical;

# The relay's role, with the three grants of the README, in two databases.
my $grants = q{
	GRANT EXECUTE ON FUNCTION idem_outbox_lease(text, int, interval, int, bigint), idem_outbox_ack(uuid[]),
	                          idem_outbox_nack(uuid, text, interval, text, boolean) TO relay;};
$node->safe_psql('postgres', "CREATE ROLE relay LOGIN; $grants CREATE DATABASE other;");
$node->safe_psql('other', "CREATE EXTENSION idem; $grants");

my %pgenv = (
	PGHOST => $node->host,
	PGPORT => $node->port,
	PGDATABASE => 'postgres',
	PGUSER => 'relay');

# Whatever this test started goes away with it, also when it dies.
my @started;
END
{
	# (kill_kill sets $?, which would become the script's exit code)
	local $?;
	for my $h (@started)
	{
		$h->kill_kill if $h->pumpable;
	}
}

my $nrelays = 0;
sub start_relay
{
	my (@args) = @_;
	my $n = ++$nrelays;
	my %r = (out => "$tmp/relay$n.out", err => "$tmp/relay$n.err");
	$r{h} = IPC::Run::start([ $relay, '--name', "relay-$n", @args ],
		'>', $r{out}, '2>', $r{err},
		init => sub {
			delete $ENV{$_} for grep { /^PG/ } keys %ENV;
			$ENV{$_} = $pgenv{$_} for keys %pgenv;
		});
	push @started, $r{h};
	return \%r;
}

sub stop_relay
{
	my ($r, @signals) = @_;
	$r->{h}->signal($_) for @signals;
	$r->{h}->finish;
	# the exit code, or the signal that ended the relay (result() would be 0)
	my $status = $r->{h}->full_result(0);
	return ($status & 127) ? 'signal ' . ($status & 127) : $status >> 8;
}

sub file { return -e $_[0] ? slurp_file($_[0]) : ''; }

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

sub sql { return $node->safe_psql($_[1] // 'postgres', $_[0]); }

# Sends a message (in database $db, postgres by default); its id.
sub send_msg
{
	my ($topic, $key, $payload, $db) = @_;
	my $p = $json->encode($payload);
	$p =~ s/'/''/g;
	return sql("SELECT idem_outbox_send('$topic', '$key', '$p'::jsonb)", $db);
}

sub final_counts
{
	my ($err) = @_;
	return $err =~ /stopped: (leased \d+, delivered \d+, retried \d+, dead \d+, errors \d+) in all/
	  ? $1 : "(no final line in: $err)";
}

# The ids of the messages a stdout relay wrote (of topic $topic, or all),
# each as often as written.
sub ids_out
{
	my ($r, $topic) = @_;
	return map { $_->{id} } grep { !defined $topic || $_->{topic} eq $topic }
	  map { $json->decode($_) } split /\n/, file($r->{out});
}

sub delivered
{
	my ($r, $id) = @_;
	return grep { $_ eq $id } ids_out($r);
}

# The backends of relays that wait for a notification (LISTEN: between
# statements, holding the idle lock), as "pid@database" lines.
sub idle_relays
{
	return sql(q{SELECT a.pid || '@' || a.datname FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND l.objsubid = 3 AND l.mode = 'RowExclusiveLock'
		  AND a.application_name = 'idem-relay' AND a.state = 'idle' ORDER BY 1});
}

# The backends of relays, idle or not.
sub relay_backends
{
	return sql(q{SELECT a.pid || '@' || a.datname FROM pg_stat_activity a
		WHERE a.application_name = 'idem-relay' ORDER BY 1});
}

sub write_conf
{
	my ($file, $text) = @_;
	open(my $fh, '>', "$file.new") or die;
	print $fh $text;
	close($fh);
	rename("$file.new", $file) or die;
}

########################################################################
# A lost connection: the relay connects again, and goes on
########################################################################

# An hour's poll: what is sent after the loss is found only by the
# notification, which a relay that did not LISTEN again would miss.
my $r = start_relay('--poll', '1h', '--reconnect-max', '200ms', '--log-interval', '0');
ok(wait_for('the idle relay', sub { idle_relays() =~ /^\d+\@postgres$/ }), 'the relay waits, idle');
my ($pid1) = idle_relays() =~ /^(\d+)/;
my @lost = (send_msg('lost', 'k', { n => 1 }));
ok(wait_for('the first message', sub { delivered($r, $lost[0]) }), 'a message is delivered');
# waiting again, not in a statement (whose failure is another path)
ok(wait_for('the idle relay', sub { idle_relays() eq "$pid1\@postgres" }), 'the relay waits again');

sql("SELECT pg_terminate_backend($pid1)");
ok( wait_for('a new connection', sub { idle_relays() =~ /^(\d+)\@postgres$/ && $1 != $pid1 }),
	'its backend terminated: the relay connects again, and waits idle');
like(file($r->{err}), qr/WARNING:  connection lost: /, 'it logged the lost connection');
push @lost, send_msg('lost', 'k', { n => 2 });
ok(wait_for('the message sent after the loss', sub { delivered($r, $lost[1]) }),
	'a message sent after the loss is delivered: the relay listens again');

# The server stopped: more failed connections than --connect-attempts (5)
# do not end a relay without --exit-on-error.
ok(wait_for('the idle relay', sub { idle_relays() =~ /^\d+\@postgres$/ }), 'the relay waits, idle again');
my ($pid2) = idle_relays() =~ /^(\d+)/;
my $offset = length(file($r->{err}));
$node->stop;
ok( wait_for('six failed connections', sub {
			my @n = (substr(file($r->{err}), $offset) =~ /ERROR:  could not connect: /g);
			return @n >= 6 || !$r->{h}->pumpable; }),
	'the server is down: the relay tries to connect again and again');
ok($r->{h}->pumpable, 'and does not exit after --connect-attempts failures');
$node->start;
ok( wait_for('the relay back', sub { idle_relays() =~ /^(\d+)\@postgres$/ && $1 != $pid2 }),
	'the server started again: the relay connects, and waits idle');
push @lost, send_msg('lost', 'k', { n => 3 });
ok(wait_for('the message sent after the restart', sub { delivered($r, $lost[2]) }),
	'a message sent after the restart is delivered');
is(sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'lost'}), 0, 'every message acknowledged');
is(stop_relay($r, 'TERM'), 0, 'SIGTERM: exit code 0');
is(join(' ', ids_out($r)), join(' ', @lost), 'each message delivered once, in order');
my $rerr = file($r->{err});
is((() = $rerr =~ /connected to database "postgres" as "relay"/g), 3, 'three connections made');
my $nerrors = () = $rerr =~ /WARNING:  connection lost: |ERROR:  could not connect: |ERROR:  \S+ failed: /g;
is(final_counts($rerr), "leased 3, delivered 3, retried 0, dead 0, errors $nerrors",
	'the final counts: every lost and failed connection is an error');

########################################################################
# A connection lost in the middle of a batch
########################################################################

my $hooklog = "$tmp/hooks.jsonl";
my $receiver = IPC::Run::start(
	[ 'python3', "$FindBin::RealBin/../test/relay/receiver.py", "$tmp/port", $hooklog ],
	'>', "$tmp/receiver.out", '2>', "$tmp/receiver.err");
push @started, $receiver;
ok(wait_for('the receiver', sub { -s "$tmp/port" }), 'the HTTP receiver listens')
  or diag(file("$tmp/receiver.err"));
my $url = 'http://127.0.0.1:' . slurp_file("$tmp/port");

sub received
{
	# whole lines only: the receiver may be writing the last one
	(my $text = file($hooklog)) =~ s/[^\n]*\z//;
	return [ map { $json->decode($_) } split /\n/, $text ];
}

# The first request is answered after 3 s: the relay's backend is
# terminated meanwhile, and the ack that follows fails.
my @mid = (send_msg('mid', 'k', { n => 1, reply => [ '200 sleep=3', '200' ] }),
	send_msg('mid', 'k', { n => 2 }));
$r = start_relay('--sink', 'webhook', '--webhook-url', "$url/mid", '--lease', '20s', '--timeout', '8s',
	'--poll', '100ms', '--reconnect-max', '200ms', '--log-interval', '0');
ok( wait_for('the first request', sub { grep { $_->{idempotency_key} eq $mid[0] } @{ received() } }),
	'the relay is publishing the first message');
sql(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'idem-relay'});
ok( wait_for('the key delivered', sub {
			sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'mid'}) == 0 }),
	'its backend terminated in the middle of the batch: the relay delivers the key in the end');
is(stop_relay($r, 'TERM'), 0, 'SIGTERM: exit code 0');
$rerr = file($r->{err});
like($rerr, qr/ERROR:  idem_outbox_ack failed: /, 'the ack failed');
like($rerr, qr/acknowledged on the new connection: 1 messages delivered before the last was lost/,
	'and was sent again on the new connection');
is(final_counts($rerr), 'leased 2, delivered 2, retried 0, dead 0, errors 1',
	'the message whose ack failed is counted delivered once, when acknowledged');
is( join(' ', map { "$_->{body}{n}/$_->{attempt}" . ($_->{idempotency_key} eq $mid[ $_->{body}{n} - 1 ] ? '' : '?') }
		  grep { $_->{path} eq '/mid' } @{ received() }),
	'1/1 2/1',
	'the message published and acknowledged on the new connection is not published again; the next one after it');

# The ack sent again is cut too: the relay tries once more on the next
# connection.  Another session holds a write of the key's row, for which
# the ack sent again waits, while the relay's backend is terminated a
# second time.
my @twice = (send_msg('twice', 'k', { n => 1, reply => [ '200 sleep=3', '200' ] }),
	send_msg('twice', 'k', { n => 2 }));
$r = start_relay('--sink', 'webhook', '--webhook-url', "$url/twice", '--lease', '30s', '--timeout', '8s',
	'--poll', '100ms', '--reconnect-max', '200ms', '--log-interval', '0');
ok( wait_for('the first request', sub { grep { $_->{idempotency_key} eq $twice[0] } @{ received() } }),
	'the relay is publishing the first message');
my $holder = IPC::Run::start(
	[ 'psql', '-X', '-h', $node->host, '-p', $node->port, '-d', 'postgres', '-c',
		q{BEGIN; UPDATE idem.outbox_keys SET last_error = last_error WHERE topic = 'twice' AND key = 'k';
		  SELECT pg_sleep(600); COMMIT;} ],
	'>', "$tmp/holder.out", '2>', "$tmp/holder.err");
push @started, $holder;
ok( wait_for('the key row held', sub { sql(q{SELECT count(*) FROM pg_stat_activity
                                           WHERE query LIKE 'BEGIN; UPDATE idem.outbox_keys%' AND state = 'active'}) == 1 }),
	'another session holds a write of the key\'s row');
sql(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'idem-relay'});
ok( wait_for('the ack sent again, waiting', sub { sql(q{SELECT count(*) FROM pg_stat_activity
                                                      WHERE application_name = 'idem-relay' AND wait_event_type = 'Lock'}) == 1 }),
	'its backend terminated: the ack, sent again on a new connection, waits for the write');
sql(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'idem-relay'});
ok( wait_for('the ack sent a third time, waiting', sub {
			(() = file($r->{err}) =~ /ERROR:  idem_outbox_ack failed: /g) == 2 &&
			sql(q{SELECT count(*) FROM pg_stat_activity
                   WHERE application_name = 'idem-relay' AND wait_event_type = 'Lock'}) == 1 }),
	'terminated again: the ack is sent once more on the next connection');
sql(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'BEGIN; UPDATE idem.outbox_keys%'});
$holder->finish;
ok( wait_for('the key delivered', sub {
			sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'twice'}) == 0 }),
	'the write ended: the relay delivers the key');
is(stop_relay($r, 'TERM'), 0, 'SIGTERM: exit code 0');
$rerr = file($r->{err});
is((() = $rerr =~ /acknowledged on the new connection: 1 messages delivered before the last was lost/g), 1,
	'the ack went through once, on the third connection');
is(final_counts($rerr), 'leased 2, delivered 2, retried 0, dead 0, errors 2',
	'each lost ack is an error; the message is counted delivered once');
is( join(' ', map { "$_->{body}{n}/$_->{attempt}" . ($_->{idempotency_key} eq $twice[ $_->{body}{n} - 1 ] ? '' : '?') }
		  grep { $_->{path} eq '/twice' } @{ received() }),
	'1/1 2/1',
	'the message is not published again; the next one after it');

# The same, but no connection can be made until less than the timeout is
# left of the lease: the ack is not sent again (another relay may lease the
# message by then), and the message comes again once its lease ran out.
my @late = (send_msg('late', 'k', { n => 1, reply => [ '200 sleep=3', '200' ] }),
	send_msg('late', 'k', { n => 2 }));
$r = start_relay('--sink', 'webhook', '--webhook-url', "$url/late", '--lease', '8s', '--timeout', '4s',
	'--poll', '100ms', '--reconnect-max', '200ms', '--log-interval', '0');
ok( wait_for('the first request', sub { grep { $_->{idempotency_key} eq $late[0] } @{ received() } }),
	'the relay is publishing the first message');
my $t_late = time();
sql(q{ALTER ROLE relay NOLOGIN});
sql(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'idem-relay'});
usleep(1_000_000 * ($t_late + 5 - time())) if $t_late + 5 > time();
sql(q{ALTER ROLE relay LOGIN});
ok( wait_for('the key delivered', sub {
			sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'late'}) == 0 }),
	'connections refused until after the deadline: the relay delivers the key in the end');
is(stop_relay($r, 'TERM'), 0, 'SIGTERM: exit code 0');
$rerr = file($r->{err});
like($rerr, qr/1 delivered and 0 released messages of a batch cut by the lost connection are left to the end of their leases/,
	'the ack is not sent again past the deadline');
is( join(' ', map { "$_->{body}{n}/$_->{attempt}" . ($_->{idempotency_key} eq $late[ $_->{body}{n} - 1 ] ? '' : '?') }
		  grep { $_->{path} eq '/late' } @{ received() }),
	'1/1 1/2 2/1',
	'the message published but not acknowledged comes again, with its id; the next one after it, once');

# A nack whose connection was lost after the batch's ack went through is
# sent again on the next connection at any time, also past the deadline:
# it names the relay, so it ends no lease another relay took since.  The
# nack waits for a write of its key's row that another session holds,
# while its backend is terminated and connections are refused until the
# deadline has passed.
sql(q{SELECT idem_outbox_configure('nk', 5, '50 milliseconds', '100 milliseconds')});
my @nk = (send_msg('nk', 'a', { n => 1, reply => [ '200 sleep=3' ] }),
	send_msg('nk', 'b', { n => 2, reply => [ '503', '200' ] }));
$r = start_relay('--sink', 'webhook', '--webhook-url', "$url/nk", '--lease', '8s', '--timeout', '4s',
	'--poll', '100ms', '--reconnect-max', '200ms', '--log-interval', '0');
ok(wait_for('the first request', sub { grep { $_->{idempotency_key} eq $nk[0] } @{ received() } }),
	'the relay is publishing the first message');
my $t_nk = time();
my $writer = IPC::Run::start(
	[ 'psql', '-X', '-h', $node->host, '-p', $node->port, '-d', 'postgres', '-c',
		q{BEGIN; UPDATE idem.outbox_keys SET last_error = last_error WHERE topic = 'nk' AND key = 'b';
		  SELECT pg_sleep(600); COMMIT;} ],
	'>', "$tmp/writer.out", '2>', "$tmp/writer.err");
push @started, $writer;
ok( wait_for('the nack waiting', sub { sql(q{SELECT count(*) FROM pg_stat_activity
                                            WHERE application_name = 'idem-relay' AND wait_event_type = 'Lock'}) == 1 }),
	'the first message is acknowledged, and the nack of the second waits for the write of its key');
is(sql("SELECT count(*) FROM idem.outbox WHERE id = '$nk[0]'"), '0', 'the ack went through');
sql(q{ALTER ROLE relay NOLOGIN});
sql(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'idem-relay'});
sql(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'BEGIN; UPDATE idem.outbox_keys%'});
$writer->finish;
usleep(1_000_000 * ($t_nk + 5 - time())) if $t_nk + 5 > time();
sql(q{ALTER ROLE relay LOGIN});
ok( wait_for('the key delivered', sub {
			sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'nk'}) == 0 }),
	'connections refused until after the deadline: the relay delivers the second message in the end');
is(stop_relay($r, 'TERM'), 0, 'SIGTERM: exit code 0');
$rerr = file($r->{err});
like($rerr, qr/ERROR:  idem_outbox_nack failed: /, 'the nack failed');
unlike($rerr, qr/left to the end of their leases/, 'the nack was not left to the end of the lease');
like(final_counts($rerr), qr/^leased 3, delivered 2, retried 1, dead 0, errors \d+$/,
	'the nack sent again on the new connection counts the message retried');

# A relay asked to stop (one SIGTERM) while it publishes, whose connection
# is lost before the ack, connects once more on its way out to send the
# ack: the message is not left leased until the end of its lease.
my @bye = (send_msg('bye', 'k', { n => 1, reply => [ '200 sleep=3' ] }),
	send_msg('bye', 'k', { n => 2 }));
$r = start_relay('--sink', 'webhook', '--webhook-url', "$url/bye", '--lease', '1h', '--timeout', '8s',
	'--poll', '100ms', '--reconnect-max', '200ms', '--log-interval', '0');
ok(wait_for('the first request', sub { grep { $_->{idempotency_key} eq $bye[0] } @{ received() } }),
	'the relay is publishing the first message');
$r->{h}->signal('TERM');
sql(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'idem-relay'});
is(stop_relay($r), 0, 'SIGTERM in the middle of the batch: exit code 0');
$rerr = file($r->{err});
like($rerr, qr/ERROR:  idem_outbox_ack failed: /, 'the ack failed');
like($rerr, qr/acknowledged on the new connection: 1 messages delivered before the last was lost/,
	'and was sent on a new connection before the relay exited');
is(sql(q{SELECT count(*) || ' ' || count(*) FILTER (WHERE id = '} . $bye[1] . q{') FROM idem.outbox
         WHERE aggregatetype = 'bye'}),
	'1 1', 'the published message is acknowledged, the next one left for the next lease');
is(final_counts($rerr), 'leased 1, delivered 1, retried 0, dead 0, errors 1',
	'the ack sent on the way out counts the message delivered');
is(sql(q{SELECT string_agg(id::text, ' ') FROM idem_outbox_lease('probe', 10)}), $bye[1],
	'the key is not held: its next message is leased at once');
sql(qq{SELECT idem_outbox_ack('{$bye[1]}')});

# A cut ack is not sent to another database: a reload that changed the
# dbname meanwhile leaves the message to the end of its lease, in its own
# database.
my $awayconf = "$tmp/away.conf";
my $awaybase = "sink = webhook\nwebhook.url = $url/away\nlease = 1h\ntimeout = 8s\n"
  . "poll = 100ms\nreconnect_max = 200ms\nlog_interval = 0\n";
write_conf($awayconf, $awaybase);
my $away = send_msg('away', 'k', { n => 1, reply => [ '200 sleep=3' ] });
$r = start_relay('--config', $awayconf);
ok(wait_for('the first request', sub { grep { $_->{idempotency_key} eq $away } @{ received() } }),
	'the relay is publishing the message');
write_conf($awayconf, "dbname = dbname=other\n$awaybase");
$r->{h}->signal('HUP');
sql(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'idem-relay'});
ok( wait_for('the new connection', sub { file($r->{err}) =~ /connected to database "other" as "relay"/ }),
	'its backend terminated, and SIGHUP with a new dbname: the relay connects to that database');
is(stop_relay($r, 'TERM'), 0, 'SIGTERM: exit code 0');
$rerr = file($r->{err});
like($rerr, qr/ERROR:  idem_outbox_ack failed: /, 'the ack failed');
like($rerr, qr/1 delivered and 0 released messages of a batch cut by the lost connection are left to the end of their leases/,
	'and is not sent to the other database');
unlike($rerr, qr/acknowledged on the new connection/, 'nothing is acknowledged there');
is(sql(q{SELECT pending || ' ' || leased FROM idem_outbox_stats() WHERE topic = 'away'}), '0 1',
	'the message stays leased in its database');

# Settings of the relay's role that would break its statements or its
# idle connection: array_nulls off made every nack without a retry time
# fail (its array literal's NULL read as the string "NULL": 22007), and an
# idle_session_timeout shorter than the poll cut the connection again and
# again.  The relay sets both for its session.
sql(q{ALTER ROLE relay SET array_nulls = off; ALTER ROLE relay SET idle_session_timeout = '1s'});
sql(q{SELECT idem_outbox_configure('anull', 5, '50 milliseconds', '100 milliseconds')});
my $anull = send_msg('anull', 'k', { n => 1, reply => [ '503', '200' ] });
$r = start_relay('--sink', 'webhook', '--webhook-url', "$url/anull", '--poll', '3s', '--reconnect-max', '200ms',
	'--log-interval', '0');
ok( wait_for('the message delivered', sub {
			sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'anull'}) == 0 }),
	'a relay whose role sets array_nulls off and a short idle_session_timeout: the message refused once is delivered');
usleep(2_500_000);
is(stop_relay($r, 'TERM'), 0, 'SIGTERM: exit code 0');
$rerr = file($r->{err});
unlike($rerr, qr/idem_outbox_nack failed/, 'its nack went through');
unlike($rerr, qr/connection lost|idle-session timeout/, 'its idle connection was not cut');
is(final_counts($rerr), 'leased 2, delivered 1, retried 1, dead 0, errors 0',
	'the message was retried once, then delivered');
sql(q{ALTER ROLE relay RESET array_nulls; ALTER ROLE relay RESET idle_session_timeout});

# A role whose transactions default to SERIALIZABLE: relays leasing and
# acknowledging at once would fail with serialization errors (40001) again
# and again, each failure a reconnection; idem-relay runs its leases, acks
# and nacks at READ COMMITTED.  Three relays share 600 messages of 50 keys.
sql(q{ALTER ROLE relay SET default_transaction_isolation = 'serializable'});
sql(q{SELECT count(idem_outbox_send('ser', 'k' || (i % 50), jsonb_build_object('i', i))) FROM generate_series(1, 600) i});
my @ser = map { start_relay('--sink', 'stdout', '--batch', '20', '--poll', '100ms', '--log-interval', '0') } 1 .. 3;
ok( wait_for('the messages delivered', sub {
			sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'ser'}) == 0 }),
	'three relays of a role whose transactions default to SERIALIZABLE deliver every message');
my $ser_err = '';
for my $sr (@ser)
{
	is(stop_relay($sr, 'TERM'), 0, 'SIGTERM: exit code 0');
	$ser_err .= file($sr->{err});
}
unlike($ser_err, qr/could not serialize|failed:/, 'no statement of theirs failed');
is(scalar(() = join('', map { file($_->{out}) } @ser) =~ /"topic": "ser"/g), 600, 'each message once');
sql(q{ALTER ROLE relay RESET default_transaction_isolation});

########################################################################
# SIGHUP with a new dbname
########################################################################

# No dbname: the environment's database (postgres).
my $hupconf = "$tmp/hup.conf";
write_conf($hupconf, "poll = 100ms\nreconnect_max = 200ms\nlog_interval = 0\n");
$r = start_relay('--config', $hupconf);
my $h1 = send_msg('hup', 'p1', { n => 1 });
ok(wait_for('the first message', sub { delivered($r, $h1) }), 'delivered from the environment\'s database');
ok(wait_for('one backend', sub { relay_backends() =~ /^\d+\@postgres$/ }), 'connected to postgres');
my $hpid = relay_backends();

# A reload that keeps the dbname keeps the connection.
write_conf($hupconf, "poll = 100ms\nreconnect_max = 200ms\nlog_interval = 0\nbatch = 7\n");
$r->{h}->signal('HUP');
ok(wait_for('the reload', sub { file($r->{err}) =~ /configuration reloaded from .*: batch 7,/ }),
	'SIGHUP: the configuration is reloaded');
my $h2 = send_msg('hup', 'p2', { n => 2 });
ok(wait_for('the second message', sub { delivered($r, $h2) }), 'delivered after the reload');
is(relay_backends(), $hpid, 'the dbname did not change: the same connection');
unlike(file($r->{err}), qr/connecting to the new dbname/, 'and the reload does not say it connects');

# dbname in the file: the other database.
$offset = length(file($r->{err}));
write_conf($hupconf, "dbname = dbname=other\npoll = 100ms\nreconnect_max = 200ms\nlog_interval = 0\n");
$r->{h}->signal('HUP');
ok( wait_for('the new connection', sub {
			substr(file($r->{err}), $offset) =~ /connected to database "other" as "relay"/ }),
	'SIGHUP with a new dbname: the relay connects to that database');
like(substr(file($r->{err}), $offset), qr/configuration reloaded from \S+: .*, connecting to the new dbname\n/,
	'the reload says it connects to the new dbname');
my $o1 = send_msg('hup', 'o1', { n => 3 }, 'other');
my $p3 = send_msg('hup', 'p3', { n => 4 });
ok(wait_for('the message of the other database', sub { delivered($r, $o1) }),
	'a message of the new database is delivered');
ok(wait_for('the old connection gone', sub { relay_backends() =~ /^\d+\@other$/ }),
	'the relay is connected to the new database only');
is(sql(q{SELECT attempts, leased_by IS NULL FROM idem.outbox_keys WHERE topic = 'hup' AND key = 'p3'}),
	'0|t', 'a message of the old database is not leased');

# No dbname again: back to the environment's database.
$offset = length(file($r->{err}));
write_conf($hupconf, "poll = 100ms\nreconnect_max = 200ms\nlog_interval = 0\n");
$r->{h}->signal('HUP');
ok(wait_for('the message of the first database', sub { delivered($r, $p3) }),
	'dbname removed: the relay goes back to the environment\'s database, and delivers its message');
like(substr(file($r->{err}), $offset), qr/connected to database "postgres" as "relay"/, 'and says so');
is(stop_relay($r, 'TERM'), 0, 'exit code 0 after the reloads');
is(join(' ', ids_out($r, 'hup')), "$h1 $h2 $o1 $p3", 'each message delivered once');
is( sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'hup'}) . ' '
	  . sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'hup'}, 'other'),
	'0 0', 'and acknowledged in its database');

########################################################################
# The line of counts
########################################################################

# Each log_interval: leased, delivered, retried, dead and errors of the
# interval, and its last error.
sub count_lines
{
	my ($text) = @_;
	return map {
		/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC idem-relay\[\d+\] LOG:  leased (\d+), delivered (\d+), retried (\d+), dead (\d+), errors (\d+) in \d+ s(?:; last error: (.+))?$/
		  ? [ $1, $2, $3, $4, $5, $6 ] : ()
	} split /\n/, $text;
}

# Two messages delivered, one retried once (503) then delivered, one
# refused for good (400).
sql(q{SELECT idem_outbox_configure('counts', 5, '50 milliseconds', '100 milliseconds')});
send_msg('counts', 'c1', { n => 1 });
send_msg('counts', 'c2', { n => 2 });
send_msg('counts', 'c3', { reply => [ '503', '200' ] });
send_msg('counts', 'c4', { reply => ['400'] });
$r = start_relay('--sink', 'webhook', '--webhook-url', "$url/counts", '--poll', '100ms',
	'--log-interval', '1s');
ok( wait_for('the messages', sub {
			sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'counts'}) == 1
			  && sql(q{SELECT dead FROM idem.outbox_keys WHERE topic = 'counts' AND key = 'c4'}) eq 't' }),
	'three messages delivered, one dead');
# (counted once the database had them: the first line written after this
# counts the last of it, the second one an interval in which nothing was
# done)
my $done = length(file($r->{err}));
ok( wait_for('two lines of counts', sub { my @l = count_lines(substr(file($r->{err}), $done)); @l >= 2 }),
	'a line of counts each interval');
is(stop_relay($r, 'TERM'), 0, 'exit code 0');
$rerr = file($r->{err});
my @after = count_lines(substr($rerr, $done));
is(join(',', map { $_ // '' } @{ $after[1] }), '0,0,0,0,0,',
	'an interval in which nothing was done counts nothing, and has no last error');
my @sum = (0) x 5;
my @failing;
for my $l (count_lines($rerr))
{
	$sum[$_] += $l->[$_] for 0 .. 4;
	push @failing, $l if $l->[2] || $l->[3];
}
is("leased $sum[0], delivered $sum[1], retried $sum[2], dead $sum[3], errors $sum[4]",
	'leased 5, delivered 3, retried 1, dead 1, errors 0', 'the lines add up to what was done');
is(final_counts($rerr), 'leased 5, delivered 3, retried 1, dead 1, errors 0', 'as the final line says');
ok(@failing && !grep({ ($_->[5] // '') !~ /^(?:webhook: HTTP 503|permanent: webhook: HTTP 400): / } @failing),
	'a line that counts a retried or dead message gives the last error of its interval')
  or diag($rerr);

########################################################################
# A sink that connected again with too little of its lease left
########################################################################

# A NATS server played by this script: it answers when the test says.
my $listener = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 5, ReuseAddr => 1)
  or die "cannot listen: $!";
my $nats_port = $listener->sockport;

sub nats_accept
{
	return undef
	  unless IO::Select->new($listener)->can_read($PostgreSQL::Test::Utils::timeout_default);
	my $s = $listener->accept or return undef;
	$s->blocking(0);
	return { sock => $s, in => '' };
}

# The next operation of client $c: [ 'PING' ], [ 'HPUB', reply, headers ],
# ... or undef when none came in time (or the client closed).
sub nats_op
{
	my ($c, $timeout) = @_;
	my $until = time() + ($timeout // $PostgreSQL::Test::Utils::timeout_default);
	for (;;)
	{
		if ($c->{in} =~ /\A([^\r\n]*)\r\n/)
		{
			my $line = $1;
			my $len = length($line) + 2;
			if ($line =~ /^HPUB \S+ (\S+) (\d+) (\d+)$/)
			{
				my ($reply, $hlen, $tlen) = ($1, $2, $3);
				if (length($c->{in}) >= $len + $tlen + 2)
				{
					my $hdr = substr($c->{in}, $len, $hlen);
					substr($c->{in}, 0, $len + $tlen + 2) = '';
					return [ 'HPUB', $reply, $hdr ];
				}
			}
			else
			{
				substr($c->{in}, 0, $len) = '';
				return [ split / /, $line, 2 ];
			}
		}
		my $left = $until - time();
		return undef if $left <= 0;
		IO::Select->new($c->{sock})->can_read($left > 0.1 ? 0.1 : $left) or next;
		my $n = sysread($c->{sock}, my $buf, 65536);
		return undef if defined $n && $n == 0;
		$c->{in} .= $buf if $n;
	}
}

# INFO, then CONNECT, SUB and PING from the client, answered with PONG.
sub nats_handshake
{
	my ($c) = @_;
	syswrite($c->{sock}, qq(INFO {"server_id":"test","server_name":"test","version":"2.10.0","proto":1,)
		  . qq("headers":true,"max_payload":1048576}\r\n));
	while (my $op = nats_op($c))
	{
		if ($op->[0] eq 'PING')
		{
			syswrite($c->{sock}, "PONG\r\n");
			return 1;
		}
	}
	return 0;
}

# The id and attempt of a published message.
sub hpub_msg
{
	my ($op) = @_;
	my ($id) = $op->[2] =~ /^Nats-Msg-Id: (\S+)\r$/m;
	my ($attempt) = $op->[2] =~ /^Idem-Attempt: (\d+)\r$/m;
	return ($id, $attempt);
}

my $nseq = 0;
sub nats_ack
{
	my ($c, $op) = @_;
	my $body = sprintf('{"stream":"NR","seq":%d}', ++$nseq);
	syswrite($c->{sock}, sprintf("MSG %s 1 %d\r\n%s\r\n", $op->[1], length($body), $body));
}

# Runs x1 x2 and y1 (--per-key 2), lease 20 s, timeout 10 s: no message
# may be started 10 s after the lease began.  The server takes x1 and y1,
# acknowledges x1 5 s later (half the timeout: the margin on either side)
# and closes the connection without acknowledging y1, so that the relay
# connects again for x2, the rest of x's run.  The server answers that
# connection 10.2 s after x1 and y1 came, which is after the lease began:
# the relay is connected within its timeout (10 s from 5 s), but with less
# than the timeout left of the lease, and must not publish x2.
sql(q{SELECT idem_outbox_configure('nr', 5, '50 milliseconds', '100 milliseconds')});
my %nr = map { ($_ => send_msg('nr', substr($_, 0, 1), { n => $_ })) } qw(x1 x2 y1);
$r = start_relay('--sink', 'nats', '--nats-url', "nats://127.0.0.1:$nats_port", '--per-key', '2',
	'--lease', '20s', '--timeout', '10s', '--poll', '100ms', '--log-interval', '0', '--verbose');
my $c1 = nats_accept();
ok($c1 && nats_handshake($c1), 'the relay connects to the NATS server');
my %first;
while (keys %first < 2)
{
	my $op = nats_op($c1) or last;
	next unless $op->[0] eq 'HPUB';
	my ($id) = hpub_msg($op);
	$first{$id} = $op;
}
my $t_first = time();
is(join(' ', sort map { $first{ $nr{$_} } ? $_ : () } keys %nr), 'x1 y1',
	'the heads of both runs are published together');
usleep(5_000_000);
nats_ack($c1, $first{ $nr{x1} });
close($c1->{sock});
my $c2 = nats_accept();
ok($c2, 'the connection closed: the relay connects again');
usleep(1_000_000 * ($t_first + 10.2 - time())) if $t_first + 10.2 > time();
ok(nats_handshake($c2), 'the server answers once less than the timeout is left of the lease');
my %name_of = reverse %nr;
my @later;
ok( wait_for('x2 and y1 delivered', sub {
			while (my $op = nats_op($c2, 0.05))
			{
				next unless $op->[0] eq 'HPUB';
				my ($id, $attempt) = hpub_msg($op);
				push @later, ($name_of{$id} // $id) . "/$attempt";
				nats_ack($c2, $op);
			}
			return sql(q{SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'nr'}) == 0; }),
	'every message acknowledged');
is(join(' ', sort @later), 'x2/2 y1/2',
	'x2 was not published on that connection, but at its next lease; y1 again after its failure');
is(stop_relay($r, 'TERM'), 0, 'exit code 0');
$rerr = file($r->{err});
like($rerr, qr/released \Q$nr{x2}\E \(topic nr, key x\): not published: its lease was running out/,
	'x2 released: its lease was running out');
like($rerr, qr/WARNING:  1 of 3 messages were not published: less than the timeout \(10000 ms\) was left of their lease/,
	'with the warning');
is(final_counts($rerr), 'leased 5, delivered 3, retried 2, dead 0, errors 0',
	'the final counts: y1 retried, x2 released');

# The stream's errors: 400 with err_code 10054 (the message over the
# stream's max_msg_size) is the message's own, dead at once; 400 with
# 10002 (a clustered JetStream's account over its storage limits) may pass
# later, and is retried.
sub nats_error
{
	my ($c, $op, $err_code, $desc) = @_;
	my $body = sprintf('{"error":{"code":400,"err_code":%d,"description":"%s"},"stream":"NR","seq":0}',
		$err_code, $desc);
	syswrite($c->{sock}, sprintf("MSG %s 1 %d\r\n%s\r\n", $op->[1], length($body), $body));
}
sql(q{SELECT idem_outbox_configure('ne', 5, '50 milliseconds', '100 milliseconds')});
my %ne = map { ($_ => send_msg('ne', $_, { n => $_ })) } qw(full big);
%name_of = reverse %ne;
$r = start_relay('--sink', 'nats', '--nats-url', "nats://127.0.0.1:$nats_port",
	'--lease', '20s', '--timeout', '5s', '--poll', '100ms', '--log-interval', '0', '--verbose');
my $c3 = nats_accept();
ok($c3 && nats_handshake($c3), 'the relay connects to the NATS server again');
my @ne_seen;
ok( wait_for('the stream errors answered', sub {
			while (my $op = nats_op($c3, 0.05))
			{
				next unless $op->[0] eq 'HPUB';
				my ($id, $attempt) = hpub_msg($op);
				my $name = $name_of{$id} // $id;
				push @ne_seen, "$name/$attempt";
				if ($name eq 'big')
				{
					nats_error($c3, $op, 10054, 'message size exceeds maximum allowed');
				}
				elsif ($attempt == 1)
				{
					nats_error($c3, $op, 10002, 'resource limits exceeded for account');
				}
				else
				{
					nats_ack($c3, $op);
				}
			}
			# both settled: delivered (gone) or dead
			return sql(q{SELECT count(*) FROM idem_outbox_stats() WHERE topic = 'ne' AND pending + leased = 0})
			  == 1; }),
	'both messages settled') or diag(join ' ', @ne_seen);
is(sql(q{SELECT dead || '|' || (SELECT string_agg(aggregateid, ',') FROM idem.outbox WHERE aggregatetype = 'ne')
		  FROM idem_outbox_stats() WHERE topic = 'ne'}),
	'1|big', 'the message over the limit is dead, the other delivered');
is(join(' ', sort @ne_seen), 'big/1 full/1 full/2',
	'10054 refused for good at its first attempt; 10002 retried, and published again');
is(stop_relay($r, 'TERM'), 0, 'exit code 0');
$rerr = file($r->{err});
like($rerr, qr/resource limits exceeded for account \(err_code 10002\)/, 'the retried error logged with its code')
  or diag($rerr);

$receiver->kill_kill;
# A server that accepts the connection and never answers (a host behind a
# firewall that drops, a hung server): over TCP the relay sets
# connect_timeout=10 unless the connection string or the environment says
# otherwise, so the attempt fails after 10 s instead of waiting for ever.
{
	my $silent = IO::Socket::INET->new(
		LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 5, ReuseAddr => 1)
	  or die "cannot listen: $!";
	my $sport = $silent->sockport;
	my ($sout, $serr) = ('', '');
	my $start = time;
	my $h = IPC::Run::start(
		[ $relay, '--dbname', "host=127.0.0.1 port=$sport dbname=postgres user=relay",
		  '--exit-on-error', '--connect-attempts', '1', '--once' ],
		init => sub { delete $ENV{PGCONNECT_TIMEOUT}; },
		'>', \$sout, '2>', \$serr, IPC::Run::timeout(60));
	eval { $h->finish; };
	my $timed_out = $@ ne '';
	$h->kill_kill if $timed_out;
	my $took = time - $start;
	ok(!$timed_out && $h->result(0) == 2,
		'a server that never answers: exit code 2 after the connection attempt timed out')
	  or diag("took $took s: $serr");
	like($serr, qr/timeout expired/, 'libpq gave up on its connect_timeout') or diag($serr);
	close($silent);
}

$node->stop;
done_testing();
