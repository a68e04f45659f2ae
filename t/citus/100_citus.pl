
# Copyright (c) idem contributors
#
# idem on a Citus cluster: a coordinator and two workers (a third joins for
# a rebalance), all on Unix sockets.  idem_distribute() distributes the
# keyed tables; claims, batches, try-claims, tokens and request keys then
# answer as on one server, through the coordinator and through a worker;
# a rollback releases; two sessions on different nodes race on one key; a
# transaction touching keys on two workers aborts; shards move to a third
# worker while claims of the same keys stream in through two nodes, none
# lost or given twice; purges delete the expired rows of the right nodes and
# no other, by each node's own settings; DROP EXTENSION cleans every
# node.  Run by "scripts/test.sh citus".

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/..";

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;
use List::Util qw(max min);
use Time::HiRes qw(usleep);

sub citus_node
{
	my ($name) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(extra => [ '--locale=C.UTF-8', '--encoding=UTF8' ]);
	my $host = $node->host;
	$node->append_conf(
		'postgresql.conf', qq{
shared_preload_libraries = 'citus,idem'
idem.maintenance = off
wal_level = logical
max_prepared_transactions = 20
max_worker_processes = 16
max_wal_senders = 10
max_replication_slots = 10
citus.local_hostname = '$host'
citus.node_conninfo = 'sslmode=disable'
citus.shard_count = 4
citus.background_task_queue_interval = '100ms'
});
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION citus');
	return $node;
}

my $coord = citus_node('coord');
my $w1    = citus_node('w1');
my $w2    = citus_node('w2');
my $w3    = citus_node('w3');

$coord->safe_psql('postgres',
	"SELECT citus_set_coordinator_host('" . $coord->host . "', " . $coord->port . ")");
for my $w ($w1, $w2)
{
	$coord->safe_psql('postgres',
		"SELECT citus_add_node('" . $w->host . "', " . $w->port . ")");
}
$coord->safe_psql('postgres', 'CREATE EXTENSION idem');

# without distribution, the direct path; on a worker, a clear refusal
is(sqlstate_of($w1, 'postgres', 'SELECT idem_distribute()'),
	'55000', 'idem_distribute() on a worker: 55000');
is( $coord->safe_psql('postgres',
		"SELECT has_function_privilege('public', 'idem_distribute()', 'EXECUTE')"),
	'f', 'idem_distribute() is not granted to PUBLIC');

my $dist = $coord->safe_psql('postgres', 'SELECT idem_distribute()');
like($dist, qr/^idem\.claims$/m,        'claims distributed');
like($dist, qr/^idem\.tokens$/m,        'tokens distributed');
like($dist, qr/^idem\.requests$/m,      'request keys distributed');
like($dist, qr/^idem\.offsets$/m,       'offsets distributed');
like($dist, qr/^idem\.producer_seqs$/m, 'producer sequences distributed');
like($dist, qr/^public\.idem_claim\(text,text\)$/m, 'idem_claim routed');
is($coord->safe_psql('postgres', 'SELECT idem_distribute()'),
	$dist, 'idem_distribute() is repeatable');
is( $coord->safe_psql(
		'postgres', q{
	SELECT count(*) FROM pg_dist_partition
	 WHERE logicalrelid::text IN ('idem.claims', 'idem.requests', 'idem.offsets',
	                              'idem.producer_seqs', 'idem.tokens')}),
	'5', 'five keyed tables in pg_dist_partition');
is( $coord->safe_psql(
		'postgres', q{
	SELECT count(DISTINCT colocationid) FROM pg_dist_partition
	 WHERE logicalrelid::text IN ('idem.claims', 'idem.requests', 'idem.offsets',
	                              'idem.producer_seqs')}),
	'1', 'the text-keyed tables are colocated');

