
# Copyright (c) idem contributors
#
# idem's state across a failover to a synchronous hot standby: what was
# committed on the primary is readable on the standby and still there after
# promotion, the standby refuses writes with SQLSTATE 25006, and what a
# transaction still open on the primary wrote is gone after promotion even
# though its WAL reached the standby.
#
# Each entry of @kinds is one kind of state:
#   setup      SQL run on the primary, committed; it prints setup_out
#   check      SQL whose output must be the same on the primary before the
#              failover, on the standby and on the promoted standby
#   standby    [SQL, expected output, description] read-only queries run on
#              the standby
#   writes     [SQL, description] each must fail on the standby with 25006
#   open       SQL run in a transaction left open on the primary when it is
#              stopped; it prints open_out while the primary is up, and
#              open_rows is how many rows it wrote in the tables of the
#              schemas idem and public
#   in_flight  [SQL, expected output] run on the primary while "open" is
#              still open: the open writes are held
#   standby_in_flight
#              [SQL, expected output] run on the standby once the WAL of
#              the open writes was replayed there: they are not seen
#   promoted   [SQL, expected output, description] run on the promoted
#              standby, in order (they may change state)
#   promoted_errors
#              [SQL, SQLSTATE, description] run on the promoted standby
#              after the above, each must fail with SQLSTATE
# A new capability adds one entry.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

# The 1,000 ids of the batch, as an array.
my $batch = q{ARRAY(SELECT 'b-' || g FROM generate_series(1, 1000) g)};

