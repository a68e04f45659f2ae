
# Copyright (c) idem contributors
#
# Exactly once under faults.  100,000 messages go through a source that
# redelivers (a third of them get extra copies, shuffled out of order, and
# every unacked delivery comes again when its lease ends) to four consumer
# processes.  Each consumer credits an account and writes a ledger row in
# the same transaction as idem_claim(msg_id), commits, then acks.  Meanwhile
# consumers die at every point of that path (before the claim, between the
# claim and the commit, between the commit and the ack, and anywhere by an
# outside SIGKILL), their backends are terminated, and the server crashes
# three times (immediate shutdown and SIGKILL of the postmaster).  The
# ledger, which has no unique constraint, must hold exactly one row per
# message and the accounts exactly the sum of the messages.
#
# The outbox round: producers commit business rows, each with its message
# sent by idem_outbox_send, while relays lease, apply under idem_claim and
# ack them, under the same faults; every committed message must be applied
# exactly once and in send order per key, and none that rolled back leased.
#
# The offset round: a consumer group reads a log of 16 numbered partitions;
# each consumer resumes a partition from idem_offset_get and applies every
# message in one transaction with idem_offset_advance, under the same
# faults; every message must be applied exactly once, in offset order.
#
# The checker is proven live: consumers that skip idem_claim must be caught
# applying messages twice, consumers that ack before they commit must be
# caught losing messages, relays that ignore the order of a key must be
# caught leasing and applying out of order, and consumers that commit the
# offset apart from the write must be caught losing messages.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

# Build the harness (test/chaos/chaos.c) with the warnings of the project.
my $tmp = PostgreSQL::Test::Utils::tempdir;
my $chaos = "$tmp/chaos";
my $incdir = `pg_config --includedir`;
my $libdir = `pg_config --libdir`;
chomp($incdir, $libdir);
my ($cc_out, $cc_err) = ('', '');
IPC::Run::run(
	[
		$ENV{CC} // 'gcc', '-O2', '-Wall', '-Wextra', '-Werror', "-I$incdir",
		'-o', $chaos, "$FindBin::RealBin/../test/chaos/chaos.c",
		"-L$libdir", '-lpq'
	],
	'>', \$cc_out, '2>', \$cc_err)
  or BAIL_OUT("test/chaos/chaos.c does not build:\n$cc_out$cc_err");

my $node = idem_node('chaos', 'log_statement = none',
	'log_min_messages = warning');
my $pgdata = $node->data_dir;
my $log = $node->logfile;
my $connstr = $node->connstr('postgres');

# Runs one mode of the harness; its exit status, stdout and stderr.
sub chaos
{
	my ($mode, @args) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start([ $chaos, $mode, '-d', $connstr, @args ],
		'>', \$out, '2>', \$err,
		IPC::Run::timeout(4 * $PostgreSQL::Test::Utils::timeout_default));
	$h->finish;
	note("chaos $mode: $err") if $err ne '';
	return ($h->result(0), $out, $err);
}

# The figures of the RESULT line of "chaos check", as a hash.
sub figures
{
	my ($out) = @_;
	my ($line) = $out =~ /^RESULT (.*)$/m;
	return {} unless defined $line;
	return { map { split /=/, $_, 2 } split / /, $line };
}

sub recoveries
{
	my ($offset) = @_;
	# one line per recovery ("was interrupted" and "was not properly shut
	# down" can both be logged by one)
	my @n = slurp_file($log, $offset) =~ /automatic recovery in progress/g;
	return scalar @n;
}

########################################################################
# 100,000 messages under kills, terminations and crashes
########################################################################

my ($rc, $out, $err);
($rc, $out, $err) = chaos('setup');
is($rc, 0, 'setup') or diag($err);
($rc, $out, $err) =
  chaos('produce', '--messages', 100000, '--redeliver', '0.35', '--seed', 7);
is($rc, 0, 'produce 100,000 messages') or diag($err);

my $log_offset = -s $log;
($rc, $out, $err) = chaos(
	'run',
	'--consumers'    => 4,
	'--seed'         => 7,
	'--kill-every'   => 1000,
	'--sigkill-ms'   => 2000,
	'--terminate-ms' => 500,
	'--lease-ms'     => 1000,
	'--timeout-s'    => 600,
	'--crashes'      => 3,
	'--crash-cmd'    => "pg_ctl -D '$pgdata' -m immediate stop >/dev/null 2>&1",
	'--crash-cmd'    => "kill -KILL \$(head -n 1 '$pgdata/postmaster.pid')",
	'--start-cmd'    => "pg_ctl -w -D '$pgdata' -l '$log' start >/dev/null 2>&1");
