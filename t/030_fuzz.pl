# Copyright (c) idem contributors
#
# A short fuzz run: random calls of idem's functions with random arguments
# from two sessions (test/fuzz/idem_fuzz.pl), and sqlsmith's random queries
# beside them when sqlsmith is installed.  Afterwards the server must not
# have crashed, no call of idem may have raised an internal error or hung,
# the tables and indexes must pass amcheck, and the calls must really have
# reached idem.  scripts/fuzz.sh runs the same for longer.
#
# IDEM_FUZZ_SECONDS (15) sets the length and IDEM_FUZZ_SEED the seed; the
# seed is printed so that a failure can be replayed.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use IdemTest;

my $fuzz = "$FindBin::RealBin/../test/fuzz";
my $seconds = $ENV{IDEM_FUZZ_SECONDS} // 15;
my $seed = $ENV{IDEM_FUZZ_SEED} // int(rand(1_000_000));
note "fuzz seed $seed, $seconds s (IDEM_FUZZ_SEED=$seed replays it)";

# The log's verdict first, on two logs made up for it: an internal error
# that PostgreSQL raises for a random statement's own arguments passes, one
# raised in idem (or anywhere not known as PostgreSQL's own) fails.
for my $case (
	[ 'SetNextObjectId, varsup.c:600', 'cannot advance OID counter anymore', 0 ],
	[ 'outbox_open, outbox.c:520', 'idem.outbox has changed', 1 ],
	[ 'heap_update, heapam.c:3351', 'tuple concurrently updated', 1 ])
{
	my ($where, $msg, $bad) = @$case;
	my $log = PostgreSQL::Test::Utils::tempdir() . '/server.log';
	my $at = '2026-01-01 00:00:00.000 UTC [42] sqlsmith::dut XX000';
	PostgreSQL::Test::Utils::append_to_file($log,
		"$at: ERROR:  XX000: $msg\n$at: LOCATION:  $where\n"
		  . "$at: STATEMENT:  select public.idem_metrics() from pg_class\n");
	my $report = '';
	my $passed = IPC::Run::run([ 'perl', "$fuzz/check_log.pl", $log ],
		'>', \$report, '2>', \$report);
	is(!$passed, !!$bad,
		"log verdict on an internal error at $where in a statement that calls idem")
	  or diag $report;
}

my $node = idem_node(
	'fuzz',
	'track_functions = all',
	q{log_line_prefix = '%m [%p] %a %e: '},
	'log_min_error_statement = error',
	'log_error_verbosity = verbose',
	'max_prepared_transactions = 10',
	'deadlock_timeout = 100ms',
	'jit = off');
$node->safe_psql('postgres', 'CREATE DATABASE smith');
$node->safe_psql('smith', 'CREATE EXTENSION idem');
for my $db ('postgres', 'smith')
{
	$node->command_ok(
		[
			'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d',
			$node->connstr($db), '-f', "$fuzz/setup.sql"
		],
		"fuzz setup of database $db");
}

# sqlsmith in the background, on its own database
my ($sqlsmith) = grep { -x } map { "$_/sqlsmith" } split /:/, $ENV{PATH};
$sqlsmith //= '';
my ($smith, $smith_out, $smith_err) = (undef, '', '');
if ($sqlsmith ne '')
{
	$smith = IPC::Run::start(
		[
			'timeout', '-s', 'INT', $seconds, $sqlsmith, '--verbose',
			"--seed=$seed", '--target=' . $node->connstr('smith')
		],
		'>', \$smith_out, '2>', \$smith_err);
}

local $ENV{PGHOST} = $node->host;
local $ENV{PGPORT} = $node->port;
local $ENV{PGDATABASE} = 'postgres';
my ($out, $err) = ('', '');
my $ok = IPC::Run::run(
	[
		'perl', "$fuzz/idem_fuzz.pl", '--seconds', $seconds,
		'--sessions', '2', '--seed', $seed
	],
	'>', \$out, '2>', \$err);
note $out;
diag $err if $err ne '';
ok($ok, 'random calls of idem: no internal error, hang or lost connection')
  or diag $out;