my @kinds = (
	{
		name => 'claims',
		# Three transactions: one by one, a batch, several namespaces.
		setup => qq{
			SELECT idem_claim('m-1'), idem_claim('m-2');
			SELECT count(*) FILTER (WHERE r), count(*)
			  FROM unnest(idem_claim_batch($batch, 'bulk')) r;
			SELECT idem_claim('m-1', 'orders'), idem_try_claim('m-3', 'orders'),
			       idem_claim_batch(ARRAY['m-4', 'm-4'], 'payments');},
		setup_out => "t|t\n1000|1000\nt|claimed|{t,f}",
		check     => q{
			SELECT ns, count(*),
			       md5(string_agg(msg_id || ' ' || claimed_at::text, ','
			                      ORDER BY msg_id))
			  FROM idem.claims GROUP BY ns ORDER BY ns},
		standby => [
			[
				q{SELECT idem_claim_info('m-1') IS NOT NULL,
				         idem_claim_info('m-2') IS NOT NULL,
				         idem_claim_info('b-1000', 'bulk') IS NOT NULL,
				         idem_claim_info('m-1', 'orders') IS NOT NULL,
				         idem_claim_info('m-3', 'orders') IS NOT NULL,
				         idem_claim_info('m-4', 'payments') IS NOT NULL},
				't|t|t|t|t|t',
				'committed claims are seen by idem_claim_info'
			],
			[
				q{SELECT idem_claim_info('m-3') IS NULL,
				         idem_claim_info('m-2', 'orders') IS NULL,
				         idem_claim_info('b-1001', 'bulk') IS NULL},
				't|t|t',
				'ids never claimed have no claim'
			],
			[
				q{SELECT idem_claim_info('m-1') =
				           (SELECT claimed_at FROM idem.claims
				             WHERE ns = 'default' AND msg_id = 'm-1')},
				't',
				'idem_claim_info gives the claim time of the table'
			],
		],
		writes => [
			[ q{SELECT idem_claim('m-1')},                'idem_claim of a claimed id' ],
			[ q{SELECT idem_claim('new-on-standby')},     'idem_claim of a new id' ],
			[ q{SELECT idem_try_claim('new-on-standby')}, 'idem_try_claim' ],
			[
				q{SELECT idem_claim_batch(ARRAY['new-on-standby'], 'bulk')},
				'idem_claim_batch'
			],
			[ q{SELECT idem_release('m-1')},                'idem_release' ],
			[ q{SELECT idem_set_retention('bulk', '1 day')}, 'idem_set_retention' ],
			[ q{SELECT idem_purge()},                       'idem_purge' ],
		],
		open => q{
			SELECT idem_claim('open-1');
			SELECT idem_claim_batch(ARRAY['open-2', 'open-3'], 'orders');},
		open_out  => "t\n{t,t}",
		open_rows => 3,
		in_flight => [
			q{SELECT idem_try_claim('open-1'), idem_try_claim('open-3', 'orders'),
			         idem_claim_info('open-1') IS NULL},
			'in_flight|in_flight|t'
		],
		promoted => [
			[
				q{SELECT idem_claim('m-1'), idem_claim('m-2'),
				         idem_claim('m-1', 'orders'), idem_claim('m-3', 'orders'),
				         idem_try_claim('m-4', 'payments'),
				         idem_claim_info('m-1') IS NOT NULL},
				'f|f|f|f|duplicate|t',
				'a redelivered message is a duplicate'
			],
			[
				qq{SELECT count(*) FILTER (WHERE r), count(*)
				     FROM unnest(idem_claim_batch($batch, 'bulk')) r},
				'0|1000',
				'every id of the batch is a duplicate'
			],
			[
				q{SELECT idem_claim('m-3'), idem_claim('m-3'),
				         idem_try_claim('b-1001', 'bulk'),
				         idem_claim_batch(ARRAY['m-2', 'm-5'], 'orders')},
				't|f|claimed|{t,t}',
				'new ids claim'
			],
			[
				q{SELECT idem_claim_info('open-1') IS NULL,
				         idem_try_claim('open-1'),
				         idem_claim('open-2', 'orders'),
				         idem_claim('open-3', 'orders')},
				't|claimed|t|t',
				'claims of the transaction left open on the old primary are not there'
			],
			[
				q{SELECT idem_release('m-1'), idem_claim('m-1')},
				't|t',
				'the promoted standby releases a claim'
			],
		],
	},

	{
		name => 'single-use tokens',
		# The tokens are kept in a table of their own, which replicates too.
		setup => q{
			CREATE TABLE fo_tokens (name text PRIMARY KEY, token text NOT NULL);
			INSERT INTO fo_tokens
			SELECT n, idem_token_issue('fo', '1 day')
			  FROM unnest(ARRAY['consumed', 'open', 'valid']) n;
			SELECT idem_token_consume(token, 'fo') FROM fo_tokens
			 WHERE name = 'consumed';},
		setup_out => 't',
		check     => q{
			SELECT count(*), count(consumed_at),
			       md5(string_agg(encode(digest, 'hex') || ' ' || expires_at
			                      || ' ' || coalesce(consumed_at::text, '-'),
			                      ',' ORDER BY digest))
			  FROM idem.tokens WHERE scope = 'fo'},
		standby => [
			[
				q{SELECT string_agg(name || '=' || idem_token_status(token, 'fo'),
				                    ',' ORDER BY name)
				    FROM fo_tokens},
				'consumed=consumed,open=valid,valid=valid',
				'idem_token_status tells consumed from valid'
			],
		],
		writes => [
			[
				q{SELECT idem_token_consume(token, 'fo') FROM fo_tokens
				   WHERE name = 'valid'},
				'idem_token_consume'
			],
			[ q{SELECT idem_token_issue('fo')}, 'idem_token_issue' ],
			[ q{SELECT idem_token_purge()},     'idem_token_purge' ],
		],
		open => q{
			SELECT idem_token_consume(token, 'fo') FROM fo_tokens
			 WHERE name = 'open';},
		open_out  => 't',
		open_rows => 1,
		in_flight => [
			q{SELECT idem_token_status(token, 'fo') FROM fo_tokens
			   WHERE name = 'open'},
			'valid'
		],
		promoted => [
			[
				q{SELECT string_agg(name || '=' || idem_token_status(token, 'fo'),
				                    ',' ORDER BY name)
				    FROM fo_tokens},
				'consumed=consumed,open=valid,valid=valid',
				'the consumed token is consumed, the others valid'
			],
			[
				q{SELECT idem_token_consume(token, 'fo') FROM fo_tokens
				   WHERE name = 'consumed'},
				'f',
				'a consumed token is not consumed again'
			],
			[
				q{SELECT idem_token_consume(token, 'fo'),
				         idem_token_consume(token, 'fo')
				    FROM fo_tokens WHERE name = 'valid'},
				't|f',
				'a valid token is consumed once'
			],
			[
				q{SELECT idem_token_consume(token, 'fo') FROM fo_tokens
				   WHERE name = 'open'},
				't',
				'the consumption left open on the old primary is not there'
			],
			[
				q{SELECT length(idem_token_issue('fo'))},
				'51',
				'the promoted standby issues tokens'
			],
		],
	},

	{
		name => 'state-transition guard',
		setup => q{
			SELECT idem_allow('fo', 'new', 'paid'), idem_allow('fo', 'paid', 'shipped');
			CREATE TABLE fo_orders (id integer PRIMARY KEY, state text NOT NULL,
			                        version bigint NOT NULL DEFAULT 0);
			INSERT INTO fo_orders (id, state)
			SELECT g, 'new' FROM generate_series(1, 3) g;
			SELECT idem_guard('fo_orders', 'fo', 'state', 'version');
			SELECT idem_transition('fo_orders', '1', 'paid');},
		setup_out => "t|t\n\napplied",
		check     => q{
			SELECT string_agg(from_state || '>' || to_state, ','
			                  ORDER BY from_state, to_state)
			  FROM idem.transitions WHERE machine = 'fo';
			SELECT string_agg(id || ':' || state || ':' || version, ','
			                  ORDER BY id)
			  FROM fo_orders;
			SELECT tgname FROM pg_trigger WHERE tgrelid = 'fo_orders'::regclass},
		standby => [],
		writes  => [
			[ q{SELECT idem_transition('fo_orders', '2', 'paid')}, 'idem_transition' ],
			[ q{SELECT idem_allow('fo', 'paid', 'new')},            'idem_allow' ],
			[ q{SELECT idem_disallow('fo', 'new', 'paid')},         'idem_disallow' ],
			[ q{SELECT idem_guard('fo_orders', 'fo', 'state')},     'idem_guard' ],
			[ q{SELECT idem_unguard('fo_orders')},                  'idem_unguard' ],
		],
		# a transition and a change of the machine
		open => q{
			SELECT idem_transition('fo_orders', '2', 'paid');
			SELECT idem_allow('fo', 'paid', 'new');},
		open_out  => "applied\nt",
		open_rows => 2,
		in_flight => [
			q{SELECT state FROM fo_orders WHERE id = 2;
			  SELECT count(*) FROM idem.transitions WHERE machine = 'fo'},
			"new\n2"
		],
		promoted => [
			[
				q{SELECT idem_transition('fo_orders', '1', 'paid')},
				'already',
				'a transition made on the old primary is already applied'
			],
			[
				q{SELECT idem_transition('fo_orders', '1', 'new'),
				         idem_transition('fo_orders', '3', 'shipped')},
				'stale|illegal',
				'the machine is the one committed on the old primary'
			],
			[
				q{SELECT idem_transition('fo_orders', '2', 'paid')},
				'applied',
				'the transition left open on the old primary is not there'
			],
			[
				q{SELECT idem_transition('fo_orders', '1', 'shipped'),
				         idem_transition('fo_orders', '1', 'shipped')},
				'applied|already',
				'the promoted standby moves rows'
			],
		],
		promoted_errors => [
			[
				q{UPDATE fo_orders SET state = 'new' WHERE id = 1},
				'23514',
				'the guard refuses an illegal UPDATE'
			],
		],
	},

	{
		name => 'ordered streams',
		# Offsets of three partitions (one stored by a reset), a producer
		# with a window of 16 that has seen 10, 12 and 20, and one with a
		# window of 8.
		setup => q{
			SELECT idem_offset_advance('fo-c', 'orders', 0, 41),
			       idem_offset_advance('fo-c', 'orders', 0, 44),
			       idem_offset_advance('fo-c', 'orders', 0, 43),
			       idem_offset_advance('fo-c', 'orders', 1, 7);
			SELECT idem_offset_reset('fo-c', 'orders', 2, 100) IS NULL;
			SELECT idem_seq_accept('fo-p', 10, 16), idem_seq_accept('fo-p', 20, 16),
			       idem_seq_accept('fo-p', 12, 16), idem_seq_accept('fo-p', 12, 16);
			SELECT idem_seq_accept('fo-w', 1, 8);},
		setup_out => "t|t|f|t\nt\naccepted|accepted|accepted|duplicate\naccepted",
		check     => q{
			SELECT consumer, stream, part, "offset", updated_at FROM idem.offsets
			 WHERE consumer = 'fo-c' ORDER BY part;
			SELECT producer, "window", high, seen, updated_at FROM idem.producer_seqs
			 WHERE producer LIKE 'fo-%' ORDER BY producer},
		standby => [
			[
				q{SELECT idem_offset_get('fo-c', 'orders', 0),
				         idem_offset_get('fo-c', 'orders', 1),
				         idem_offset_get('fo-c', 'orders', 2),
				         idem_offset_get('fo-c', 'orders', 3) IS NULL,
				         idem_offset_get('fo-c', 'payments', 0) IS NULL},
				'44|7|100|t|t',
				'committed offsets are seen by idem_offset_get'
			],
			[
				q{SELECT string_agg(part || '=' || "offset", ',' ORDER BY part)
				    FROM idem_offsets WHERE consumer = 'fo-c'},
				'0=44,1=7,2=100',
				'the view idem_offsets shows them'
			],
		],
		# replays and duplicates too: the standby refuses before judging
		writes => [
			[
				q{SELECT idem_offset_advance('fo-c', 'orders', 0, 44)},
				'idem_offset_advance of a replay'
			],
			[
				q{SELECT idem_offset_advance('fo-c', 'orders', 0, 45)},
				'idem_offset_advance of a new offset'
			],
			[
				q{SELECT idem_offset_advance('fo-c', 'orders', 9, 1)},
				'idem_offset_advance of a new partition'
			],
			[
				q{SELECT idem_offset_reset('fo-c', 'orders', 0, 10)},
				'idem_offset_reset'
			],
			[
				q{SELECT idem_offset_reset('fo-c', 'orders', 9, NULL)},
				'idem_offset_reset of an offset not stored'
			],
			[ q{SELECT idem_seq_accept('fo-p', 12, 16)}, 'idem_seq_accept of a duplicate' ],
			[ q{SELECT idem_seq_accept('fo-p', 21, 16)}, 'idem_seq_accept of a new number' ],
			[ q{SELECT idem_seq_accept('fo-new', 1)},    'idem_seq_accept of a new producer' ],
		],
		# an update of each table and a new row
		open => q{
			SELECT idem_offset_advance('fo-c', 'orders', 0, 45),
			       idem_offset_advance('fo-c', 'orders', 3, 1);
			SELECT idem_seq_accept('fo-p', 21, 16);},
		open_out  => "t|t\naccepted",
		open_rows => 3,
		in_flight => [
			q{SELECT idem_offset_get('fo-c', 'orders', 0),
			         idem_offset_get('fo-c', 'orders', 3) IS NULL},
			'44|t'
		],
		standby_in_flight => [
			q{SELECT idem_offset_get('fo-c', 'orders', 0),
			         idem_offset_get('fo-c', 'orders', 3) IS NULL},
			'44|t'
		],
		promoted => [
			[
				q{SELECT idem_offset_advance('fo-c', 'orders', 0, 41),
				         idem_offset_advance('fo-c', 'orders', 0, 44),
				         idem_offset_advance('fo-c', 'orders', 1, 7),
				         idem_offset_advance('fo-c', 'orders', 2, 100)},
				'f|f|f|f',
				'a redelivered message is a replay'
			],
			[
				q{SELECT idem_seq_accept('fo-p', 10, 16), idem_seq_accept('fo-p', 12, 16),
				         idem_seq_accept('fo-p', 20, 16), idem_seq_accept('fo-p', 4, 16)},
				'duplicate|duplicate|duplicate|too_old',
				'numbers accepted on the old primary are duplicates, its window kept'
			],
			[
				q{SELECT idem_offset_get('fo-c', 'orders', 0),
				         idem_offset_advance('fo-c', 'orders', 0, 45),
				         idem_offset_get('fo-c', 'orders', 3) IS NULL,
				         idem_offset_advance('fo-c', 'orders', 3, 1),
				         idem_seq_accept('fo-p', 21, 16)},
				'44|t|t|t|accepted',
				'the advances and the number left open on the old primary are not there'
			],
			[
				q{SELECT idem_offset_advance('fo-c', 'orders', 1, 8),
				         idem_offset_advance('fo-c', 'orders', 1, 8),
				         idem_seq_accept('fo-p', 22, 16), idem_seq_accept('fo-p', 11, 16),
				         idem_seq_accept('fo-p', 11, 16), idem_seq_accept('fo-p', 22, 16)},
				't|f|accepted|accepted|duplicate|duplicate',
				'the next offset and numbers are accepted once'
			],
			[
				q{SELECT idem_offset_reset('fo-c', 'orders', 2, NULL);
				  SELECT idem_offset_get('fo-c', 'orders', 2) IS NULL},
				"100\nt",
				'the promoted standby forgets an offset'
			],
		],
		promoted_errors => [
			[
				q{SELECT idem_seq_accept('fo-w', 2)},
				'22023',
				'a producer keeps the window set on the old primary'
			],
		],
	},

	{
		name => 'outbox',
		# Two keys of "fo": a's first message leased, b's delivered; a key of
		# "fo-dead" (one attempt) whose lease ran out: dead, though no lease
		# has said so yet.
		setup => q{
			SELECT idem_outbox_configure('fo-dead', 1, '1 second', '1 minute') IS NOT NULL;
			SELECT count(idem_outbox_send(t, k, jsonb_build_object('n', n)))
			  FROM (VALUES ('fo', 'a', 1), ('fo', 'a', 2), ('fo', 'b', 1), ('fo-dead', 'd', 1)) v(t, k, n);
			SELECT string_agg(topic || '/' || key, ',' ORDER BY topic, key)
			  FROM idem_outbox_lease('fo-r', 10, '1 hour');
			SELECT idem_outbox_ack(ARRAY(SELECT id FROM idem.outbox WHERE aggregateid = 'b'));
			UPDATE idem.outbox_keys SET available_at = now() - interval '1 second' WHERE topic = 'fo-dead';},
		setup_out => "t
4
fo/a,fo/b,fo-dead/d
1",
		check     => q{
			SELECT id, aggregatetype, aggregateid, payload FROM idem.outbox ORDER BY seq;
			SELECT topic, key, leased_by, attempts, dead FROM idem.outbox_keys ORDER BY topic, key},
		standby => [
			[
				q{SELECT topic, pending, leased, dead FROM idem_outbox_stats() ORDER BY topic},
				"fo|1|1|0\nfo-dead|0|0|1",
				'idem_outbox_stats judges as the primary does: d dead, its lease over'
			],
		],
		writes => [
			[ q{SELECT idem_outbox_send('fo', 'a', '{}')}, 'idem_outbox_send' ],
			[ q{SELECT count(*) FROM idem_outbox_lease('fo-s', 10)}, 'idem_outbox_lease' ],
			[
				q{SELECT idem_outbox_ack(ARRAY(SELECT id FROM idem.outbox WHERE aggregateid = 'a'))},
				'idem_outbox_ack'
			],
			[
				q{SELECT idem_outbox_nack(id, 'down') FROM idem.outbox WHERE aggregateid = 'a' LIMIT 1},
				'idem_outbox_nack'
			],
			[ q{SELECT idem_outbox_redrive()}, 'idem_outbox_redrive' ],
			[ q{SELECT idem_outbox_configure('fo', 3, '1 second', '1 minute')}, 'idem_outbox_configure' ],
			[ q{SELECT idem_outbox_purge()}, 'idem_outbox_purge' ],
		],
		# a message of b, sent in the transaction the failover cuts
		open      => q{SELECT idem_outbox_send('fo', 'b', '{"n": 2}') IS NOT NULL;},
		open_out  => 't',
		open_rows => 1,
		promoted => [
			[
				q{SELECT topic, pending, leased, dead FROM idem_outbox_stats() ORDER BY topic},
				"fo|1|1|0\nfo-dead|0|0|1",
				'the promoted standby counts the same'
			],
			[
				q{UPDATE idem.outbox_keys SET available_at = now() - interval '1 second'
				   WHERE topic = 'fo' AND key = 'a';
				  SELECT key, payload->>'n', attempt FROM idem_outbox_lease('fo-r2', 10, '1 hour')},
				'a|1|2',
				'a message leased on the old primary is leased again when its lease ran out, at its second attempt; none of the open transaction'
			],
			[
				q{SELECT idem_outbox_ack(ARRAY(SELECT id FROM idem.outbox WHERE aggregateid = 'a' AND payload->>'n' = '1'));
				  SELECT key, payload->>'n', attempt FROM idem_outbox_lease('fo-r2', 10, '1 hour')},
				"1\na|2|1",
				'its ack makes the next message of its key leasable, in order'
			],
			[
				q{SELECT idem_outbox_redrive('fo-dead');
				  SELECT key, payload->>'n', attempt FROM idem_outbox_lease('fo-r2', 10, '1 hour')},
				"1\nd|1|1",
				'the dead message is redriven and leased'
			],
			[
				q{SELECT count(*) FROM idem.outbox WHERE aggregateid = 'b'},
				'0',
				'the message sent in the open transaction is not there'
			],
		],
	},
);

