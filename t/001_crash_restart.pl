
# Copyright (c) idem contributors
#
# Claims across crashes: committed claims survive an immediate shutdown and
# a backend crash (through WAL replay), claims of transactions that were
# still open are released, and a prepared transaction keeps its claim in
# flight until COMMIT or ROLLBACK PREPARED.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('crash', 'max_prepared_transactions = 10',
	'restart_after_crash = on');

# Everything of idem.claims, per namespace, with the claim times.
my $state_sql = q{
	SELECT ns, count(*),
	       md5(string_agg(msg_id || ' ' || claimed_at::text, ','
	                      ORDER BY msg_id))
	  FROM idem.claims GROUP BY ns ORDER BY ns};

# The 10,000 ids of the batch, as an array.
my $batch = q{ARRAY(SELECT 'b-' || g FROM generate_series(1, 10000) g)};

########################################################################
# Immediate shutdown
########################################################################

# The claims below are made after this checkpoint: after the crash they
# exist only through WAL replay.
$node->safe_psql('postgres', 'CHECKPOINT');

is( $node->safe_psql(
		'postgres',
		q{SELECT idem_claim('m-1'), idem_claim('m-2'),
		         idem_claim('m-1', 'other')}),
	't|t|t',
	'claims committed one by one');

is( $node->safe_psql(
		'postgres', qq{
	BEGIN;
	SELECT count(*) FILTER (WHERE r), count(*)
	  FROM unnest(idem_claim_batch($batch, 'bulk')) r;
	SELECT idem_claim('m-3');
	COMMIT;}),
	"10000|10000\nt",
	'10,000 claims committed in one transaction');

my $state_before = $node->safe_psql('postgres', $state_sql);
like($state_before, qr/^bulk\|10000\|.*\ndefault\|3\|.*\nother\|1\|/,
	'claims are in the table before the crash');
my $info_before = $node->safe_psql('postgres',
	q{SELECT idem_claim_info('m-1'), idem_claim_info('b-10000', 'bulk')});
like($info_before, qr/^\d{4}-\d\d-\d\d [^|]+\|\d{4}-\d\d-\d\d /,
	'claim times are known before the crash');

# A transaction left open in a session that is still connected.
my $open = IdemTest::Session->new($node, 'postgres');
is( $open->query(
		q{BEGIN;
		  SELECT idem_claim('open-1');
		  SELECT idem_claim_batch(ARRAY['open-2', 'open-3'], 'other');}),
	"t\n{t,t}",
	'claims made in a transaction left open');

# Two prepared transactions holding a claim each.
is( $node->safe_psql(
		'postgres', q{
	BEGIN;
	SELECT idem_claim('prep-commit');
	PREPARE TRANSACTION 'idem_commit';
	BEGIN;
	SELECT idem_claim('prep-abort', 'other');
	PREPARE TRANSACTION 'idem_abort';}),
	"t\nt",
	'claims made in prepared transactions');

# The uncommitted claims are held: what follows would prove nothing if
# they were not.
is( $node->safe_psql(
		'postgres',
		q{SELECT idem_try_claim('open-1'), idem_try_claim('open-3', 'other'),
		         idem_try_claim('prep-commit'),
		         idem_try_claim('prep-abort', 'other')}),
	'in_flight|in_flight|in_flight|in_flight',
	'uncommitted claims are in flight before the crash');

my $log_offset = -s $node->logfile;
$node->stop('immediate');
ok($open->lost, 'the open session lost its connection');
$node->start;
ok( slurp_file($node->logfile, $log_offset) =~
	  /database system was not properly shut down; automatic recovery in progress/,
	'the restart ran crash recovery');

is($node->safe_psql('postgres', $state_sql),
	$state_before, 'committed claims and their times survive the crash');
is( $node->safe_psql(
		'postgres',
		q{SELECT idem_claim_info('m-1'), idem_claim_info('b-10000', 'bulk')}),
	$info_before,
	'idem_claim_info gives the same times after the crash');
is( $node->safe_psql(
		'postgres',
		q{SELECT idem_claim('m-1'), idem_claim('m-2'), idem_claim('m-3'),
		         idem_claim('m-1', 'other'), idem_try_claim('m-2')}),
	'f|f|f|f|duplicate',
	'claims committed before the crash are duplicates');
is( $node->safe_psql(
		'postgres', qq{
	SELECT count(*) FILTER (WHERE r), count(*)
	  FROM unnest(idem_claim_batch($batch, 'bulk')) r}),
	'0|10000',
	'every claim of the 10,000 batch is a duplicate after the crash');

