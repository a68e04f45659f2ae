
# Copyright (c) idem contributors
#
# idem's state goes with its database through pg_dump and back, in plain,
# custom and directory format (the last restored by 4 parallel jobs).
#
# Each entry of @kinds is one kind of state:
#   setup      SQL run once in the source database; it prints setup_out
#   check      SQL whose output must be the same in the source database and
#              in every restored one
#   probes     [SQL, expected output, description] run in each restored
#              database after the checks, in order (they may change state)
# A new capability adds one entry.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

# (ns, msg_id) of every claim made by the "claims" kind, awkward ids
# included: quotes, backslash, tab, newline, non-ASCII, the longest id.
my $claim_ids = q{
	SELECT 'default'::text AS ns, 'msg-' || g AS msg_id
	  FROM generate_series(1, 500) g
	UNION ALL
	SELECT 'orders', 'ord-' || g FROM generate_series(1, 300) g
	UNION ALL
	SELECT 'orders', x
	  FROM unnest(ARRAY[E'it''s', E'back\\slash', E'tab\there',
	                    E'new\nline', 'naïve ✓', repeat('x', 512)]) x};

my @kinds = (
	{
		name => 'claims in two namespaces',
		# Three transactions, so that the claims have different times.
		setup => qq{
			SELECT idem_claim('first');
			SELECT count(*) FILTER (WHERE idem_claim(msg_id, ns))
			  FROM ($claim_ids) i;
			SELECT idem_claim('last', 'orders');},
		setup_out => "t\n806\nt",
		check     => q{
			SELECT ns, count(*), count(DISTINCT claimed_at),
			       md5(string_agg(msg_id || ' ' || claimed_at::text, ','
			                      ORDER BY msg_id))
			  FROM idem.claims WHERE ns IN ('default', 'orders')
			 GROUP BY ns ORDER BY ns},
		probes => [
			[
				qq{SELECT count(*) FILTER (WHERE idem_claim(msg_id, ns)),
				          count(*)
				     FROM ($claim_ids) i},
				'0|806',
				'every dumped claim is a duplicate'
			],
			[
				q{SELECT idem_claim('first'), idem_claim('last', 'orders'),
				         idem_try_claim('msg-1'),
				         idem_claim_info(repeat('x', 512), 'orders') =
				           (SELECT claimed_at FROM idem.claims
				             WHERE ns = 'orders' AND msg_id = 'ord-1')},
				'f|f|duplicate|t',
				'claims made one by one are duplicates, with their times'
			],
			[
				q{SELECT idem_claim('fresh'), idem_claim('fresh'),
				         idem_try_claim('fresh', 'orders'),
				         idem_claim_batch(ARRAY['msg-1', 'fresh-2'])},
				't|f|claimed|{f,t}',
				'new ids claim normally'
			],
		],
	},
	{
		name => 'retention',
		# Claims backdated by hand: 10 days old in ret-long (kept for 30
		# days) and in ret-default (default 7 days), 2 years old in
		# ret-long.
		setup => q{
			SELECT idem_set_retention('ret-long', '30 days');
			SELECT idem_set_retention('ret-odd', '1 year 2 mons 3 days 04:05:06.5');
			INSERT INTO idem.claims VALUES
				('ret-long', 'aged', now() - interval '10 days'),
				('ret-long', 'ancient', now() - interval '2 years'),
				('ret-default', 'aged', now() - interval '10 days');
			SELECT count(*) FROM idem.namespaces;},
		setup_out => "\n\n2",
		check     => q{
			SELECT ns, retention FROM idem.namespaces ORDER BY ns;
			SELECT ns, msg_id, claimed_at FROM idem.claims
			 WHERE ns LIKE 'ret-%' ORDER BY ns, msg_id},
		probes => [
			[
				q{SELECT idem.retention_of('ret-long'),
				         idem.retention_of('ret-odd'),
				         idem.retention_of('ret-none')},
				'30 days|1 year 2 mons 3 days 04:05:06.5|7 days',
				'retention is the one set before the dump'
			],
			[
				q{SELECT idem_purge('ret-long'), idem_purge('ret-default');
				  SELECT string_agg(ns || '/' || msg_id, ',' ORDER BY ns)
				    FROM idem.claims WHERE ns LIKE 'ret-%'},
				"1|1\nret-long/aged",
				'purge follows the restored retention'
			],
		],
	},
	{
		name => 'single-use tokens',
		# The token texts are kept in a table of the application, as a web
		# page would hold them; idem keeps only their digests.
		setup => q{
			CREATE TABLE bk_tok (label text PRIMARY KEY, t text NOT NULL);
			INSERT INTO bk_tok SELECT 'valid', idem_token_issue('u1');
			INSERT INTO bk_tok SELECT 'consumed', idem_token_issue('u1');
			INSERT INTO bk_tok SELECT 'other scope', idem_token_issue('u2');
			SELECT idem_token_consume(t, 'u1') FROM bk_tok WHERE label = 'consumed';
			SELECT count(*) FROM idem.tokens;},
		setup_out => "t\n3",
		check     => q{
			SELECT label, idem_token_status(t, 'u1'), idem_token_status(t, 'u2')
			  FROM bk_tok ORDER BY label;
			SELECT scope, md5(string_agg(encode(digest, 'hex') || expires_at::text
			                             || coalesce(consumed_at::text, '-'), ','
			                             ORDER BY digest))
			  FROM idem.tokens GROUP BY scope ORDER BY scope},
		probes => [
			[
				q{SELECT idem_token_consume(t, 'u1') FROM bk_tok WHERE label = 'consumed'},
				'f',
				'a token consumed before the dump stays consumed'
			],
			[
				q{SELECT idem_token_consume(t, 'u1') FROM bk_tok WHERE label = 'valid';
				  SELECT idem_token_consume(t, 'u1') FROM bk_tok WHERE label = 'valid'},
				"t\nf",
				'a valid token is consumed exactly once after the restore'
			],
			[
				q{SELECT idem_token_consume(t, 'u1') FROM bk_tok WHERE label = 'other scope';
				  SELECT idem_token_consume(t, 'u2') FROM bk_tok WHERE label = 'other scope'},
				"f\nt",
				'a token keeps its scope'
			],
		],
	},
	{
		name => 'ordered streams',
		# Offsets of two partitions, and a producer with a window of 16
		# whose bitmap has numbers 3, 5 and 20 (17 and 18 not seen yet).
		setup => q{
			SELECT idem_offset_advance('bk-c', 'orders', 0, 41),
			       idem_offset_advance('bk-c', 'orders', 7, 9223372036854775807);
			SELECT string_agg(idem_seq_accept('bk-p', s, 16)::text, ',' ORDER BY o)
			  FROM unnest(ARRAY[3, 5, 20]) WITH ORDINALITY AS u(s, o);},
		setup_out => "t|t\naccepted,accepted,accepted",
		check     => q{
			SELECT consumer, stream, part, "offset" FROM idem.offsets
			 WHERE consumer = 'bk-c' ORDER BY part;
			SELECT producer, "window", high, seen FROM idem.producer_seqs
			 WHERE producer = 'bk-p'},
		probes => [
			[
				q{SELECT idem_offset_get('bk-c', 'orders', 0),
				         idem_offset_advance('bk-c', 'orders', 0, 41),
				         idem_offset_advance('bk-c', 'orders', 7, 9223372036854775807),
				         idem_offset_advance('bk-c', 'orders', 0, 42)},
				'41|f|f|t',
				'a stored offset is a replay, the next one is applied'
			],
			[
				q{SELECT idem_seq_accept('bk-p', 5, 16), idem_seq_accept('bk-p', 18, 16),
				         idem_seq_accept('bk-p', 4, 16), idem_seq_accept('bk-p', 21, 16)},
				'duplicate|accepted|too_old|accepted',
				'a producer keeps its high-water mark and its bitmap'
			],
		],
	},
	{
		name => 'machine definitions and guarded tables',
		setup => q{
			SELECT idem_allow('bk', 'new', 'paid');
			SELECT idem_allow('bk', 'paid', 'shipped');
			CREATE TABLE bk_orders (id int PRIMARY KEY, status text NOT NULL,
			                        version bigint NOT NULL DEFAULT 0);
			INSERT INTO bk_orders VALUES (1, 'new', 0), (2, 'new', 0);
			SELECT idem_guard('bk_orders', 'bk', 'status', 'version');
			SELECT idem_transition('bk_orders', '1', 'paid', 0);},
		setup_out => "t\nt\n\napplied",
		check     => q{
			SELECT id, status, version FROM bk_orders ORDER BY id;
			SELECT machine, from_state, to_state FROM idem.transitions
			 WHERE machine = 'bk' ORDER BY from_state, to_state;
			SELECT tgname, tgenabled FROM pg_trigger
			 WHERE tgrelid = 'bk_orders'::regclass AND NOT tgisinternal},
		probes => [
			[
				q{SELECT idem_transition('bk_orders', '1', 'paid', 0)},
				'already',
				'a retried transition is recognised'
			],
			[
				q{SELECT idem_transition('bk_orders', '2', 'shipped')},
				'illegal',
				'the restored machine refuses an illegal move'
			],
			[
				q{DO $$BEGIN
				      UPDATE bk_orders SET status = 'new' WHERE id = 1;
				      RAISE EXCEPTION 'the guard did not refuse';
				  EXCEPTION WHEN check_violation THEN NULL;
				  END$$;
				  SELECT 'refused'},
				'refused',
				'the restored guard refuses an illegal UPDATE'
			],
			[
				q{SELECT idem_transition('bk_orders', '2', 'paid', 0);
				  SELECT version FROM bk_orders WHERE id = 2},
				"applied\n1",
				'a legal move applies and bumps the version'
			],
		],
	},
	{
		# ids are made of a prefix of the key's hash and seq: restored rows
		# keep their place in their keys' ranges, and pass the table's
		# CHECK constraint (p685 and p161086 share a range)
		name => 'outbox messages',
		setup => q{
			SELECT count(idem_outbox_send(t, k, jsonb_build_object('n', n)))
			  FROM (VALUES ('collide', 'p685', 1), ('collide', 'p161086', 1), ('collide', 'p685', 2),
			               ('bk', 'naïve ✓', 1), ('bk', 'naïve ✓', 2)) v(t, k, n)},
		setup_out => '5',
		check     => q{
			SELECT aggregatetype, aggregateid, payload, seq, key_hash, id FROM idem.outbox ORDER BY id;
			SELECT topic, key, dead, attempts FROM idem.outbox_keys ORDER BY topic, key;
			SELECT last_value FROM idem.outbox_seq},
		probes => [
			[
				q{SELECT string_agg(key || ':' || (payload->>'n'), ',' ORDER BY key) FROM idem_outbox_lease('r', 100)},
				'naïve ✓:1,p161086:1,p685:1',
				'the lease finds each key\'s head'
			],
			[
				q{SELECT idem_outbox_ack(array_agg(id)) FROM idem.outbox WHERE payload->>'n' = '1';
				  SELECT string_agg(key || ':' || (payload->>'n'), ',' ORDER BY key) FROM idem_outbox_lease('r', 100)},
				"3\nnaïve ✓:2,p685:2",
				'acks by id, and the next heads'
			],
			[
				q{SELECT idem_outbox_send('collide', 'p161086', '{"n": 3}') IS NOT NULL;
				  SELECT bool_and(o.seq < n.seq) FROM idem.outbox o, idem.outbox n
				   WHERE n.payload->>'n' = '3' AND o.payload->>'n' <> '3'},
				"t\nt",
				'a new message comes after the restored ones'
			],
		],
	},
	{
		name => 'request keys and settings',
		setup => q{
			SELECT idem_request_set_retention('rq', '2 days');
			SELECT status FROM idem_request_begin('rk1', 'fp', 'rq');
			SELECT idem_request_finish('rk1', 201, '{"id": 1}', 'rq');},
		setup_out => "\nnew\n",
		check     => q{
			SELECT key, ns, fingerprint, response_code, response_body, expires_at - finished_at
			  FROM idem.requests ORDER BY ns, key;
			SELECT ns, retention FROM idem.request_retention ORDER BY ns},
		probes => [
			[
				q{SELECT status, response_code, response_body FROM idem_request_begin('rk1', 'fp', 'rq')},
				'replay|201|{"id": 1}',
				'a finished request is replayed'
			],
			[
				q{SELECT status FROM idem_request_begin('rk1', 'other', 'rq')},
				'mismatch',
				'and its fingerprint kept'
			],
		],
	},
	{
		name => 'initial states and outbox topics',
		setup => q{
			SELECT idem_allow('bi', 'new', 'done');
			SELECT idem_allow_initial('bi', 'new');
			CREATE TABLE bi_jobs (id int PRIMARY KEY, status text NOT NULL, version bigint NOT NULL DEFAULT 0);
			SELECT idem_guard('bi_jobs', 'bi', 'status', 'version');
			SELECT idem_outbox_configure('once', 1, '1 second', '1 second');},
		setup_out => "t\nt\n\n",
		check     => q{
			SELECT machine, state FROM idem.initial_states ORDER BY machine, state;
			SELECT * FROM idem.outbox_topics ORDER BY topic},
		probes => [
			[
				q{DO $$BEGIN
				      INSERT INTO bi_jobs VALUES (1, 'done');
				      RAISE EXCEPTION 'the guard did not refuse';
				  EXCEPTION WHEN check_violation THEN NULL;
				  END$$;
				  INSERT INTO bi_jobs VALUES (2, 'new');
				  SELECT string_agg(id || ' ' || status, ',') FROM bi_jobs},
				'2 new',
				'a row must start in an initial state'
			],
			[
				q{SELECT idem_outbox_send('once', 'k', '{}') IS NOT NULL;
				  SELECT idem_outbox_nack(id, 'failed') FROM idem_outbox_lease('r', 100) WHERE topic = 'once';
				  SELECT dead FROM idem.outbox_keys WHERE topic = 'once'},
				"t\nt\nt",
				'a topic of one attempt: dead after one nack'
			],
		],
	},
	{
		# a parallel restore loads partitions while it adds the keys of
		# their parent (specs/guard_ddl_locks shows the deadlock that met,
		# which this restore hits only now and then)
		name => 'a partitioned table of the application',
		setup => q{
			CREATE TABLE bp_events (id int NOT NULL, payload text, PRIMARY KEY (id))
			    PARTITION BY RANGE (id);
			CREATE TABLE bp_events_1 PARTITION OF bp_events FOR VALUES FROM (0) TO (20000);
			CREATE TABLE bp_events_2 PARTITION OF bp_events FOR VALUES FROM (20000) TO (40000);
			CREATE TABLE bp_events_3 PARTITION OF bp_events FOR VALUES FROM (40000) TO (60000);
			INSERT INTO bp_events SELECT g, md5(g::text) FROM generate_series(0, 59999) g;
			SELECT count(*) FROM bp_events},
		setup_out => '60000',
		check     => q{
			SELECT tableoid::regclass, count(*), md5(string_agg(payload, ',' ORDER BY id))
			  FROM bp_events GROUP BY 1 ORDER BY 1},
		probes => [],
	},);