my $db = 'postgres';

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(
	allows_streaming => 1,
	extra            => [ '--locale=C.UTF-8', '--encoding=UTF8' ]);
$primary->start;
$primary->safe_psql($db, 'CREATE EXTENSION idem');

# pageinspect shows that the rows of the open transaction reached the
# standby: otherwise their absence after promotion would prove nothing.
my $have_pageinspect = $primary->safe_psql($db,
	q{SELECT count(*) FROM pg_available_extensions
	   WHERE name = 'pageinspect'}) eq '1';
$primary->safe_psql($db, 'CREATE EXTENSION pageinspect') if $have_pageinspect;

$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;

# Made synchronous only now, so that the standby does not inherit the
# setting and wait for a standby of its own once promoted.  With
# remote_apply a commit returns once the standby has replayed it.
$primary->append_conf('postgresql.conf', q{
synchronous_standby_names = 'standby'
synchronous_commit = remote_apply});
$primary->reload;
ok( $primary->poll_query_until(
		$db, q{SELECT sync_state FROM pg_stat_replication
		        WHERE application_name = 'standby'}, 'sync'),
	'the standby is synchronous');

foreach my $kind (@kinds)
{
	is($primary->safe_psql($db, $kind->{setup}),
		$kind->{setup_out}, "$kind->{name}: committed on the primary");
}
my %before;
foreach my $kind (@kinds)
{
	$before{ $kind->{name} } = $primary->safe_psql($db, $kind->{check});
	isnt($before{ $kind->{name} }, '', "$kind->{name}: state to compare");
}