is( $node->safe_psql(
		'postgres',
		q{SELECT idem_claim_info('open-1') IS NULL,
		         idem_try_claim('open-1'),
		         idem_claim('open-2', 'other'), idem_claim('open-3', 'other')}),
	't|claimed|t|t',
	'claims of the transaction left open are released by the crash');

# Prepared transactions survive with their claims still in flight.
is( $node->safe_psql(
		'postgres', q{SELECT string_agg(gid, ',' ORDER BY gid)
		                FROM pg_prepared_xacts}),
	'idem_abort,idem_commit',
	'prepared transactions survive the crash');
is( $node->safe_psql(
		'postgres',
		q{SELECT idem_try_claim('prep-commit'),
		         idem_try_claim('prep-abort', 'other'),
		         idem_claim_info('prep-commit') IS NULL}),
	'in_flight|in_flight|t',
	'claims of prepared transactions are in flight after the crash');
is( sqlstate_of(
		$node, 'postgres',
		q{SET lock_timeout = '100ms'; SELECT idem_claim('prep-commit');}),
	'55P03',
	'idem_claim waits on the claim of a prepared transaction');

$node->safe_psql('postgres',
	q{COMMIT PREPARED 'idem_commit'; ROLLBACK PREPARED 'idem_abort';});
is( $node->safe_psql(
		'postgres',
		q{SELECT idem_claim('prep-commit'),
		         idem_claim_info('prep-commit') IS NOT NULL,
		         idem_claim('prep-abort', 'other')}),
	'f|t|t',
	'COMMIT PREPARED makes a duplicate, ROLLBACK PREPARED releases');

########################################################################
# A backend ended by pg_terminate_backend: its transaction aborts
########################################################################

my $term = IdemTest::Session->new($node, 'postgres');
my $term_pid = $term->query('SELECT pg_backend_pid();');
like($term_pid, qr/^\d+$/, 'session to terminate started');
is($term->query(q{BEGIN; SELECT idem_claim('term-1');}),
	't', 'claim made in a transaction left open');
is($node->safe_psql('postgres', q{SELECT idem_try_claim('term-1')}),
	'in_flight', 'the claim is in flight');
is($node->safe_psql('postgres', "SELECT pg_terminate_backend($term_pid, 60000)"),
	't', 'backend terminated');
ok($term->lost, 'the terminated session lost its connection');
is($node->safe_psql('postgres', q{SELECT idem_claim('term-1')}),
	't', 'the claim of the terminated backend is released');

########################################################################
# A backend killed with SIGKILL: the server restarts
########################################################################

my $killme = IdemTest::Session->new($node, 'postgres');
my $kill_pid = $killme->query('SELECT pg_backend_pid();');
like($kill_pid, qr/^\d+$/, 'session to kill started');
is( $killme->query(
		q{SELECT idem_claim('kill-committed');
		  BEGIN;
		  SELECT idem_claim('kill-open');
		  SELECT idem_claim_batch(ARRAY['kill-open-2'], 'other');}),
	"t\nt\n{t}",
	'claims committed and left open in the session to kill');
is( $node->safe_psql(
		'postgres',
		q{SELECT idem_try_claim('kill-open'),
		         idem_try_claim('kill-open-2', 'other')}),
	'in_flight|in_flight',
	'the open claims are in flight');

$log_offset = -s $node->logfile;
is(kill('KILL', $kill_pid), 1, 'backend killed with SIGKILL');
ok($killme->lost, 'the killed session lost its connection');
ok( wait_for_log(
		$node,
		qr/server process \(PID $kill_pid\) was terminated by signal 9.*database system is ready to accept connections/s,
		$log_offset),
	'the server went through a crash restart');
ok($node->poll_query_until('postgres', 'SELECT 1', '1'),
	'the server accepts connections again');

is( $node->safe_psql(
		'postgres',
		q{SELECT idem_claim('kill-committed'), idem_claim('m-1'),
		         idem_claim('prep-commit')}),
	'f|f|f',
	'committed claims survive the killed backend');
is( $node->safe_psql(
		'postgres',
		q{SELECT idem_claim('kill-open'), idem_claim('kill-open-2', 'other')}),
	't|t',
	'claims of the killed backend are released');
is( $node->safe_psql(
		'postgres', qq{
	SELECT count(*) FILTER (WHERE r), count(*)
	  FROM unnest(idem_claim_batch($batch, 'bulk')) r}),
	'0|10000',
	'the 10,000 batch is still claimed after the second crash');

$node->stop;

done_testing();