my $node = idem_node('dump');
my $db   = 'postgres';

foreach my $kind (@kinds)
{
	is($node->safe_psql($db, $kind->{setup}),
		$kind->{setup_out}, "$kind->{name}: setup");
}
my %before;
foreach my $kind (@kinds)
{
	$before{ $kind->{name} } = $node->safe_psql($db, $kind->{check});
	isnt($before{ $kind->{name} }, '', "$kind->{name}: state to compare");
}

my $dir = PostgreSQL::Test::Utils::tempdir;
my %restore = (
	plain => [
		[ 'pg_dump', '-Fp', '-f', "$dir/dump.sql", '-d', $db ],
		sub {
			[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1',
			  '-f', "$dir/dump.sql", '-d', $_[0] ];
		}
	],
	custom => [
		[ 'pg_dump', '-Fc', '-f', "$dir/dump.custom", '-d', $db ],
		sub {
			[ 'pg_restore', '--exit-on-error', '-d', $_[0],
			  "$dir/dump.custom" ];
		}
	],
	parallel => [
		[ 'pg_dump', '-Fd', '-j', '2', '-f', "$dir/dump.dir", '-d', $db ],
		sub {
			[ 'pg_restore', '--exit-on-error', '-j', '4', '-d', $_[0],
			  "$dir/dump.dir" ];
		}
	],);

foreach my $format (sort keys %restore)
{
	my ($dump, $restore) = @{ $restore{$format} };
	my $target = "restored_$format";

	$node->command_ok($dump, "$format: pg_dump");
	$node->command_ok([ 'createdb', $target ], "$format: createdb");
	is($node->safe_psql($target, q{SELECT count(*) FROM pg_extension
	                               WHERE extname = 'idem'}),
		'0', "$format: the new database has no idem yet");
	$node->command_ok($restore->($target), "$format: restore");

	foreach my $kind (@kinds)
	{
		is($node->safe_psql($target, $kind->{check}),
			$before{ $kind->{name} },
			"$format: $kind->{name}: same state after restore");
	}
	foreach my $kind (@kinds)
	{
		foreach my $probe (@{ $kind->{probes} })
		{
			my ($sql, $expected, $what) = @$probe;
			is($node->safe_psql($target, $sql),
				$expected, "$format: $kind->{name}: $what");
		}
	}
}

$node->stop;

done_testing();