########################################################################
# The hot standby
########################################################################

is($standby->safe_psql($db, 'SELECT pg_is_in_recovery()'),
	't', 'the standby is in recovery');
foreach my $kind (@kinds)
{
	is($standby->safe_psql($db, $kind->{check}),
		$before{ $kind->{name} },
		"$kind->{name}: same state on the standby");
	foreach my $probe (@{ $kind->{standby} })
	{
		my ($sql, $expected, $what) = @$probe;
		is($standby->safe_psql($db, $sql),
			$expected, "$kind->{name}: standby: $what");
	}
	foreach my $write (@{ $kind->{writes} })
	{
		my ($sql, $what) = @$write;
		is(sqlstate_of($standby, $db, $sql),
			'25006', "$kind->{name}: standby refuses $what with 25006");
	}
}

# idem.tokens made unlogged: a standby has none of its rows (only its
# empty init fork), and says so with 0A000, as a query of the table does,
# instead of failing on the missing file (58P01).
$primary->safe_psql($db, 'CREATE DATABASE unlogged');
$primary->safe_psql('unlogged', q{
CREATE EXTENSION idem;
ALTER TABLE idem.tokens SET UNLOGGED;
ALTER TABLE idem.claims SET UNLOGGED;
ALTER TABLE idem.offsets SET UNLOGGED;
SELECT idem_claim('u-1');
SELECT idem_offset_advance('billing', 'orders', 0, 41);
CREATE TABLE kept (token text);
INSERT INTO kept SELECT idem_token_issue('u', '1 day');});
is($primary->safe_psql('unlogged', q{SELECT idem_token_status(token, 'u') FROM kept}),
	'valid', 'unlogged tokens: the primary has the token');