# every function routed: by its first argument, colocated with its table
# (the text-keyed ones), delegated also inside a transaction block
my @routed = grep { /\(/ } split /\n/, $dist;
cmp_ok(scalar(@routed), '>=', 10, 'the ten functions keyed by their table are routed (with their overloads)');
my $routed_list = join(', ', map { "'$_'::regprocedure" } @routed);
is( $coord->safe_psql(
		'postgres', qq{
	SELECT count(*) || '|' || string_agg(DISTINCT o.distribution_argument_index || ' ' || o.force_delegation || ' '
	       || (o.colocationid = (SELECT colocationid FROM pg_dist_partition
	                              WHERE logicalrelid = 'idem.claims'::regclass)), ',')
	  FROM pg_dist_object o
	 WHERE o.classid = 'pg_proc'::regclass AND o.objid IN ($routed_list)}),
	scalar(@routed) . '|0 true true',
	'each by its first argument, colocated with the keyed tables, delegated inside transactions');

# claims through the coordinator and through the workers
is($coord->safe_psql('postgres', "SELECT idem_claim('c-1')"), 't', 'claim through the coordinator');
is($coord->safe_psql('postgres', "SELECT idem_claim('c-1')"), 'f', 'duplicate through the coordinator');
is($w1->safe_psql('postgres', "SELECT idem_claim('c-1')"), 'f', 'duplicate through worker 1');
is($w2->safe_psql('postgres', "SELECT idem_claim('c-1')"), 'f', 'duplicate through worker 2');
is($w1->safe_psql('postgres', "SELECT idem_claim('c-2')"), 't', 'claim through a worker');
is($coord->safe_psql('postgres', "SELECT idem_claim('c-2')"), 'f', 'seen by the coordinator');
is( $coord->safe_psql('postgres',
		"SELECT idem_try_claim('c-3'), idem_try_claim('c-3'), idem_try_claim('c-1')"),
	'claimed|duplicate|duplicate', 'try-claims through the coordinator');
is($w2->safe_psql('postgres', "SELECT idem_try_claim('c-3', 'other')"),
	'claimed', 'namespaces apart through a worker');
is( $w2->safe_psql('postgres',
		"SELECT idem_claim_batch(ARRAY['b-1', 'c-1', 'b-2', 'b-1', 'c-3'])"),
	'{t,f,t,f,f}', 'a batch through a worker');
is( $coord->safe_psql('postgres',
		"SELECT idem_claim_batch(ARRAY['b-2', 'b-3'])"),
	'{f,t}', 'a batch through the coordinator');
is( $w1->safe_psql('postgres',
		"SELECT idem_claim_info('b-3') IS NOT NULL, idem_claim_info('b-4') IS NULL"),
	't|t', 'claim info through a worker');
is( $coord->safe_psql(
		'postgres', q{
	BEGIN;
	SELECT idem_claim('t-1'), idem_claim('t-2'), idem_claim('t-1'), idem_try_claim('t-3');
	COMMIT}),
	't|t|f|claimed', 'claims inside a transaction block');
is($w1->safe_psql('postgres', "SELECT idem_release('c-2')"), 't', 'release through a worker');
is($coord->safe_psql('postgres', "SELECT idem_claim('c-2')"), 't', 'claimed again after the release');

# the rows are in the shards, none in the shells
is($coord->safe_psql('postgres', 'SELECT count(*) FROM idem.claims'),
	'10', 'every claim is in a shard');
for my $n ($coord, $w1, $w2)
{
	is($n->safe_psql('postgres', "SELECT pg_relation_size('idem.claims')"),
		'0', 'the shell of the claims is empty on ' . $n->name);
}

# rollback releases, through the coordinator and through a worker
$coord->safe_psql('postgres', "BEGIN; SELECT idem_claim('r-1'); ROLLBACK");
$w2->safe_psql('postgres', "BEGIN; SELECT idem_claim('r-2'); ROLLBACK");
is( $w1->safe_psql('postgres', "SELECT idem_claim('r-1'), idem_claim('r-2')"),
	't|t', 'rolled back claims are free');

# a key taken from a FROM that the planner folds into the call (a subquery
# without tables, a view, a CTE): Citus would send the call and crash while
# printing it; idem makes the query one Citus does not send, and the call runs
# where it is made
for my $n ($coord, $w1)
{
	my $k = 'sub-' . $n->name;
	is( $n->safe_psql(
			'postgres', qq{
	SELECT idem_claim(k) FROM (VALUES ('$k')) v(k);
	SELECT idem_try_claim(k) FROM (SELECT '$k') v(k);
	WITH v(k) AS (SELECT '$k') SELECT idem_release(k) FROM v;
	WITH x AS (SELECT 1 FROM pg_class) SELECT idem_claim(k) FROM (VALUES ('$k')) v(k);
	PREPARE p(text) AS SELECT idem_claim(k) FROM (SELECT \$1) v(k);
	EXECUTE p('$k');
	EXECUTE p('$k-2');}),
		"t\nduplicate\nt\nt\nf\nt",
		'calls whose key comes from a FROM the planner folds, through ' . $n->name);
}
# (a view and a function, made on the coordinator: Citus takes no DDL on a
# worker)
is( $coord->safe_psql(
		'postgres', q{
	CREATE TEMP VIEW tv AS SELECT 'sub-view'::text AS k;
	SELECT idem_claim(k) FROM tv;
	SELECT idem_claim(k) FROM tv;
	CREATE FUNCTION pg_temp.keys() RETURNS SETOF text LANGUAGE sql STABLE
		AS $$SELECT 'sub-' || relname FROM pg_catalog.pg_class WHERE relname = 'pg_class'$$;
	SELECT idem_claim(k) FROM pg_temp.keys() k;
	SELECT idem_claim(k) FROM (SELECT * FROM pg_temp.keys() LIMIT 1) x(k);}),
	"t\nf\nt\nf", 'calls whose key comes from a view or an inlined function');
# ... and calls the planner folds into a bare call, or that are the FROM
is( $coord->safe_psql(
		'postgres', q{
	SELECT idem_claim(k) AND true FROM (VALUES ('sub-and')) v(k);
	SELECT NOT NOT idem_claim(k) FROM (VALUES ('sub-and')) v(k);
	SELECT CASE WHEN true THEN idem_claim(k) END FROM (VALUES ('sub-case')) v(k);
	CREATE FUNCTION pg_temp.w(k text) RETURNS bool LANGUAGE sql AS $$SELECT idem_claim(k)$$;
	SELECT pg_temp.w(k) FROM (VALUES ('sub-w')) v(k);
	SELECT pg_temp.w('sub-w');
	SELECT * FROM (VALUES ('sub-lat')) v(k), LATERAL idem_claim(k);
	WITH v(k) AS (SELECT 'sub-lat') SELECT c FROM v, idem_claim(k) c;
	SELECT c FROM (VALUES ('sub-lat2')) v(k), idem_claim(k) c WHERE true;
	SELECT * FROM idem_claim('sub-lat2');}),
	"t\nf\nt\nt\nf\nsub-lat|t\nf\nt\nf",
	'calls folded into a bare call, through a SQL function, or in the FROM');

# tokens
my $token = $coord->safe_psql('postgres', "SELECT idem_token_issue('pay')");
is($w1->safe_psql('postgres', "SELECT idem_token_status('$token', 'pay')"),
	'valid', 'token issued through the coordinator, valid on a worker');
$w2->safe_psql('postgres',
	"BEGIN; SELECT idem_token_consume('$token', 'pay'); ROLLBACK");
is($w2->safe_psql('postgres', "SELECT idem_token_consume('$token', 'pay')"),
	't', 'consumed through a worker after a rolled back consumption');
is($coord->safe_psql('postgres', "SELECT idem_token_consume('$token', 'pay')"),
	'f', 'consumed once only');
is($w1->safe_psql('postgres', "SELECT idem_token_status('$token', 'pay')"),
	'consumed', 'status consumed');

# In a parallel query (here forced), the functions that read a distributed
# table: Citus runs no statement in parallel mode, so idem_distribute() made
# them PARALLEL UNSAFE and no parallel plan calls them; they answer as in
# any query, through the coordinator and through a worker.  One made
# PARALLEL SAFE again by hand fails with 0A000, not an internal error (it
# was XX000, "cannot update SecondarySnapshot during a parallel operation").
for my $n ([ $coord, 'the coordinator' ], [ $w1, 'a worker' ], [ $w2, 'the other worker' ])
{
	is( $n->[0]->safe_psql('postgres', q{SELECT string_agg(proname || ' ' || proparallel::text, ',' ORDER BY proname)
		  FROM pg_proc WHERE proname IN ('idem_claim_info', 'idem_token_status', 'idem_offset_get')}),
		'idem_claim_info u,idem_offset_get u,idem_token_status u',
		"the functions that read a distributed table are PARALLEL UNSAFE on $n->[1]");
}
for my $n ([ $coord, 'the coordinator' ], [ $w1, 'a worker' ])
{
	my ($node, $via) = @$n;
	is( $node->safe_psql('postgres', qq{SET force_parallel_mode = on;
		SELECT idem_claim_info('c-1') IS NOT NULL, idem_claim_info('c-none') IS NULL,
		       idem_offset_get('nobody', 's', 0) IS NULL;
		BEGIN ISOLATION LEVEL REPEATABLE READ;
		SELECT idem_token_status('$token', 'pay');
		COMMIT;}),
		"t|t|t\nconsumed", "with force_parallel_mode, through $via, they answer");
}
$coord->safe_psql('postgres', 'ALTER FUNCTION idem_token_status(text, text) PARALLEL SAFE');
is( sqlstate_of($coord, 'postgres', qq{SET force_parallel_mode = on; BEGIN ISOLATION LEVEL REPEATABLE READ;
		SELECT idem_token_status('$token', 'pay')}),
	'0A000', 'made PARALLEL SAFE by hand: 0A000 in a parallel query');
$coord->safe_psql('postgres', 'ALTER FUNCTION idem_claim_info(text, text) PARALLEL SAFE');
# as a node added later has them, from its own CREATE EXTENSION: Citus
# makes no function of an extension anew
$w2->safe_psql('postgres', q{SET citus.enable_ddl_propagation = off;
	ALTER FUNCTION idem_claim_info(text, text) PARALLEL SAFE;
	ALTER FUNCTION idem_offset_get(text, text, int) PARALLEL SAFE;
	ALTER FUNCTION idem_token_status(text, text) PARALLEL SAFE});
my ($drc, $dout, $derr) = $coord->psql('postgres', 'SELECT count(*) FROM idem_distribute()');
is($drc . ' ' . $derr, '0 ', 'idem_distribute() run again, without a warning');
for my $n ([ $coord, 'the coordinator' ], [ $w1, 'a worker' ], [ $w2, 'a worker where they were PARALLEL SAFE' ])
{
	is( $n->[0]->safe_psql('postgres', q{SELECT string_agg(proname || ' ' || proparallel::text, ',' ORDER BY proname)
		  FROM pg_proc WHERE proname IN ('idem_claim_info', 'idem_token_status', 'idem_offset_get')}),
		'idem_claim_info u,idem_offset_get u,idem_token_status u',
		"and the three are PARALLEL UNSAFE again on $n->[1]");
}
is($w1->safe_psql('postgres', "SELECT idem_token_consume('$token', 'other')"),
	'f', 'another scope does not know it');

# request keys, in one transaction each
like( $coord->safe_psql(
		'postgres', q{
	BEGIN;
	SELECT status FROM idem_request_begin('q-1', 'fp');
	SELECT idem_request_finish('q-1', 201, '{"id": 1}');
	COMMIT}),
	qr/^new\n/, 'request begun and finished through the coordinator');
# the request retention is a setting of each node: set on every node
$coord->safe_psql('postgres',
	"SELECT run_command_on_all_nodes(\$\$SELECT idem_request_set_retention('short', '1 minute')\$\$)");
like( $w1->safe_psql(
		'postgres', q{
	BEGIN;
	SELECT status FROM idem_request_begin('q-2', 'fp', 'short');
	SELECT idem_request_finish('q-2', 200, NULL, 'short');
	COMMIT;
	SELECT expires_at - finished_at FROM idem.requests WHERE key = 'q-2'}),
	qr/^new\n.*^00:01:00$/ms, 'the retention set on every node holds on a worker');
is( $w2->safe_psql('postgres',
		"SELECT status, response_code, response_body FROM idem_request_begin('q-1', 'fp')"),
	'replay|201|{"id": 1}', 'replayed through a worker');
is( $w1->safe_psql('postgres',
		"SELECT status FROM idem_request_begin('q-1', 'other')"),
	'mismatch', 'mismatch through a worker');
# a begin answered without writing (replay, in_flight) leaves no lock on the
# row: a transaction still open after it stops neither another session's
# replay and mismatch, nor the owner's finish
{
	my $s = IdemTest::Session->new($w1, 'postgres');
	is($s->query("BEGIN; SELECT status FROM idem_request_begin('q-1', 'fp');"),
		'replay', 'a replay in a transaction left open');
	for my $n ($w2, $coord)
	{
		is($n->safe_psql('postgres', "SELECT status FROM idem_request_begin('q-1', 'fp')"),
			'replay', 'still a replay for another session through ' . $n->name);
		is($n->safe_psql('postgres', "SELECT status FROM idem_request_begin('q-1', 'other')"),
			'mismatch', 'still a mismatch for another session through ' . $n->name);
	}
	# (those begins read without a lock: only a lock taken here shows one;
	# Citus sends the SET LOCAL to the shard's node)
	my ($ret, $out, $err) = $coord->psql(
		'postgres', q{
	SET citus.propagate_set_commands = 'local';
	BEGIN;
	SET LOCAL lock_timeout = '500ms';
	SELECT key FROM idem.requests WHERE ns = 'default' AND key = 'q-1' FOR UPDATE;
	COMMIT});
	is("$out$err", 'q-1', '... and the row is free to lock, through the coordinator');
	$s->query('COMMIT;');
	my $o = IdemTest::Session->new($coord, 'postgres');
	is($o->query("SELECT status FROM idem_request_begin('q-3', 'fp');"), 'new', 'an attempt begun');
	is($s->query("BEGIN; SELECT status FROM idem_request_begin('q-3', 'fp');"),
		'in_flight', 'in flight to a transaction left open');
	is($o->query("SET lock_timeout = '2s'; SELECT idem_request_finish('q-3', 201); SELECT 'ok';"),
		"\nok", 'the owner finishes it without waiting for that transaction');
	$s->query('COMMIT;');
	$s->close;
	$o->close;
}

# a request whose attempt spans transactions belongs to the client session
# that began it, through every node, wherever its key's shard is: Citus's
# connection that ran the begin may close (no cached connection here), and
# the checkpoint and finish may run in another one or where they are made;
# another session's begin, sent by Citus or made where it is, on the node of
# the owner or on another, sees it in flight while the session is connected,
# and resumes it once it has left.  One owner has SET ROLE: Citus connects
# as that role.
sub remote_key
{
	my ($prefix, $n) = @_;
	for my $i (1 .. 100)
	{
		return "$prefix-$i"
		  if placement_port('idem.requests', "'$prefix-$i'") ne $n->port;
	}
	die "no key of $prefix off " . $n->name;
}
# the begins a node ran (idem_stats counts the calls each node runs)
sub begins_counted
{
	my ($n) = @_;
	return $n->safe_psql('postgres',
		"SELECT COALESCE(sum((counters->>'new')::int8), 0) FROM idem_stats"
		  . " WHERE kind = 'request' AND ns = 'default'");
}
$coord->safe_psql('postgres', 'CREATE ROLE tenant LOGIN; CREATE ROLE tenant_app LOGIN; GRANT tenant TO tenant_app');
for my $case ([ $coord, $w1, '' ], [ $w1, $w2, '' ], [ $w2, $coord, '' ], [ $w1, $coord, 'tenant' ])
{
	my ($n, $o, $role) = @$case;
	my $where = 'through ' . $n->name . ($role ? " as $role" : '') . ', seen through ' . $o->name;
	my $k = remote_key("span-$role-" . $n->name, $n);
	my $s = IdemTest::Session->new($n, 'postgres', $role ? ('-U', 'tenant_app') : ());
	$s->query("SET ROLE $role;") if $role;
	my $pid = $s->query("SET citus.max_cached_conns_per_worker = 0; SELECT pg_backend_pid();");
	my %before = map { $_->name => begins_counted($_) } ($coord, $w1, $w2);
	like($s->query("SELECT idem_request_begin('$k', 'fp');"),
		qr/^\(new,/, "an attempt begun by a call Citus sends, $where");
	my $kp = placement_port('idem.requests', "'$k'");
	is( join(' ', map { $_->name . ':' . (begins_counted($_) - $before{ $_->name }) } ($coord, $w1, $w2)),
		join(' ', map { $_->name . ':' . ($_->port eq $kp ? 1 : 0) } ($coord, $w1, $w2)),
		"... which ran on the node of the key's shard, not where it was made, $where");
	is( $coord->safe_psql('postgres',
			"SELECT owner_node = (SELECT nodeid FROM pg_dist_node WHERE nodeport = " . $n->port
			  . "), owner_pid = $pid FROM idem.requests WHERE key = '$k'"),
		't|t', "... owned by the session, not by Citus's connection, $where");
	is($o->safe_psql('postgres', "SELECT status FROM idem_request_begin('$k', 'fp')"),
		'in_flight', "in flight while its session is connected, $where");
	is( $n->safe_psql('postgres',
			"SELECT (idem_request_begin(k, 'fp')).status FROM (SELECT '$k'::text) v(k)"),
		'in_flight', "in flight to a call made on the session's node, $where");
	is($s->query("SELECT idem_request_checkpoint('$k', 'half'); SELECT 'ok';"),
		"\nok", "its session checkpoints it in a later transaction, $where");
	is($s->query("SELECT idem_request_finish(k, 201, '{}') FROM (SELECT '$k'::text) v(k); SELECT 'ok';"),
		"\nok", "... and finishes it in a call made where it is, $where");
	is($o->safe_psql('postgres', "SELECT status, response_code FROM idem_request_begin('$k', 'fp')"),
		'replay|201', "replayed, $where");

	my $g = remote_key("gone-$role-" . $n->name, $n);
	is($s->query("SELECT status FROM idem_request_begin('$g', 'fp');"),
		'new', "another attempt begun $where");
	$s->close;
	$n->poll_query_until('postgres',
		"SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $pid)")
	  or die "the session did not leave";
	is($o->safe_psql('postgres', "SELECT status, recovery_point IS NULL FROM idem_request_begin('$g', 'fp')"),
		'resume|t', "resumed once its session has left, $where");
}

# the application_name that names a connection's client session is not
# authenticated: a connection passes for a session only when that session
# could have become the connection's role, and for a superuser's session
# only as a superuser; another role's connection is its own client
$coord->safe_psql('postgres', 'CREATE ROLE intruder LOGIN');
for my $victim ('postgres', 'tenant_app')
{
	my $k = remote_key("victim-$victim", $coord);
	my $v = IdemTest::Session->new($coord, 'postgres', '-U', $victim);
	my $gpid = $v->query("SET citus.max_cached_conns_per_worker = 0; SELECT citus_backend_gpid();");
	is($v->query("SELECT status FROM idem_request_begin('$k', 'fp');"),
		'new', "an attempt of a session of $victim");
	my $kn = (grep { $_->port eq placement_port('idem.requests', "'$k'") } ($w1, $w2))[0];
	local $ENV{PGAPPNAME} = "citus_internal gpid=$gpid";
	my ($ret, $out, $err) = $kn->psql('postgres',
		"SELECT idem_request_finish('$k', 200)",
		extra_params => [ '-U', 'intruder' ]);
	like($err, qr/is not owned by this session/,
		"another role's connection naming the session of $victim cannot finish its attempt");
	is($v->query("SELECT idem_request_finish('$k', 201); SELECT 'ok';"),
		"\nok", "... which its session still owns ($victim)");
	$v->close;
}

# a connection of Citus whose client session cannot be found fails, and
# writes nothing: the session is gone (08006), its node cannot be reached
# (08006), or is missing from Citus's metadata (55000).  The connection is
# made as Citus makes one, naming the session in its application_name: to
# the node, a session that left while Citus's connection ran its call looks
# the same.
sub as_citus_connection
{
	my ($n, $gpid, $sql) = @_;
	local $ENV{PGAPPNAME} = "citus_internal gpid=$gpid";
	my ($ret, $out, $err) = $n->psql('postgres', "\\set VERBOSITY verbose\n$sql");
	return $err;
}
{
	my $k = remote_key('lost', $coord);
	my $kn = (grep { $_->port eq placement_port('idem.requests', "'$k'") } ($w1, $w2))[0];
	my $s = IdemTest::Session->new($coord, 'postgres');
	my $gpid = $s->query("SELECT citus_backend_gpid();");
	my $pid = $s->query("SELECT pg_backend_pid();");
	$s->close;
	$coord->poll_query_until('postgres',
		"SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $pid)")
	  or die "the session did not leave";
	like(as_citus_connection($kn, $gpid, "SELECT idem_request_begin('$k', 'fp')"),
		qr/ERROR:  08006: the client session of this connection of Citus is gone/,
		'a connection of Citus for a session that has left: 08006');
	like(as_citus_connection($kn, $gpid, "SELECT idem_request_finish('$k', 200)"),
		qr/ERROR:  08006: the client session of this connection of Citus is gone/,
		'... also to finish');

	# a node in the metadata that no connection reaches (nothing listens on
	# its port), removed again
	my $lost = $coord->safe_psql('postgres',
		"SELECT citus_add_inactive_node('" . $coord->host . "', 1)");
	like(as_citus_connection($kn, $lost * 10_000_000_000 + $pid, "SELECT idem_request_begin('$k', 'fp')"),
		qr/ERROR:  08006: could not ask node $lost for the client session/,
		'a connection of Citus for a session of a node that cannot be reached: 08006');
	$coord->safe_psql('postgres', "SELECT citus_remove_node('" . $coord->host . "', 1)");
	# once removed, the node is missing from the metadata: asking again would
	# not help
	like(as_citus_connection($kn, $lost * 10_000_000_000 + $pid, "SELECT idem_request_begin('$k', 'fp')"),
		qr/ERROR:  55000: the client session of this connection of Citus is on node $lost, which is missing from Citus's metadata/,
		'a connection of Citus for a session of a node removed from the metadata: 55000');

	# Citus names a node missing from its metadata 99999999
	like(as_citus_connection($kn, 99_999_999 * 10_000_000_000 + $pid, "SELECT idem_request_begin('$k', 'fp')"),
		qr/ERROR:  55000: the client session of this connection of Citus is on a node missing from Citus's metadata/,
		"a connection of Citus for a session of a node missing from Citus's metadata: 55000");
	is($coord->safe_psql('postgres', "SELECT count(*) FROM idem.requests WHERE key = '$k'"),
		'0', '... none of them begun the attempt');
}

# a begin that meets the attempt of a session whose node cannot be asked
# (in the metadata but unreachable, or missing from it) takes that node to
# keep its sessions: in flight while the lease lasts, resumed once it has
# run out.  The attempt is begun through a worker, and its row then names
# such a node: the session that began it has left, which no node can say.
for my $case ('unreachable', 'missing')
{
	my $k = "unasked-$case";
	my $node = $case eq 'unreachable'
	  ? $coord->safe_psql('postgres', "SELECT citus_add_inactive_node('" . $coord->host . "', 1)")
	  : 99_999;
	my $s = IdemTest::Session->new($w1, 'postgres');
	is($s->query("SELECT status FROM idem_request_begin('$k', 'fp');"),
		'new', "an attempt begun through worker 1 ($case node)");
	$s->close;
	$coord->safe_psql('postgres',
		"UPDATE idem.requests SET owner_node = $node WHERE ns = 'default' AND key = '$k'");
	is($w2->safe_psql('postgres', "SELECT status FROM idem_request_begin('$k', 'fp')"),
		'in_flight', "... of a session of a node that is $case: in flight within its lease");
	$coord->safe_psql('postgres',
		"UPDATE idem.requests SET lease_until = now() - interval '1 second' WHERE ns = 'default' AND key = '$k'");
	is($w2->safe_psql('postgres', "SELECT status FROM idem_request_begin('$k', 'fp')"),
		'resume', "... resumed once its lease has run out ($case node)");
	$coord->safe_psql('postgres', "SELECT citus_remove_node('" . $coord->host . "', 1)")
	  if $case eq 'unreachable';
}

# the owner of idem's tables asks the session's node for its start time: an
# owner that cannot read other roles' start times (not a superuser, without
# pg_read_all_stats) fails a call Citus sends with 42501, until granted
{
	my $k = remote_key('hidden', $coord);
	my $owner = $coord->safe_psql('postgres',
		"SELECT relowner::regrole FROM pg_class WHERE oid = 'idem.requests'::regclass");
	$coord->safe_psql(
		'postgres', q{
	CREATE ROLE idem_owner LOGIN;
	ALTER TABLE idem.requests OWNER TO idem_owner;
	SELECT run_command_on_all_nodes('GRANT USAGE ON SCHEMA idem TO idem_owner')});
	is( $w1->safe_psql('postgres',
			"SELECT relowner::regrole FROM pg_class WHERE oid = 'idem.requests'::regclass"),
		'idem_owner', 'the requests belong to an ordinary role on the workers too');
	my $s = IdemTest::Session->new($coord, 'postgres');
	$s->query("\\set ON_ERROR_STOP 0\n\\set VERBOSITY verbose\nSET citus.max_cached_conns_per_worker = 0;");
	is($s->query("SELECT status FROM idem_request_begin('$k', 'fp');"), '',
		"a call Citus sends, when the tables' owner cannot read the session's start time ...");
	like($s->{err},
		qr/ERROR:  42501: the start time of the client session of this connection of Citus cannot be read/,
		'... fails with 42501');
	$s->{err} = '';
	$coord->safe_psql('postgres', 'GRANT pg_read_all_stats TO idem_owner');
	is($s->query("SELECT status FROM idem_request_begin('$k', 'fp'); SELECT idem_request_finish('$k', 200); SELECT 'ok';"),
		"new\n\nok", '... and runs once the owner has pg_read_all_stats');
	is($s->{err}, '', '... without an error');
	$s->close;
	$coord->safe_psql(
		'postgres', qq{
	ALTER TABLE idem.requests OWNER TO $owner;
	SELECT run_command_on_all_nodes('REVOKE USAGE ON SCHEMA idem FROM idem_owner');
	DROP ROLE idem_owner});
}

# offsets and producer sequences
is( $coord->safe_psql('postgres',
		"SELECT idem_offset_advance('cons', 's', 0, 5), idem_offset_advance('cons', 's', 0, 5)"),
	't|f', 'offsets through the coordinator');
is($w1->safe_psql('postgres', "SELECT idem_offset_get('cons', 's', 0)"),
	'5', 'offset read through a worker');
is( $w2->safe_psql('postgres',
		"SELECT idem_seq_accept('prod', 1), idem_seq_accept('prod', 1)"),
	'accepted|duplicate', 'producer sequence through a worker');

# an ordinary role, without any privilege on idem's tables, through every
# node: the statements run as the tables' owner, as the direct path does
$coord->safe_psql('postgres', 'CREATE ROLE app LOGIN');
# idem_release is an admin function: granted, as an application would be
$coord->safe_psql('postgres', 'GRANT EXECUTE ON FUNCTION idem_release(text, text) TO app');
for my $n ($coord, $w1, $w2)
{
	my $who = 'as app through ' . $n->name;
	my $k = 'u-' . $n->name;
	my $app = sub {
		my ($sql) = @_;
		my ($ret, $out, $err) = $n->psql('postgres', $sql, extra_params => [ '-U', 'app' ]);
		return $ret == 0 ? $out : "error: $err";
	};
	is($app->("SELECT count(*) FROM idem.claims"), "error: psql:<stdin>:1: ERROR:  permission denied for schema idem\nLINE 1: SELECT count(*) FROM idem.claims\n                             ^",
		"no privilege on the tables $who");
	is($app->("SELECT idem_claim('$k'), idem_claim('$k'), idem_try_claim('$k'), idem_try_claim('$k-2')"),
		't|f|duplicate|claimed', "claims and try-claims $who");
	is($app->("SELECT idem_claim_batch(ARRAY['$k', '$k-3']), idem_claim_info('$k') IS NOT NULL"),
		'{f,t}|t', "a batch and claim info $who");
	is($app->("SELECT idem_release('$k'), idem_release('$k'), idem_claim('$k')"),
		't|f|t', "releases $who");
	my $t = $app->("SELECT idem_token_issue('app', '1 hour')");
	is($app->("SELECT idem_token_status('$t', 'app'), idem_token_consume('$t', 'app'), idem_token_consume('$t', 'app')"),
		'valid|t|f', "a token $who");
	like($app->("BEGIN; SELECT status FROM idem_request_begin('$k', 'fp');"
			  . " SELECT idem_request_finish('$k', 201, '{}'); COMMIT;"
			  . " SELECT status, response_code FROM idem_request_begin('$k', 'fp')"),
		qr/^new\n.*^replay\|201$/ms, "a request key $who");
}

sub placement_port
{
	my ($table, $value) = @_;
	return $coord->safe_psql('postgres',
		"SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = "
		  . "get_shard_id_for_distribution_column('$table', $value)");
}

# Waits until a backend of some node waits for a lock: the call just sent
# has reached its wait (a call that arrived after the other session's end
# would not show one).
sub await_lock_wait
{
	my ($what) = @_;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (time() < $deadline)
	{
		for my $n ($coord, $w1, $w2, $w3)
		{
			return pass("$what waits for a lock")
			  if $n->safe_psql('postgres',
				"SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
				  . " AND query LIKE '%idem%'") > 0;
		}
		usleep(100_000);
	}
	return fail("$what waits for a lock");
}

# two sessions on different nodes race on one key: the second waits for the
# first, or reports it in flight; abort and commit of the first
for my $end ('ROLLBACK', 'COMMIT')
{
	my $key = "race-$end";
	my $a = IdemTest::Session->new($coord, 'postgres');
	my $b = IdemTest::Session->new($w2, 'postgres');
	is($a->query("BEGIN; SELECT idem_claim('$key');"), 't', "first session claims ($end)");
	is($b->query("SELECT idem_try_claim('$key');"),
		'in_flight', "try-claim on another node: in flight ($end)");
	$b->{in} .= "SELECT idem_claim('$key');\n";
	$b->{h}->pump_nb;
	await_lock_wait("a claim on another node ($end)");
	$a->query("$end;");
	is($b->query("SELECT 'done';"),
		($end eq 'COMMIT' ? "f\ndone" : "t\ndone"),
		"the waiting claim on another node follows the first's $end");
	$a->close;
	$b->close;
}

# calls that wait on one server wait on Citus too, through every node: a
# release and a token's consumption meet a row another transaction is
# inserting, and follow its end
for my $node ([ 'the coordinator', $coord ], [ 'worker 1', $w1 ], [ 'worker 2', $w2 ])
{
	my ($where, $n) = @$node;
	for my $end ('ROLLBACK', 'COMMIT')
	{
		# a call Citus sends to the key's node, and one it cannot (the key
		# comes from a subquery), which runs where it is made and sends its
		# probe to the key's node
		my ($a, $b);
		for my $how ('sent', 'made here')
		{
			my $key = "wait-$end-" . $n->name . ($how eq 'sent' ? '' : '-here');
			my $call = $how eq 'sent'
			  ? "SELECT idem_release('$key');"
			  : "SELECT idem_release(k) FROM (VALUES ('$key')) v(k);";
			$a = IdemTest::Session->new($coord, 'postgres');
			$b = IdemTest::Session->new($n, 'postgres');
			is($a->query("BEGIN; SELECT idem_claim('$key');"), 't', "claimed, not committed ($end, $where)");
			is($b->query($how eq 'sent' ? "SELECT idem_try_claim('$key');"
					: "SELECT idem_try_claim(k) FROM (VALUES ('$key')) v(k);"),
				'in_flight', "in flight through $where ($end, $how)");
			$b->{in} .= "$call\n";
			$b->{h}->pump_nb;
			await_lock_wait("a release through $where ($end, $how)");
			$a->query("$end;");
			is($b->query("SELECT 'done';"),
				($end eq 'COMMIT' ? "t\ndone" : "f\ndone"),
				"a release through $where waits for the claim's $end ($how)");
			$a->close;
			$b->close;
		}

		# a token call runs where it is made (its argument is the token, not
		# the digest that places it): where the token's shard is, it probes
		# the shard; elsewhere (always on the coordinator, which holds no
		# shard) it sends the probe to the shard's node.  Either way it
		# waits for the issue, as on one server.
		for my $place ('here', 'elsewhere')
		{
			next if $place eq 'here' && $n == $coord;
			$a = IdemTest::Session->new($coord, 'postgres');
			$b = IdemTest::Session->new($n, 'postgres');
			$a->query("BEGIN;");
			my ($tok, $scope, $here);
			for my $i (1 .. 40)
			{
				$scope = "wait-$end-$place-" . $n->name . "-$i";
				$tok = $a->query("SELECT idem_token_issue('$scope', '1 hour');");
				my $digest = $a->query("SELECT digest FROM idem.tokens WHERE scope = '$scope';");
				$here = placement_port('idem.tokens', "'$digest'::bytea") eq $n->port;
				last if ($here ? 'here' : 'elsewhere') eq $place;
			}
			ok(defined $tok && $tok ne '', "token issued, not committed ($end, $where)");
			is($here ? 'here' : 'elsewhere', $place, "a token whose shard is $place, through $where");
			$b->{in} .= "SELECT idem_token_consume('$tok', '$scope');\n";
			$b->{h}->pump_nb;
			await_lock_wait("a consumption through $where, the token's shard $place ($end)");
			$a->query("$end;");
			is($b->query("SELECT 'done';"),
				($end eq 'COMMIT' ? "t\ndone" : "f\ndone"),
				"... waits for the issue's $end");
			$a->close;
			$b->close;
		}
	}
}

# REPEATABLE READ: a statement through Citus judges the row by the
# transaction's snapshot, where one server judges it as it stands.  Where
# the two differ, a call fails with 40001 rather than answer otherwise:
# after waiting for an inserter that commits, through every node ...
sub rr_session
{
	my ($n) = @_;
	my $s = IdemTest::Session->new($n, 'postgres');
	$s->query("\\set ON_ERROR_STOP 0\n\\set VERBOSITY sqlstate\n"
		  . "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;");
	return $s;
}
for my $node ([ 'the coordinator', $coord ], [ 'worker 1', $w1 ], [ 'worker 2', $w2 ])
{
	my ($where, $n) = @$node;
	for my $end ('ROLLBACK', 'COMMIT')
	{
		my $key = "rr-$end-" . $n->name;
		my $a = IdemTest::Session->new($coord, 'postgres');
		my $b = rr_session($n);
		is($a->query("BEGIN; SELECT idem_claim('$key');"), 't', "claimed, not committed (RR, $end, $where)");
		$b->{in} .= "SELECT idem_release('$key');\n";
		$b->{h}->pump_nb;
		await_lock_wait("a release in REPEATABLE READ through $where ($end)");
		$a->query("$end;");
		is($b->query("ROLLBACK; SELECT 'done';"),
			($end eq 'COMMIT' ? "done" : "f\ndone"),
			"a release in REPEATABLE READ through $where after the claim's $end");
		if ($end eq 'COMMIT')
		{
			like($b->{err}, qr/ERROR:  40001/, "... fails with 40001 through $where");
		}
		else
		{
			is($b->{err}, '', "... without an error through $where");
		}
		$a->close;
		$b->close;
	}
}

# ... and with a row committed, or changed, since the snapshot, on the node
# that holds the key's shard (elsewhere a call begins the transaction on the
# shard's node after the change, and sees it)
for my $n ($w1, $w2)
{
	my $where = $n->name;
	my $key = $coord->safe_psql('postgres',
		"SELECT 'rr-since-' || i FROM generate_series(1, 200) i WHERE (SELECT nodeport FROM pg_dist_shard_placement"
		  . " WHERE shardid = get_shard_id_for_distribution_column('idem.claims', 'rr-since-' || i)) = "
		  . $n->port . " ORDER BY i LIMIT 1");
	my $b = rr_session($n);
	$coord->safe_psql('postgres', "SELECT idem_claim('$key')");
	is($b->query("SELECT idem_release('$key');"), '',
		"a release in REPEATABLE READ on $where of a claim committed since the snapshot ...");
	like($b->{err}, qr/ERROR:  40001/, "... fails with 40001");
	$b->query("ROLLBACK;");
	$b->close;

	# a claim there, of a key claimed since the snapshot, fails the same way
	# (where one server answers false), and so does a try-claim
	for my $fn ('idem_claim', 'idem_try_claim')
	{
		my $ck = $coord->safe_psql('postgres',
			"SELECT '$key-$fn-' || i FROM generate_series(1, 200) i WHERE (SELECT nodeport FROM pg_dist_shard_placement"
			  . " WHERE shardid = get_shard_id_for_distribution_column('idem.claims', '$key-$fn-' || i)) = "
			  . $n->port . " ORDER BY i LIMIT 1");
		$b = rr_session($n);
		$coord->safe_psql('postgres', "SELECT idem_claim('$ck')");
		is($b->query("SELECT $fn('$ck');"), '',
			"$fn in REPEATABLE READ on $where of a key claimed since the snapshot ...");
		like($b->{err}, qr/ERROR:  40001/, "... fails with 40001");
		$b->query("ROLLBACK;");
		$b->close;
	}

	my ($tok, $scope);
	for my $i (1 .. 40)
	{
		$scope = "rr-$where-$i";
		$tok = $coord->safe_psql('postgres', "SELECT idem_token_issue('$scope', '1 hour')");
		last if placement_port('idem.tokens',
			"(SELECT digest FROM idem.tokens WHERE scope = '$scope')") eq $n->port;
	}
	$b = rr_session($n);
	$coord->safe_psql('postgres', "SELECT idem_token_consume('$tok', '$scope')");
	is($b->query("SELECT idem_token_status('$tok', '$scope');"), '',
		"a token's status in REPEATABLE READ on $where after its consumption since the snapshot ...");
	like($b->{err}, qr/ERROR:  40001/, "... fails with 40001");
	$b->query("ROLLBACK;");
	$b->close;
}

# with local execution off, a call on the node of its key's shard runs its
# statements in a backend Citus connects to, in a transaction of its own: the
# probe goes there too, and judges the row by that transaction's snapshot
for my $end ('ROLLBACK', 'COMMIT')
{
	my $key = $coord->safe_psql('postgres',
		"SELECT 'rr-off-$end-' || i FROM generate_series(1, 200) i WHERE (SELECT nodeport FROM pg_dist_shard_placement"
		  . " WHERE shardid = get_shard_id_for_distribution_column('idem.claims', 'rr-off-$end-' || i)) = "
		  . $w1->port . " ORDER BY i LIMIT 1");
	my $a = IdemTest::Session->new($coord, 'postgres');
	my $b = IdemTest::Session->new($w1, 'postgres');
	$b->query("\\set ON_ERROR_STOP 0\n\\set VERBOSITY sqlstate\n"
		  . "SET citus.enable_local_execution = off; BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;");
	is($a->query("BEGIN; SELECT idem_claim('$key');"), 't', "claimed, not committed (RR, local execution off, $end)");
	$b->{in} .= "SELECT idem_release('$key');\n";
	$b->{h}->pump_nb;
	await_lock_wait("a release in REPEATABLE READ, local execution off ($end)");
	$a->query("$end;");
	is($b->query("ROLLBACK; SELECT 'done';"),
		($end eq 'COMMIT' ? "done" : "f\ndone"),
		"a release in REPEATABLE READ on the key's node, local execution off, after the claim's $end");
	if ($end eq 'COMMIT')
	{
		like($b->{err}, qr/ERROR:  40001/, '... fails with 40001, as on one server');
	}
	else
	{
		is($b->{err}, '', '... without an error');
	}
	$a->close;
	$b->close;
}

# a transaction that reached its own node's shard through a connection (local
# execution off): the row it inserted there is its own, not waited for
my $lk = $coord->safe_psql(
	'postgres', qq{
	SELECT 'own-' || i FROM generate_series(1, 200) i
	 WHERE (SELECT nodeport FROM pg_dist_shard_placement
	         WHERE shardid = get_shard_id_for_distribution_column('idem.claims', 'own-' || i)) = } . $w1->port . q{
	 ORDER BY i LIMIT 1});
ok($lk ne '', 'a key whose shard is on worker 1');
is( $w1->safe_psql(
		'postgres', qq{
	SET citus.enable_local_execution = off;
	BEGIN;
	SELECT idem_claim('$lk');
	SELECT idem_release('$lk'), idem_try_claim('$lk');
	COMMIT}),
	"t\nt|claimed", 'claim, release and try-claim in one transaction, its shard reached through a connection');

# a transaction touching keys on two workers, which aborts, then commits
my $keys = $coord->safe_psql(
	'postgres', q{
	SELECT string_agg(k, ',') FROM (
	  SELECT DISTINCT ON (p.nodeport) 'x-' || i AS k
	    FROM generate_series(1, 100) i,
	         LATERAL (SELECT nodeport FROM pg_dist_shard_placement
	                   WHERE shardid = get_shard_id_for_distribution_column('idem.claims', 'x-' || i)) p
	   ORDER BY p.nodeport, i) s});
my ($k1, $k2) = split /,/, $keys;
ok(defined $k2, 'two keys on two workers');
my $sess = IdemTest::Session->new($coord, 'postgres');
is( $sess->query(
		"BEGIN; SELECT idem_claim('$k1'), idem_claim('$k2'), idem_try_claim('$k1');"),
	't|t|duplicate', 'claims on two workers in one transaction');
$sess->query('ROLLBACK;');
is( $coord->safe_psql('postgres',
		"SELECT idem_claim_info('$k1') IS NULL AND idem_claim_info('$k2') IS NULL"),
	't', 'the aborted transaction left no claim on either worker');
is( $sess->query(
		"BEGIN; SELECT idem_claim('$k1'), idem_claim('$k2'); SELECT 1/0;"),
	undef, 'a transaction on two workers fails');
$sess->close;
$sess = IdemTest::Session->new($coord, 'postgres');
is( $sess->query("BEGIN; SELECT idem_claim('$k1'), idem_claim('$k2'); COMMIT;"),
	't|t', 'committed on two workers');
$sess->close;
is( $w1->safe_psql('postgres', "SELECT idem_claim('$k1'), idem_claim('$k2')"),
	'f|f', 'both claims of the committed transaction hold');

# a rebalance onto a third worker while claims stream in, through the
# coordinator and, of the same keys in the same order, through worker 1.
# The streams run until the rebalance has ended (they stop when a file is
# made then, looked for every 20 claims), and the claims made while shards
# moved are those whose claimed_at, the start of their transaction, falls
# within the rebalance.
my $n    = 100_000;
my $dir  = $PostgreSQL::Test::Utils::tmp_check;
my $stop = "$dir/stream.stop";
append_to_file("$dir/stream.sql",
	join('', map {
		"SELECT idem_claim('s-$_');\n"
		  . ($_ % 20 ? '' : "\\set stop `test -f $stop && echo 1 || echo 0`\n\\if :stop\n\\q\n\\endif\n")
	} 1 .. $n));
my %stream = map {
	my $name = $_->name;
	($name => IPC::Run::start(
		[ 'psql', '-XAtq', '-f', "$dir/stream.sql", '-d', $_->connstr('postgres') ],
		'>', "$dir/stream-$name.out", '2>', "$dir/stream-$name.err"))
} ($coord, $w1);
$coord->poll_query_until('postgres',
	"SELECT count(*) >= 200 FROM idem.claims WHERE msg_id LIKE 's-%'")
  or die 'the stream of claims did not start';
$coord->safe_psql('postgres',
	"SELECT citus_add_node('" . $w3->host . "', " . $w3->port . ")");
# a session of the third worker, before it holds any shard: its token call
# finds no placement there (and remembers it)
my $s3 = IdemTest::Session->new($w3, 'postgres');
my $t3 = $coord->safe_psql('postgres', "SELECT idem_token_issue('w3', '1 hour')");
is($s3->query("SELECT idem_token_consume('$t3', 'w3');"), 't',
	'a token consumed on the third worker before it holds shards');
my $rebalance_start = $coord->safe_psql('postgres', 'SELECT clock_timestamp()');
$coord->safe_psql('postgres',
	"SELECT rebalance_table_shards(shard_transfer_mode := 'block_writes')");
my $rebalance_end = $coord->safe_psql('postgres', 'SELECT clock_timestamp()');
append_to_file($stop, '');
$_->finish for values %stream;
my %res;
for my $name (sort keys %stream)
{
	is(slurp_file("$dir/stream-$name.err"), '', "the stream of claims through $name saw no error");
	$res{$name} = [ split /\n/, slurp_file("$dir/stream-$name.out") ];
	my $got = scalar @{ $res{$name} };
	ok($got > 0 && $got < $n && $got % 20 == 0,
		"the stream through $name ran until it was stopped after the rebalance ($got claims)");
}
my $m = max(map { scalar @$_ } values %res);
my $during = $coord->safe_psql('postgres',
	"SELECT count(*) FROM idem.claims WHERE msg_id LIKE 's-%'"
	  . " AND claimed_at BETWEEN '$rebalance_start' AND '$rebalance_end'");
ok($during > 0, "claims of the streams were made while the shards moved ($during of $m)");
# each key claimed by both streams, or by the one that got further, was new
# to exactly one of them
my @twice = grep {
	my $i = $_;
	scalar(grep { ($_->[$i] // 'f') eq 't' } values %res) != 1
} 0 .. $m - 1;
is("@twice[0 .. min(9, $#twice)]", '', 'each key of the streams answered new exactly once');
is( $coord->safe_psql('postgres',
		"SELECT count(*) FROM idem.claims WHERE msg_id LIKE 's-%'"),
	$m, 'no claim of the streams lost');
is( $coord->safe_psql(
		'postgres', q{
	SELECT count(*) > 0 FROM pg_dist_shard_placement p JOIN pg_dist_shard s USING (shardid)
	 WHERE s.logicalrelid = 'idem.claims'::regclass AND p.nodeport = } . $w3->port),
	't', 'shards of the claims moved to the third worker');
is( $w3->safe_psql('postgres',
		"SELECT count(*) FROM generate_series(1, $m) i WHERE idem_claim('s-' || i)"),
	'0', 'none given twice, through the third worker');

# the same session, once the rebalance has moved shards onto its node,
# probes them: a consumption of a token being issued there waits for it
{
	my $a = IdemTest::Session->new($coord, 'postgres');
	my ($tok, $scope, $here);
	$a->query("BEGIN;");
	for my $i (1 .. 40)
	{
		$scope = "w3-moved-$i";
		$tok = $a->query("SELECT idem_token_issue('$scope', '1 hour');");
		my $digest = $a->query("SELECT digest FROM idem.tokens WHERE scope = '$scope';");
		$here = placement_port('idem.tokens', "'$digest'::bytea") eq $w3->port;
		last if $here;
	}
	ok($here, 'a token whose shard moved to the third worker');
	$s3->{in} .= "SELECT idem_token_consume('$tok', '$scope');\n";
	$s3->{h}->pump_nb;
	await_lock_wait('a consumption on the third worker, after shards moved there');
	$a->query("COMMIT;");
	is($s3->query("SELECT 'done';"), "t\ndone",
		'... waits for the issue and consumes the token');
	$a->close;
	$s3->close;
}

# the guard refuses a distributed business table, clearly
$coord->safe_psql(
	'postgres', q{
	CREATE TABLE orders (id int PRIMARY KEY, state text NOT NULL, version int8 NOT NULL DEFAULT 0);
	SELECT create_distributed_table('orders', 'id');
	INSERT INTO orders VALUES (1, 'new', 0);
	SELECT idem_allow('ord', 'new', 'paid')});
is(sqlstate_of($coord, 'postgres', "SELECT idem_guard('orders', 'ord', 'state', 'version')"),
	'0A000', 'idem_guard on a distributed table: 0A000');
# a backend has room for ten relcache callbacks, which Citus and PostgreSQL's
# own caches nearly fill: a fresh session that reads a distributed table,
# maps a relfilenode and guards a local table (each registers one) stays up
like( $coord->safe_psql(
		'postgres', q{
	SELECT count(*) >= 0 FROM idem.claims;
	SELECT pg_filenode_relation(0, pg_relation_filenode('pg_class')) = 'pg_class'::regclass;
	CREATE TABLE lorders (id int PRIMARY KEY, state text NOT NULL, version int8 NOT NULL DEFAULT 0);
	SELECT idem_guard('lorders', 'ord', 'state', 'version');
	INSERT INTO lorders VALUES (1, 'new');
	SELECT idem_transition('lorders', '1', 'paid');
	DROP TABLE lorders;
	SELECT 'alive'}),
	qr/^t\nt\n\napplied\nalive$/,
	'a session that fills the relcache callbacks of Citus and PostgreSQL also guards a local table');
is(sqlstate_of($coord, 'postgres', "SELECT idem_transition('orders', '1', 'paid')"),
	'0A000', 'idem_transition on a distributed table: 0A000');
is($coord->safe_psql('postgres', 'SELECT state FROM orders'), 'new', 'the row is untouched');

# a session that asked about a local table learns that it became distributed
$coord->safe_psql(
	'postgres', q{
	CREATE TABLE orders2 (id int PRIMARY KEY, state text NOT NULL, version int8 NOT NULL DEFAULT 0);
	INSERT INTO orders2 VALUES (1, 'new', 0);
	CREATE FUNCTION sqlstate_of(q text) RETURNS text LANGUAGE plpgsql AS $$
	BEGIN EXECUTE q; RETURN 'ok'; EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END $$});
my $gs = IdemTest::Session->new($coord, 'postgres');
my $move = q{SELECT sqlstate_of($$SELECT idem_transition('orders2', '1', 'paid')$$);};
is($gs->query($move), '55000', 'idem_transition on a local table that is not guarded: 55000');
$coord->safe_psql('postgres', "SELECT create_distributed_table('orders2', 'id')");
is($gs->query($move), '0A000', 'the same session, once the table is distributed: 0A000');
$gs->close;

# purges: a node purges the shards it holds, and a purge on the coordinator
# asks every worker too; retentions are each node's own.  Expired rows
# ('old-', then 'm-') lie beside rows each purge must keep: younger claims,
# unexpired tokens and requests ('keep-'), the expired claims of a namespace
# the purge does not name ('aside'), and every other row of the test.
sub expired_rows
{
	my ($prefix) = @_;
	$coord->safe_psql(
		'postgres', qq{
	SELECT count(idem_claim('$prefix' || g, 'old')) FROM generate_series(1, 40) g;
	UPDATE idem.claims SET claimed_at = '2000-01-01' WHERE ns = 'old' AND msg_id LIKE '$prefix%';
	SELECT count(idem_token_issue('$prefix' || g, '1 hour')) FROM generate_series(1, 40) g;
	UPDATE idem.tokens SET expires_at = '2000-01-01' WHERE scope LIKE '$prefix%';
	DO \$\$
	BEGIN
		FOR g IN 1 .. 40 LOOP
			PERFORM idem_request_begin('$prefix' || g, 'fp', 'old');
			PERFORM idem_request_finish('$prefix' || g, 200, NULL, 'old');
		END LOOP;
	END \$\$;
	UPDATE idem.requests SET expires_at = '2000-01-01' WHERE ns = 'old' AND key LIKE '$prefix%'});
	return;
}
# those rows of each kind: kind => { row => port of its node }
sub purge_rows
{
	my %rows;
	for (split /\n/, $coord->safe_psql(
			'postgres', q{
		SELECT kind, r, (SELECT nodeport FROM pg_dist_shard_placement p WHERE p.shardid = s) FROM (
		  SELECT 'claims', ns || '/' || msg_id, get_shard_id_for_distribution_column('idem.claims', msg_id)
		    FROM idem.claims WHERE ns IN ('old', 'aside')
		  UNION ALL
		  SELECT 'tokens', scope, get_shard_id_for_distribution_column('idem.tokens', digest)
		    FROM idem.tokens WHERE scope ~ '^(old|m|keep)-'
		  UNION ALL
		  SELECT 'requests', key, get_shard_id_for_distribution_column('idem.requests', key)
		    FROM idem.requests WHERE ns = 'old') x(kind, r, s)}))
	{
		my ($kind, $r, $port) = split /\|/;
		$rows{$kind}{$r} = $port;
	}
	return \%rows;
}
# the rows as text, but those for which $gone->(kind, row, port) is true
sub rows_text
{
	my ($rows, $gone) = @_;
	$gone //= sub { 0 };
	return join "\n", map {
		my $k = $_;
		"$k: " . join ' ', sort grep { !$gone->($k, $_, $rows->{$k}{$_}) } keys %{ $rows->{$k} // {} };
	} ('claims', 'tokens', 'requests');
}
my $others_q = q{
	SELECT md5(string_agg(ns || '/' || msg_id, ' ' ORDER BY ns COLLATE "C", msg_id COLLATE "C"))
	  FROM idem.claims WHERE ns NOT IN ('old', 'aside')
	UNION ALL
	SELECT md5(string_agg(ns || '/' || key, ' ' ORDER BY ns COLLATE "C", key COLLATE "C"))
	  FROM idem.requests WHERE ns NOT IN ('old', 'short')};
my $others = $coord->safe_psql('postgres', $others_q);

$coord->safe_psql(
	'postgres', q{
	SELECT run_command_on_all_nodes($$SELECT idem_set_retention('old', '1 hour')$$);
	SELECT count(idem_claim('old-' || g, 'aside')) FROM generate_series(1, 40) g;
	UPDATE idem.claims SET claimed_at = '2000-01-01' WHERE ns = 'aside';
	SELECT count(idem_claim('keep-' || g, 'old')) FROM generate_series(1, 10) g;
	SELECT count(idem_token_issue('keep-' || g, '1 hour')) FROM generate_series(1, 10) g;
	DO $$
	BEGIN
		FOR g IN 1 .. 10 LOOP
			PERFORM idem_request_begin('keep-' || g, 'fp', 'old');
			PERFORM idem_request_finish('keep-' || g, 200, NULL, 'old');
		END LOOP;
	END $$});
expired_rows('old-');
my $rows = purge_rows();
my $w1_old = sub { my ($k, $r, $port) = @_; $k eq 'claims' && $r =~ m{^old/old-} && $port eq $w1->port };
my $on_w1 = scalar grep { $w1_old->('claims', $_, $rows->{claims}{$_}) } keys %{ $rows->{claims} };
ok($on_w1 > 0 && $on_w1 < 40, "worker 1 holds some of the expired claims ($on_w1 of 40)");
is($w1->safe_psql('postgres', "SELECT idem_purge('old', 1000)"), $on_w1,
	'a purge on worker 1 deletes the expired claims of its shards');
is(rows_text(purge_rows()), rows_text($rows, $w1_old), '... those, and no other row');
is($coord->safe_psql('postgres', "SELECT idem_purge('old', 1000)"), 40 - $on_w1,
	'a purge on the coordinator deletes those of every other worker');
my $old_claim = sub { my ($k, $r) = @_; $k eq 'claims' && $r =~ m{^old/old-} };
is(rows_text(purge_rows()), rows_text($rows, $old_claim),
	"... those, and no other row: the younger claims and the other namespace's are kept");
is($coord->safe_psql('postgres', 'SELECT idem_token_purge(1000) >= 40, idem_request_purge(1000) >= 40'),
	't|t', 'expired tokens and requests purged from the coordinator');
my $old_any = sub { my ($k, $r) = @_; $old_claim->(@_) || ($k ne 'claims' && $r =~ /^old-/) };
is(rows_text(purge_rows()), rows_text($rows, $old_any),
	'... on every node, and no unexpired one');

# a maintenance round on a worker purges the expired rows of its shards, of
# every kind and namespace (the claims of 'aside' are older than the default
# retention); one on the coordinator purges those of every other node
expired_rows('m-');
$rows = purge_rows();
my $expired = sub { my ($k, $r) = @_; $k eq 'claims' ? $r =~ m{^(old/m-|aside/)} : $r =~ /^m-/ };
my $w2_expired = sub { my ($k, $r, $port) = @_; $expired->(@_) && $port eq $w2->port };
my %on_w2 = map {
	my $k = $_;
	($k => scalar grep { $w2_expired->($k, $_, $rows->{$k}{$_}) } keys %{ $rows->{$k} })
} ('claims', 'tokens', 'requests');
my $aside_on_w2 = scalar grep { m{^aside/} && $rows->{claims}{$_} eq $w2->port } keys %{ $rows->{claims} };
ok($aside_on_w2 > 0 && $on_w2{claims} > $aside_on_w2 && $on_w2{requests} > 0,
	"worker 2 holds expired claims of both namespaces and expired requests ($on_w2{claims}, $on_w2{requests}; $on_w2{tokens} tokens)");
# (other tokens and requests of the test may have expired by now: only the
# claims are counted exactly)
is( $w2->safe_psql('postgres',
		"SELECT string_agg(kind || ' ' || CASE WHEN kind = 'tokens' THEN (purged >= $on_w2{tokens})::text"
		  . " WHEN kind = 'requests' THEN (purged >= $on_w2{requests})::text ELSE purged::text END,"
		  . " ',' ORDER BY kind) FROM idem_maintenance()"),
	"claims $on_w2{claims},outbox_keys 0,requests true,tokens true",
	'a maintenance round on a worker purges the expired rows of its shards');
is(rows_text(purge_rows()), rows_text($rows, $w2_expired), '... those, and no other row');
is($coord->safe_psql('postgres', 'SELECT string_agg(kind, \',\' ORDER BY kind) FROM idem_maintenance()'),
	'claims,outbox_keys,requests,tokens', 'a maintenance round on the coordinator');
is(rows_text(purge_rows()), rows_text($rows, $expired),
	'... purges the expired rows of every other node, and no other row');
is($coord->safe_psql('postgres', $others_q), $others,
	'the claims and requests of the other namespaces are all kept');

# each worker purges by its own settings, in a transaction of its own:
# max_rows bounds what each deletes (over all its shards), a retention set
# otherwise on one of them keeps its claims there, and what the others
# deleted stays deleted when the coordinator's transaction rolls back
sub per_node
{
	my %c = split /[|\n]/, $coord->safe_psql(
		'postgres', q{
	SELECT (SELECT nodeport FROM pg_dist_shard_placement p WHERE p.shardid = x.s), count(*) FROM (
	  SELECT get_shard_id_for_distribution_column('idem.claims', msg_id)
	    FROM idem.claims WHERE ns = 'per') x(s)
	 GROUP BY 1});
	return join ' ', map { $_->name . ' ' . ($c{ $_->port } // 0) } ($w1, $w2, $w3);
}
$coord->safe_psql(
	'postgres', q{
	SELECT run_command_on_all_nodes($$SELECT idem_set_retention('per', '1 hour')$$);
	SELECT count(idem_claim('per-' || g, 'per')) FROM generate_series(1, 80) g;
	UPDATE idem.claims SET claimed_at = '2000-01-01' WHERE ns = 'per'});
my %per = split / /, per_node();
ok(!grep({ $_ <= 5 } values %per), 'each worker holds more than 5 expired claims of a namespace (' . per_node() . ')');
is( $coord->safe_psql('postgres',
		"SELECT count(*) >= 2 FROM pg_dist_shard_placement p JOIN pg_dist_shard s USING (shardid)"
		  . " WHERE s.logicalrelid = 'idem.claims'::regclass GROUP BY nodeport ORDER BY 1 DESC LIMIT 1"),
	't', '... one of them in two shards');
is($coord->safe_psql('postgres', "SELECT idem_purge('per', 5)"), '15',
	'a purge with max_rows 5 on the coordinator deletes 15 claims');
is(per_node(), join(' ', map { "$_ " . ($per{$_} - 5) } ('w1', 'w2', 'w3')),
	'... 5 on each worker');
$w2->safe_psql('postgres', "SELECT idem_set_retention('per', '50 years')");
$coord->safe_psql(
	'postgres', q{
	SELECT count(idem_claim('per-more-' || g, 'per')) FROM generate_series(1, 80) g;
	UPDATE idem.claims SET claimed_at = '2000-01-01' WHERE ns = 'per'});
%per = split / /, per_node();
ok(!grep({ $_ == 0 } values %per), 'each worker holds expired claims again (' . per_node() . ')');
my ($ret, $out, $err) = $coord->psql('postgres', "BEGIN; SELECT idem_purge('per', 1000); ROLLBACK");
is("$out$err", $per{w1} + $per{w3},
	"a purge in a transaction on the coordinator deletes the claims of workers 1 and 3 ...");
is(per_node(), "w1 0 w2 $per{w2} w3 0", '... which stay deleted though the transaction rolls back');
is($coord->safe_psql('postgres', "SELECT idem_purge('per', 1000)"), '0',
	"a purge on the coordinator deletes none of worker 2's ...");
is(per_node(), "w1 0 w2 $per{w2} w3 0", '... younger than its own retention there');

# a try-claim meeting a shard being moved with block_writes reports the key
# in flight rather than wait for the move, through every node, sent by
# Citus or made where it is: the move is held open in its transaction (it
# blocks writes to the shard until then), from a worker with two shards of
# the claims to one with fewer
{
	my ($src, $dst) = split /\|/, $coord->safe_psql(
		'postgres', q{
	WITH c AS (
	  SELECT n.nodeport, count(s.shardid) AS shards
	    FROM pg_dist_node n
	    LEFT JOIN pg_dist_placement p ON p.groupid = n.groupid
	    LEFT JOIN pg_dist_shard s ON s.shardid = p.shardid AND s.logicalrelid = 'idem.claims'::regclass
	   WHERE n.shouldhaveshards AND n.isactive AND n.noderole = 'primary'
	   GROUP BY n.nodeport)
	SELECT (SELECT nodeport FROM c ORDER BY shards DESC, nodeport LIMIT 1),
	       (SELECT nodeport FROM c ORDER BY shards, nodeport LIMIT 1)});
	my ($from) = grep { $_->port eq $src } ($w1, $w2, $w3);
	my ($to)   = grep { $_->port eq $dst } ($w1, $w2, $w3);
	my $mk = $coord->safe_psql('postgres',
		"SELECT 'moving-' || i FROM generate_series(1, 200) i WHERE (SELECT nodeport FROM pg_dist_shard_placement"
		  . " WHERE shardid = get_shard_id_for_distribution_column('idem.claims', 'moving-' || i)) = $src"
		  . " ORDER BY i LIMIT 1");
	is( $coord->safe_psql('postgres',
			"SELECT count(*) >= 2 FROM pg_dist_shard_placement p JOIN pg_dist_shard s USING (shardid)"
			  . " WHERE s.logicalrelid = 'idem.claims'::regclass AND p.nodeport = $src"),
		't', 'a worker with two shards of the claims, to move one of them from');
	# a key of the same shard, and a REPEATABLE READ transaction on the
	# source worker whose snapshot predates the move
	my $rk = $coord->safe_psql('postgres',
		"SELECT 'rr-moved-' || i FROM generate_series(1, 1000) i"
		  . " WHERE get_shard_id_for_distribution_column('idem.claims', 'rr-moved-' || i)"
		  . " = get_shard_id_for_distribution_column('idem.claims', '$mk') ORDER BY i LIMIT 1");
	my $rr = rr_session($from);
	my $m = IdemTest::Session->new($coord, 'postgres');
	is( $m->query(
			"BEGIN; SELECT citus_move_shard_placement(get_shard_id_for_distribution_column('idem.claims', '$mk'), '"
			  . $from->host . "', $src, '" . $to->host . "', $dst, 'block_writes'); SELECT 'moved';"),
		"\nmoved", 'a shard moved with block_writes, in a transaction still open');
	for my $n ($coord, $w1, $w2, $w3)
	{
		my ($ret, $out, $err) = $n->psql('postgres',
			"SELECT idem_try_claim('$mk'); SELECT idem_try_claim(k) FROM (VALUES ('$mk')) v(k)");
		is("$out$err", "in_flight\nin_flight", 'try-claims during the move, sent and made through ' . $n->name);
	}
	$m->query('COMMIT;');
	$m->close;
	is(placement_port('idem.claims', "'$mk'"), $dst, 'the move committed');
	is($w1->safe_psql('postgres', "SELECT idem_try_claim('$mk'), idem_try_claim('$mk')"),
		'claimed|duplicate', '... and the key is free to claim, once');
	# the transaction whose snapshot still shows the shard on its node finds
	# it where it is now: its release waits for a claim in flight there, and
	# fails with 40001 once that commits, as without the move
	my $x = IdemTest::Session->new($coord, 'postgres');
	is($x->query("BEGIN; SELECT idem_claim('$rk');"), 't', 'a key of the moved shard claimed, not committed');
	$rr->{in} .= "SELECT idem_release(k) FROM (VALUES ('$rk')) v(k);\n";
	$rr->{h}->pump_nb;
	await_lock_wait('a release in REPEATABLE READ on the source worker of the move');
	$x->query('COMMIT;');
	is($rr->query("ROLLBACK; SELECT 'done';"), 'done',
		'... after the claim committed');
	like($rr->{err}, qr/ERROR:  40001/, '... fails with 40001, as on the shard the move left');
	$x->close;
	$rr->close;
}

# DROP EXTENSION cleans every node (once the shards a move left behind are
# dropped, as Citus does in the background)
$coord->safe_psql('postgres', 'CALL citus_cleanup_orphaned_resources()');
$coord->safe_psql('postgres', 'DROP EXTENSION idem');
for my $node ($coord, $w1, $w2, $w3)
{
	is( $node->safe_psql(
			'postgres', q{
		SELECT (SELECT count(*) FROM pg_extension WHERE extname = 'idem')
		     + (SELECT count(*) FROM pg_namespace WHERE nspname = 'idem')
		     + (SELECT count(*) FROM pg_class WHERE relname ~ '^(claims|tokens|requests|offsets|producer_seqs)(_[0-9]+)?$')}),
		'0', 'nothing of idem left on ' . $node->name);
}

$_->stop for ($coord, $w1, $w2, $w3);
done_testing();