my ($statements) = $out =~ /^statements: (\d+)/m;
cmp_ok($statements // 0, '>=', 100, 'random calls: at least 100 statements ran');

SKIP:
{
	skip 'sqlsmith is not installed (apt-get install sqlsmith)', 1
	  unless $smith;
	$smith->finish;
	my ($queries) = $smith_err =~ /^queries: (\d+)/m;
	note "sqlsmith ran " . ($queries // 0) . " queries";
	cmp_ok($queries // 0, '>', 0, 'sqlsmith ran queries against idem')
	  or diag substr($smith_err, -2000);
}

# Calls that returned, as counted by the statistics (an error is not
# counted): the fuzz must have reached idem, not only its argument checks.
my $calls_sql = q{
	SELECT coalesce(sum(s.calls), 0), count(*)
	  FROM pg_stat_user_functions s
	  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = s.funcid
	                  AND d.deptype = 'e'
	  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem'
	 WHERE s.calls > 0};
my $calls;
for (1 .. 50)
{
	$calls = $node->safe_psql('postgres', $calls_sql);
	last if (split /\|/, $calls)[0] >= 1000;
	usleep(100_000);
}
my ($ncalls, $nfuncs) = split /\|/, $calls;
note "calls of idem's functions that returned: $ncalls, in $nfuncs functions";
cmp_ok($ncalls, '>=', 1000,
	'at least 1000 calls of idem functions returned normally');
# Most of the functions users call must have succeeded at least once
# (some need a lucky draw of several valid arguments).
my ($nuser, $nreturned, $never) = split /\|/, $node->safe_psql(
	'postgres', q{
	SELECT count(*), count(*) FILTER (WHERE s.calls > 0),
	       coalesce(string_agg(p.proname, ' ') FILTER (WHERE coalesce(s.calls, 0) = 0), '')
	  FROM pg_depend d
	  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem'
	  JOIN pg_proc p ON d.classid = 'pg_proc'::regclass AND p.oid = d.objid
	  LEFT JOIN pg_stat_user_functions s ON s.funcid = p.oid
	 WHERE d.deptype = 'e' AND p.prorettype <> 'trigger'::regtype
	   AND p.pronamespace = 'public'::regnamespace}), -1;
note "functions that never returned normally: $never" if $never ne '';
cmp_ok($nreturned, '>=', 0.6 * $nuser,
	"most user-facing functions of idem returned normally ($nreturned of $nuser)");

# Nothing left half-done: prepared transactions of a session that stopped
# in between are rolled back before the checks.
for my $db ('postgres', 'smith')
{
	for my $gid (split /\n/,
		$node->safe_psql($db,
			'SELECT gid FROM pg_prepared_xacts WHERE database = current_database()'))
	{
		$node->safe_psql($db, "ROLLBACK PREPARED '$gid'");
	}
	$node->safe_psql($db, 'CREATE EXTENSION amcheck');
	my ($ret, $res, $stderr) = $node->psql(
		$db, q{
		SELECT count(*) FILTER (WHERE bt_index_check(i.indexrelid, true) IS NOT NULL)
		  FROM pg_index i
		  JOIN pg_class c ON c.oid = i.indexrelid
		  JOIN pg_am am ON am.oid = c.relam AND am.amname = 'btree'
		  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname IN ('idem', 'fuzz')
		 WHERE i.indisvalid AND c.relkind = 'i';
		SELECT count(*)
		  FROM pg_class c
		  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname IN ('idem', 'fuzz')
		  CROSS JOIN LATERAL verify_heapam(c.oid) v
		 WHERE c.relkind = 'r';});
	like($res, qr/^[1-9]\d*\n0$/,
		"amcheck finds the indexes and tables of $db consistent")
	  or diag "$res\n$stderr";
}

is($node->safe_psql('postgres', 'SELECT 1'), '1', 'the server still answers');
my ($log_ok, $log_report) = (0, '');
$log_ok = IPC::Run::run([ 'perl', "$fuzz/check_log.pl", $node->logfile ],
	'>', \$log_report, '2>', \$log_report);
note $log_report;
ok($log_ok,
	'server log: no crash, no PANIC, no internal error from a call of idem')
  or diag $log_report;

$node->stop;
done_testing();