is($standby->safe_psql('unlogged', 'SELECT count(*) FROM kept'),
	'1', 'unlogged tokens: the token issued reached the standby');
is(sqlstate_of($standby, 'unlogged', q{SELECT idem_token_status(token, 'u') FROM kept}),
	'0A000', 'unlogged tokens: idem_token_status on the standby fails with 0A000');
is(sqlstate_of($standby, 'unlogged', 'SELECT count(*) FROM idem.tokens'),
	'0A000', 'unlogged tokens: a query of the table fails with the same SQLSTATE');
is(sqlstate_of($standby, 'unlogged', q{SELECT idem_token_consume(token, 'u') FROM kept}),
	'25006', 'unlogged tokens: idem_token_consume on the standby fails with 25006');
is(sqlstate_of($standby, 'unlogged', q{SELECT idem_claim_info('u-1')}),
	'0A000', 'unlogged claims: idem_claim_info on the standby fails with 0A000');
# idem.offsets made unlogged: the same for idem_offset_get
is($primary->safe_psql('unlogged', q{SELECT idem_offset_get('billing', 'orders', 0)}),
	'41', 'unlogged offsets: the primary has the offset');
is(sqlstate_of($standby, 'unlogged', q{SELECT idem_offset_get('billing', 'orders', 0)}),
	'0A000', 'unlogged offsets: idem_offset_get on the standby fails with 0A000');