is($rc, 0, 'the run under faults ends') or diag($err);
# the harness restarted the server: let the node know its new pid
$node->_update_pid(1);
cmp_ok(recoveries($log_offset), '>=', 3,
	'the server went through crash recovery at least three times');

($rc, $out, $err) = chaos('check');
diag($out);
my $f = figures($out);
is($rc, 0, 'check says every message was applied exactly once');
is($f->{messages}, 100000, '100,000 messages');
is($f->{lost}, 0, 'no message lost');
is($f->{twice}, 0, 'no message applied twice');
is($f->{strangers}, 0, 'no ledger row for an unknown message');
is($f->{unacked}, 0, 'every delivery acked');
is($f->{sum_ok}, 1, 'account balances equal the sum of the messages');
is($f->{kind_bad}, 0, 'one committed claim per message');
is($f->{unexpected}, 0, 'no error other than lost connections');
cmp_ok($f->{redelivered} // 0, '>=', 0.3 * 100000,
	'at least 30% of the messages were delivered more than once');
cmp_ok($f->{deliveries} // 0, '>', 1.3 * 100000,
	'deliveries exceed messages by at least 30%');
cmp_ok($f->{kills} // 0, '>=', 50, 'at least 50 consumers killed');
cmp_ok($f->{kills_before_claim} // 0, '>', 0, 'kills before the claim');
cmp_ok(($f->{kills_after_claim} // 0) + ($f->{kills_before_commit} // 0),
	'>', 0, 'kills between the claim and the commit');
cmp_ok($f->{kills_after_commit} // 0, '>', 0,
	'kills between the commit and the ack');
cmp_ok($f->{terminations} // 0, '>=', 10, 'backends terminated');
cmp_ok($f->{crashes} // 0, '>=', 3, 'at least three server crashes');
cmp_ok($f->{absorbed} // 0, '>=', 0.3 * 100000,
	'idem_claim absorbed the duplicates');

########################################################################
# Request keys: 10,000 payment requests retried under the same faults
########################################################################

# Each delivery is a client's retry of one request, keyed by the message id.
# A request takes two transactions (begin, effect and checkpoint; then
# finish), so a consumer killed between them leaves a request that the next
# retry resumes without applying the effect again, as soon as the dead
# consumer's session is gone.  Every answer a client gets must be the first
# result.
($rc, $out, $err) = chaos('setup', '--kind', 'request');
is($rc, 0, 'setup of the request kind') or diag($err);
($rc, $out, $err) = chaos('produce', '--messages', 10000, '--redeliver', '0.35',
	'--seed', 17);
is($rc, 0, 'produce 10,000 requests') or diag($err);
$log_offset = -s $log;
($rc, $out, $err) = chaos(
	'run',
	'--kind'         => 'request',
	'--consumers'    => 4,
	'--seed'         => 17,
	'--kill-every'   => 150,
	'--sigkill-ms'   => 2000,
	'--terminate-ms' => 500,
	'--lease-ms'     => 1000,
	'--timeout-s'    => 600,
	'--crashes'      => 2,
	'--crash-cmd'    => "pg_ctl -D '$pgdata' -m immediate stop >/dev/null 2>&1",
	'--crash-cmd'    => "kill -KILL \$(head -n 1 '$pgdata/postmaster.pid')",
	'--start-cmd'    => "pg_ctl -w -D '$pgdata' -l '$log' start >/dev/null 2>&1");
is($rc, 0, 'the request run under faults ends') or diag($err);
$node->_update_pid(1);
cmp_ok(recoveries($log_offset), '>=', 2,
	'the server went through crash recovery at least twice');
($rc, $out, $err) = chaos('check', '--kind', 'request');
diag($out);
$f = figures($out);
is($rc, 0, 'check says every request was applied exactly once');
is($f->{lost}, 0, 'no request lost');
is($f->{twice}, 0, 'no request applied twice');
is($f->{unacked}, 0, 'every retry answered');
is($f->{sum_ok}, 1, 'account balances equal the sum of the requests');
is($f->{kind_bad}, 0, 'every request finished once, every answer the first result');
is($f->{unexpected}, 0, 'no error other than lost connections');
cmp_ok($f->{kills_after_claim} // 0, '>', 0,
	'consumers killed between the checkpoint and the finish');
cmp_ok($f->{absorbed} // 0, '>=', 0.2 * 10000, 'retries answered by replay');

# The same checker catches request consumers that skip idem_request_begin.
chaos('setup', '--kind', 'request');
chaos('produce', '--messages', 3000, '--redeliver', '0.35', '--seed', 18);
($rc, $out, $err) = chaos('run', '--kind', 'request', '--no-idem', '--seed' => 18);
is($rc, 0, 'request run without idem');
($rc, $out, $err) = chaos('check', '--kind', 'request');
note($out);
$f = figures($out);
is($rc, 1, 'check fails without idem');
cmp_ok($f->{twice} // 0, '>=', 0.3 * 3000,
	'without idem the retried requests are applied twice');

########################################################################
# Outbox: producers send in their business transaction, relays deliver
########################################################################

# Four producers commit 6,000 orders, each with its message sent by
# idem_outbox_send in the same transaction, to 64 keys (each key belongs to
# one producer, which sends to it one transaction after the other); one
# transaction in ten rolls back on purpose and producers die before their
# commit.  Four relays lease batches of 32, apply each message in a consumer
# transaction guarded by idem_claim(message id), and ack the batch; one
# delivery in 50 fails and is nacked.  Relays die at every point of that
# path, backends of both are terminated, and the server crashes twice.
# Every committed order's message must be applied exactly once, leased and
# applied in send order per key, and no message of a transaction that
# rolled back may ever be leased.
($rc, $out, $err) = chaos('setup', '--kind', 'outbox');
is($rc, 0, 'setup of the outbox kind') or diag($err);
$log_offset = -s $log;
($rc, $out, $err) = chaos(
	'run',
	'--kind'         => 'outbox',
	'--messages'     => 6000,
	'--producers'    => 4,
	'--keys'         => 64,
	'--consumers'    => 4,
	'--seed'         => 27,
	'--kill-every'   => 150,
	'--nack-every'   => 50,
	'--sigkill-ms'   => 1500,
	'--terminate-ms' => 400,
	'--lease-ms'     => 500,
	'--timeout-s'    => 600,
	'--crashes'      => 2,
	'--crash-cmd'    => "pg_ctl -D '$pgdata' -m immediate stop >/dev/null 2>&1",
	'--crash-cmd'    => "kill -KILL \$(head -n 1 '$pgdata/postmaster.pid')",
	'--start-cmd'    => "pg_ctl -w -D '$pgdata' -l '$log' start >/dev/null 2>&1");
is($rc, 0, 'the outbox run under faults ends') or diag($err);
$node->_update_pid(1);
cmp_ok(recoveries($log_offset), '>=', 2,
	'the server went through crash recovery at least twice');
($rc, $out, $err) = chaos('check', '--kind', 'outbox');
diag($out);
$f = figures($out);
is($rc, 0, 'check says every committed message was applied exactly once, in order');
cmp_ok($f->{messages} // 0, '>=', 0.8 * 6000 * 0.9,
	'most messages sent were committed');
cmp_ok($f->{messages} // 0, '>=', $f->{sends} // 0,
	'every message whose commit a producer saw has its order');
is($f->{lost}, 0, 'no committed message lost');
is($f->{twice}, 0, 'no message applied twice');
is($f->{strangers}, 0, 'no message of a rolled back transaction applied');
is($f->{unacked}, 0, 'every committed message acked');
is($f->{sum_ok}, 1, 'account balances equal the sum of the committed orders');
is($f->{kind_bad}, 0,
	'nothing leased or applied out of order, nothing rolled back leased, the outbox empty');
like($out, qr/^leased out of order\s+0$/m, 'nothing leased out of order per key');
like($out, qr/^applied out of order\s+0$/m, 'nothing applied out of order per key');
like($out, qr/^leased but rolled back\s+0$/m,
	'no message of a transaction that rolled back was leased');
is($f->{unexpected}, 0, 'no error other than lost connections');
cmp_ok($f->{rolled_back} // 0, '>', 0, 'producers rolled back transactions');
cmp_ok($f->{producer_kills} // 0, '>', 0, 'producers died before their commit');
cmp_ok($f->{kills} // 0, '>=', 10, 'relays killed');
cmp_ok($f->{kills_after_claim} // 0, '>', 0,
	'relays killed between the claim and the commit');
cmp_ok($f->{kills_after_commit} // 0, '>', 0,
	'relays killed between the commit and the ack');
cmp_ok($f->{terminations} // 0, '>', 0, 'backends terminated');
cmp_ok($f->{crashes} // 0, '>=', 2, 'at least two server crashes');
cmp_ok($f->{nacks} // 0, '>', 0, 'failed deliveries nacked');
cmp_ok($f->{redelivered} // 0, '>', 0, 'messages delivered more than once');
cmp_ok($f->{absorbed} // 0, '>', 0, 'idem_claim absorbed redeliveries');

# The same with runs: relays lease up to 8 consecutive messages of a key at
# once (idem_outbox_lease's per_key) and stop a key's run at its first
# failure, whose nack releases the rest of the run.  16 keys, so that every
# lease holds runs; relays die in the middle of runs, runs run out of their
# lease, one delivery in 25 fails, and the server crashes once.  The messages
# of a run that were not delivered are leased again, alone, after the run's
# later ones, which were leased with them: the check counts as leased out of
# order a message leased after a lease of its key that began with a later
# message, and a lease of a key's messages that skips one.
($rc, $out, $err) = chaos('setup', '--kind', 'outbox');
is($rc, 0, 'setup of the outbox kind, runs') or diag($err);
$log_offset = -s $log;
($rc, $out, $err) = chaos(
	'run',
	'--kind'         => 'outbox',
	'--per-key'      => 8,
	'--messages'     => 3000,
	'--producers'    => 4,
	'--keys'         => 16,
	'--consumers'    => 4,
	'--seed'         => 31,
	'--kill-every'   => 150,
	'--nack-every'   => 25,
	'--sigkill-ms'   => 1500,
	'--terminate-ms' => 400,
	'--lease-ms'     => 500,
	'--timeout-s'    => 600,
	'--crashes'      => 1,
	'--crash-cmd'    => "pg_ctl -D '$pgdata' -m immediate stop >/dev/null 2>&1",
	'--start-cmd'    => "pg_ctl -w -D '$pgdata' -l '$log' start >/dev/null 2>&1");
is($rc, 0, 'the outbox run with runs under faults ends') or diag($err);
$node->_update_pid(1);
cmp_ok(recoveries($log_offset), '>=', 1,
	'the server went through crash recovery (runs)');
($rc, $out, $err) = chaos('check', '--kind', 'outbox');
diag($out);
$f = figures($out);
is($rc, 0, 'check says every committed message was applied exactly once, in order (runs)');
cmp_ok($f->{messages} // 0, '>=', 0.8 * 3000 * 0.9,
	'most messages sent were committed (runs)');
is($f->{lost}, 0, 'no committed message lost (runs)');
is($f->{twice}, 0, 'no message applied twice (runs)');
is($f->{strangers}, 0, 'no message of a rolled back transaction applied (runs)');
is($f->{unacked}, 0, 'every committed message acked (runs)');
is($f->{sum_ok}, 1, 'account balances equal the sum of the committed orders (runs)');
like($out, qr/^leased out of order\s+0$/m,
	'no message leased after a lease of its key that began with a later one');
like($out, qr/^leased with a gap\s+0$/m, 'no run skipped a message of its key');
like($out, qr/^applied out of order\s+0$/m, 'nothing applied out of order per key (runs)');
cmp_ok($f->{kills} // 0, '>=', 5, 'relays killed (runs)');
cmp_ok($f->{nacks} // 0, '>', 0, 'failed deliveries nacked (runs)');
cmp_ok($f->{redelivered} // 0, '>', 0, 'messages delivered more than once (runs)');
cmp_ok(
	$node->safe_psql('postgres',
		"SELECT count(*) FROM idem.outbox_keys WHERE topic = 'chaos' AND leased_through IS NOT NULL"),
	'>', 0, 'keys were leased in runs');
cmp_ok(
	$node->safe_psql('postgres',
		"SELECT count(*) FROM (SELECT d.attempt, o.n, max(o.n) OVER (PARTITION BY o.key "
		  . "ORDER BY d.id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before "
		  . "FROM deliveries d JOIN orders o USING (msg_id)) x WHERE attempt > 1 AND before > n"),
	'>', 0, 'messages of runs were leased again after later ones of their key');

########################################################################
# Offsets: a consumer group of a partitioned log
########################################################################

# 6,000 messages in 16 partitions, offsets with gaps.  Four consumers pick
# partitions at random (two often share one, as a consumer group does while
# it rebalances); each resumes after the offset idem_offset_get gives (after
# a restart up to a batch earlier, as a source redelivering from a position
# behind idem's does) and applies each message in one transaction with
# idem_offset_advance, the business write only when it says true.
# Consumers die before the advance, between it and the write, before and
# after the commit, and by outside SIGKILLs; backends are terminated, and
# the server crashes once.  Each write records the offset applied before it
# in its partition, which must be the message's predecessor in the log.
($rc, $out, $err) = chaos('setup', '--kind', 'offset');
is($rc, 0, 'setup of the offset kind') or diag($err);
($rc, $out, $err) = chaos('produce', '--kind', 'offset', '--messages', 6000,
	'--partitions', 16, '--seed', 37);
is($rc, 0, 'produce 6,000 messages in 16 partitions') or diag($err);
$log_offset = -s $log;
($rc, $out, $err) = chaos(
	'run',
	'--kind'         => 'offset',
	'--partitions'   => 16,
	'--consumers'    => 4,
	'--seed'         => 37,
	'--kill-every'   => 150,
	'--sigkill-ms'   => 1500,
	'--terminate-ms' => 400,
	'--timeout-s'    => 600,
	'--crashes'      => 1,
	'--crash-cmd'    => "pg_ctl -D '$pgdata' -m immediate stop >/dev/null 2>&1",
	'--start-cmd'    => "pg_ctl -w -D '$pgdata' -l '$log' start >/dev/null 2>&1");
is($rc, 0, 'the offset run under faults ends') or diag($err);
$node->_update_pid(1);
cmp_ok(recoveries($log_offset), '>=', 1,
	'the server went through crash recovery');
($rc, $out, $err) = chaos('check', '--kind', 'offset');
diag($out);
$f = figures($out);
is($rc, 0, 'check says every message was applied exactly once, in offset order');
is($f->{messages}, 6000, '6,000 messages');
is($f->{lost}, 0, 'no message lost');
is($f->{twice}, 0, 'no message applied twice');
is($f->{unacked}, 0, 'every partition\'s offset at its last message');
is($f->{sum_ok}, 1, 'account balances equal the sum of the messages');
is($f->{kind_bad}, 0, 'in offset order, one offset row per partition');
like($out, qr/^applied out of order\s+0$/m,
	'every write follows the write of its predecessor in the log');
like($out, qr/^offset rows not one per partition\s+0$/m,
	'idem.offsets holds one row per partition');
is($f->{unexpected}, 0, 'no error other than lost connections');
cmp_ok($f->{kills} // 0, '>=', 20, 'consumers killed');
cmp_ok($f->{kills_before_claim} // 0, '>', 0, 'kills before the advance');
cmp_ok($f->{kills_after_claim} // 0, '>', 0,
	'kills between the advance and the write');
cmp_ok($f->{kills_before_commit} // 0, '>', 0, 'kills before the commit');
cmp_ok($f->{kills_after_commit} // 0, '>', 0, 'kills after the commit');
cmp_ok($f->{terminations} // 0, '>', 0, 'backends terminated');
cmp_ok($f->{crashes} // 0, '>=', 1, 'a server crash');
cmp_ok($f->{absorbed} // 0, '>', 0,
	'idem_offset_advance said false to messages already applied');

########################################################################
# The checker catches broken consumers
########################################################################

# Without idem_claim, every redelivery is applied again.
chaos('setup');
chaos('produce', '--messages', 5000, '--redeliver', '0.35', '--seed', 8);
($rc, $out, $err) = chaos('run', '--no-idem', '--seed' => 8);
is($rc, 0, 'run without idem_claim');
($rc, $out, $err) = chaos('check');
note($out);
$f = figures($out);
is($rc, 1, 'check fails without idem_claim');
is($f->{lost}, 0, 'without idem_claim nothing is lost');
cmp_ok($f->{twice} // 0, '>=', 0.3 * 5000,
	'without idem_claim the redelivered messages are applied twice');
is($f->{sum_ok}, 0, 'without idem_claim the balances are too high');

# Acking before committing loses the messages of consumers that die in
# between (idem cannot help: the message is not redelivered).
chaos('setup');
chaos('produce', '--messages', 5000, '--redeliver', '0.35', '--seed', 9);
($rc, $out, $err) = chaos(
	'run', '--broken', 'ack-first',
	'--seed'       => 9,
	'--kill-every' => 100,
	'--lease-ms'   => 300);
is($rc, 0, 'run acking before the commit');
($rc, $out, $err) = chaos('check');
note($out);
$f = figures($out);
is($rc, 1, 'check fails when acking before the commit');
cmp_ok($f->{lost} // 0, '>', 0, 'acking before the commit loses messages');
is($f->{twice}, 0, 'acking before the commit applies nothing twice');

# Outbox relays whose consumers skip idem_claim apply the messages
# redelivered after a kill twice.
chaos('setup', '--kind', 'outbox');
($rc, $out, $err) = chaos('run', '--kind', 'outbox', '--no-idem',
	'--messages' => 1000, '--seed' => 28, '--kill-every' => 25,
	'--lease-ms' => 100);
is($rc, 0, 'outbox run without idem_claim');
($rc, $out, $err) = chaos('check', '--kind', 'outbox');
note($out);
$f = figures($out);
is($rc, 1, 'check fails without idem_claim');
is($f->{lost}, 0, 'without idem_claim no outbox message is lost');
cmp_ok($f->{twice} // 0, '>', 0,
	'without idem_claim outbox messages are applied twice');

# Relays that ack before they apply lose the messages of those that die
# in between.
chaos('setup', '--kind', 'outbox');
($rc, $out, $err) = chaos('run', '--kind', 'outbox', '--broken', 'ack-first',
	'--messages' => 1000, '--seed' => 29, '--kill-every' => 25,
	'--lease-ms' => 100);
is($rc, 0, 'outbox run acking before the commit');
($rc, $out, $err) = chaos('check', '--kind', 'outbox');
note($out);
$f = figures($out);
is($rc, 1, 'check fails when relays ack before the commit');
cmp_ok($f->{lost} // 0, '>', 0, 'acking before the commit loses outbox messages');

# Relays that take pending messages in any order, as a plain queue would,
# are caught leasing and applying them out of order.
chaos('setup', '--kind', 'outbox');
($rc, $out, $err) = chaos('run', '--kind', 'outbox', '--broken', 'unordered',
	'--messages' => 2000, '--seed' => 30);
is($rc, 0, 'outbox run without order per key');
($rc, $out, $err) = chaos('check', '--kind', 'outbox');
note($out);
$f = figures($out);
is($rc, 1, 'check fails without order per key');
unlike($out, qr/^leased out of order\s+0$/m, 'messages leased out of order are caught');
unlike($out, qr/^applied out of order\s+0$/m, 'messages applied out of order are caught');
is($f->{lost}, 0, 'without order per key nothing is lost');

# Relays leasing runs that go on with a key's run after a failure apply the
# failed message after later ones of its key.
chaos('setup', '--kind', 'outbox');
($rc, $out, $err) = chaos('run', '--kind', 'outbox', '--broken', 'run-on',
	'--per-key' => 16, '--keys' => 8, '--nack-every' => 10,
	'--messages' => 1500, '--seed' => 32);
is($rc, 0, 'outbox run going on with runs after a failure');
($rc, $out, $err) = chaos('check', '--kind', 'outbox');
note($out);
$f = figures($out);
is($rc, 1, 'check fails when runs go on after a failure');
unlike($out, qr/^applied out of order\s+0$/m,
	'a run gone on with after a failure is caught applying out of order');
is($f->{lost}, 0, 'going on after a failure loses nothing');

# Consumers that commit the advance in a transaction of its own, before
# the write, lose the messages of those that die in between: the offset
# says applied, the write never happened.
chaos('setup', '--kind', 'offset');
chaos('produce', '--kind', 'offset', '--messages', 1000, '--seed', 38);
($rc, $out, $err) = chaos('run', '--kind', 'offset', '--broken', 'split',
	'--seed' => 38, '--kill-every' => 50);
is($rc, 0, 'offset run with the advance apart from the write');
($rc, $out, $err) = chaos('check', '--kind', 'offset');
note($out);
$f = figures($out);
is($rc, 1, 'check fails when the advance is committed apart from the write');
cmp_ok($f->{lost} // 0, '>', 0,
	'the advance apart from the write loses messages');
unlike($out, qr/^applied out of order\s+0$/m,
	'the writes that follow a lost message are caught out of order');
is($f->{twice}, 0, 'the advance apart from the write applies nothing twice');

$node->stop;
done_testing();