is(sqlstate_of($standby, 'unlogged', 'SELECT count(*) FROM idem.offsets'),
	'0A000', 'unlogged offsets: a query of the table fails with the same SQLSTATE');
is(sqlstate_of($standby, 'unlogged', q{SELECT idem_offset_advance('billing', 'orders', 0, 42)}),
	'25006', 'unlogged offsets: idem_offset_advance on the standby fails with 25006');
# idem.outbox_topics made unlogged: idem_outbox_stats, which reads the
# topics' settings for the keys it judges, fails with 0A000 too
$primary->safe_psql('unlogged', q{
ALTER TABLE idem.outbox_topics SET UNLOGGED;
SELECT idem_outbox_send('u', 'k', '{}');});
is($standby->safe_psql('unlogged', q{SELECT count(*) FROM idem.outbox}), '1',
	'unlogged topics: the message reached the standby');
is(sqlstate_of($standby, 'unlogged', q{SELECT * FROM idem_outbox_stats()}),
	'0A000', 'unlogged topics: idem_outbox_stats on the standby fails with 0A000');

########################################################################
# A transaction left open on the primary
########################################################################

my $open = IdemTest::Session->new($primary, $db);
is($open->query('BEGIN;'), '', 'transaction opened on the primary');
foreach my $kind (grep { defined $_->{open} } @kinds)
{
	is($open->query($kind->{open}),
		$kind->{open_out}, "$kind->{name}: written in the open transaction");
}
my $open_xid = $open->query('SELECT pg_current_xact_id()::xid;');
like($open_xid, qr/^\d+$/, 'the open transaction has an xid');

foreach my $kind (grep { defined $_->{in_flight} } @kinds)
{
	my ($sql, $expected) = @{ $kind->{in_flight} };
	is($primary->safe_psql($db, $sql),
		$expected, "$kind->{name}: the open writes are held on the primary");
}

# A commit made after them: once it is replayed on the standby, so is the
# WAL of the open transaction before it.
$primary->safe_psql($db, 'CREATE TABLE later_commit AS SELECT 1 AS x');
is($standby->safe_psql($db, 'SELECT x FROM later_commit'),
	'1', 'a later commit on the primary is on the standby');

my $open_rows = 0;
$open_rows += $_->{open_rows} // 0 foreach @kinds;
SKIP:
{
	skip 'pageinspect is not available', 1 unless $have_pageinspect;
	is( $standby->safe_psql(
			$db, qq{
		SELECT count(*)
		  FROM pg_class c,
		       generate_series(0, pg_relation_size(c.oid) / current_setting('block_size')::int - 1) b,
		       heap_page_items(get_raw_page(c.oid::regclass::text, b::int)) p
		 WHERE c.relnamespace IN ('idem'::regnamespace, 'public'::regnamespace)
		   AND c.relkind = 'r'
		   AND p.t_xmin = '$open_xid'::xid}),
		$open_rows,
		'the rows of the open transaction are on the standby');
}

foreach my $kind (grep { defined $_->{standby_in_flight} } @kinds)
{
	my ($sql, $expected) = @{ $kind->{standby_in_flight} };
	is($standby->safe_psql($db, $sql),
		$expected, "$kind->{name}: the open writes are not seen on the standby");
}

########################################################################
# Failover
########################################################################

$primary->stop('immediate');
ok($open->lost, 'the open session lost the old primary');

$standby->promote;
ok($standby->poll_query_until($db, 'SELECT NOT pg_is_in_recovery()'),
	'the standby is promoted');

foreach my $kind (@kinds)
{
	is($standby->safe_psql($db, $kind->{check}),
		$before{ $kind->{name} },
		"$kind->{name}: same state after promotion");
}
foreach my $kind (@kinds)
{
	foreach my $probe (@{ $kind->{promoted} })
	{
		my ($sql, $expected, $what) = @$probe;
		is($standby->safe_psql($db, $sql),
			$expected, "$kind->{name}: promoted: $what");
	}
	foreach my $probe (@{ $kind->{promoted_errors} })
	{
		my ($sql, $sqlstate, $what) = @$probe;
		is(sqlstate_of($standby, $db, $sql),
			$sqlstate, "$kind->{name}: promoted: $what");
	}
}

# the promoted standby has the unlogged table, empty
is($standby->safe_psql('unlogged', q{SELECT idem_token_status(token, 'u') FROM kept}),
	'unknown', 'unlogged tokens: after the failover the token is unknown');
is($standby->safe_psql('unlogged', q{SELECT idem_offset_get('billing', 'orders', 0) IS NULL}),
	't', 'unlogged offsets: after the failover no offset is stored');

$standby->stop;

done_testing();
