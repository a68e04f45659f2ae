
# Copyright (c) idem contributors
#
# The transactional outbox across crashes.  Messages committed before an
# immediate shutdown, or a SIGKILL of the postmaster, are delivered after the
# restart, in send order per key; none of a transaction that rolled back, or
# was still open at the crash, ever is.  Leases, acks and backoffs committed
# before the crash hold after it; the message of an ack still open at the
# crash (also one deleted by a multixact) is leased again once its lease
# runs out.  A prepared transaction's messages are delivered only after
# COMMIT PREPARED, also across a crash, and never after ROLLBACK PREPARED.
# Logical decoding (test_decoding) sees a committed send and none of a
# rolled-back one, in commit order, and after a crash too.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use IdemTest;
use IPC::Run;

my $node = idem_node('outbox', 'max_prepared_transactions = 10',
	'restart_after_crash = on', 'wal_level = logical',
	'max_replication_slots = 4', 'max_wal_senders = 4');

# Leases every message that can be leased and acks it, round after round
# (a key gives one message a round), each round committed, until a round
# leases nothing.  Returns what was delivered, one line per key in the order
# of the keys: the payloads' n in delivery order, each followed by @attempt
# if not the first.
sub deliver
{
	return $node->safe_psql(
		'postgres', q{
	CREATE TEMP TABLE got (round int, id uuid, topic text, key text, n text, attempt int);
	DO $$
	DECLARE
		r int := 0;
		leased bigint;
	BEGIN
		LOOP
			r := r + 1;
			INSERT INTO got
			SELECT r, id, topic, key, payload->>'n', attempt
			  FROM idem_outbox_lease('tap', 10000, '1 hour');
			GET DIAGNOSTICS leased = ROW_COUNT;
			EXIT WHEN leased = 0;
			IF idem_outbox_ack(ARRAY(SELECT id FROM got WHERE round = r)) <> leased THEN
				RAISE EXCEPTION 'not every leased message was acked';
			END IF;
			COMMIT;
		END LOOP;
	END $$;
	SELECT topic || '/' || key || ': '
	       || string_agg(n || CASE WHEN attempt > 1 THEN '@' || attempt ELSE '' END, ','
	                     ORDER BY round)
	  FROM got GROUP BY topic, key ORDER BY topic, key;});
}

# Sends one message in its own transaction, or in the current one.
sub send_sql
{
	my ($topic, $key, $n) = @_;
	return "SELECT idem_outbox_send('$topic', '$key', '{\"n\": $n}') IS NOT NULL;";
}

# Runs SQL in a transaction and prepares it; psql's errors, '' if none.
sub prepare
{
	my ($gid, $sql) = @_;
	my ($ret, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY terse\nBEGIN;\n$sql\nPREPARE TRANSACTION '$gid';");
	return $err;
}

# COMMIT or ROLLBACK PREPARED; psql's errors, '' if none.
sub finish_prepared
{
	my ($how, $gid) = @_;
	my ($ret, $out, $err) =
	  $node->psql('postgres', "\\set VERBOSITY terse\n$how PREPARED '$gid';");
	return $err;
}

sub recovered
{
	my ($offset) = @_;
	return slurp_file($node->logfile, $offset) =~
	  /database system was (?:interrupted|not properly shut down)/;
}

########################################################################
# Immediate shutdown
########################################################################

# Everything below is written after this checkpoint: after the crash it
# exists only through WAL replay.
$node->safe_psql('postgres', 'CHECKPOINT');

# Keys whose heads are leased, acked and nacked before the crash.
$node->safe_psql('postgres',
	join('', map { send_sql('c', @$_) }
		  ([ 'leased', 1 ], [ 'leased', 2 ], [ 'acked', 1 ], [ 'acked', 2 ],
			[ 'nacked', 1 ])));
is( $node->safe_psql(
		'postgres', q{
	CREATE TABLE before_crash AS
	  SELECT * FROM idem_outbox_lease('tap', 10, '1 hour');
	SELECT idem_outbox_ack(ARRAY(SELECT id FROM before_crash WHERE key = 'acked')),
	       idem_outbox_nack((SELECT id FROM before_crash WHERE key = 'nacked'),
	                        'broker down', '1 hour');
	SELECT string_agg(key || ':' || (payload->>'n') || '@' || attempt, ',' ORDER BY key)
	  FROM before_crash;}),
	"1|t\nacked:1\@1,leased:1\@1,nacked:1\@1",
	'heads leased; one acked, one nacked with a retry in an hour');

# Messages committed one transaction at a time, interleaved over keys.
$node->safe_psql('postgres',
	join('', map { my $n = $_; map { send_sql('c', $_, $n) } qw(k1 k2 k3) }
		  1 .. 5));
# 1,000 messages of one key in one transaction.
is( $node->safe_psql(
		'postgres', q{
	SELECT count(DISTINCT idem_outbox_send('c', 'bulk', jsonb_build_object('n', n)))
	  FROM generate_series(1, 1000) n;}),
	'1000', '1,000 messages sent in one transaction');

# A transaction that rolls back, and a savepoint that is rolled back.
$node->safe_psql(
	'postgres', q{
	BEGIN;
	SELECT idem_outbox_send('c', 'k1', '{"n": 100}');
	SELECT idem_outbox_send('c', 'gone', '{"n": 100}');
	ROLLBACK;
	BEGIN;
	SAVEPOINT sp;
	SELECT idem_outbox_send('c', 'k2', '{"n": 101}');
	SELECT idem_outbox_send('c', 'gone', '{"n": 101}');
	ROLLBACK TO SAVEPOINT sp;
	SELECT idem_outbox_send('c', 'k2', '{"n": 6}');
	COMMIT;});

# Two prepared transactions, one to commit and one to roll back.  (Each
# sends to a key of its own that has no row yet: until COMMIT or ROLLBACK
# PREPARED, a send to such a key waits for the prepared transaction, as an
# insert into a unique index would.)
is( prepare(
		'ob_commit',
		q{SELECT idem_outbox_send('c', 'k1', '{"n": 6}');
		  SELECT idem_outbox_send('c', 'prep', '{"n": 1}');}),
	'',
	'a transaction that sent messages is prepared');
is( prepare(
		'ob_abort',
		q{SELECT idem_outbox_send('c', 'k3', '{"n": 99}');
		  SELECT idem_outbox_send('c', 'prep-abort', '{"n": 99}');}),
	'',
	'another one is prepared');

# A transaction still open at the crash.
my $open = IdemTest::Session->new($node, 'postgres');
is( $open->query(
		q{BEGIN;
		  SELECT idem_outbox_send('c', 'k3', '{"n": 102}') IS NOT NULL;
		  SELECT idem_outbox_send('c', 'open', '{"n": 102}') IS NOT NULL;}),
	"t\nt", 'messages sent in a transaction left open');

my $log_offset = -s $node->logfile;
$node->stop('immediate');
ok($open->lost, 'the open session lost its connection');
$node->start;
ok(recovered($log_offset), 'the restart ran crash recovery');

is( $node->safe_psql(
		'postgres', q{SELECT string_agg(gid, ',' ORDER BY gid) FROM pg_prepared_xacts}),
	'ob_abort,ob_commit',
	'the prepared transactions survive the crash');

is( deliver(),
	join("\n",
		'c/acked: 2',
		'c/bulk: ' . join(',', 1 .. 1000),
		'c/k1: 1,2,3,4,5',
		'c/k2: 1,2,3,4,5,6',
		'c/k3: 1,2,3,4,5'),
	'after the crash every committed message is delivered once, in send order per key; '
	  . 'none that rolled back, was open or is prepared');
is( $node->safe_psql(
		'postgres', q{
	SELECT key, attempts, leased_by
	  FROM idem.outbox_keys WHERE key IN ('leased', 'nacked') ORDER BY key}),
	"leased|1|tap\nnacked|1|",
	'the lease and the backoff made before the crash hold after it');

# The lease and the backoff run out: their heads come again, second attempt.
$node->safe_psql('postgres',
	q{UPDATE idem.outbox_keys SET available_at = now() - interval '1 second'
	   WHERE key IN ('leased', 'nacked')});
is(deliver(), "c/leased: 1\@2,2\nc/nacked: 1\@2",
	'a lease and a backoff made before the crash end, and their heads are leased again');

is(finish_prepared('ROLLBACK', 'ob_abort'), '', 'ROLLBACK PREPARED');
is(deliver(), '', 'after ROLLBACK PREPARED, nothing to deliver');
is(finish_prepared('COMMIT', 'ob_commit'), '', 'COMMIT PREPARED');
is(deliver(), "c/k1: 6\nc/prep: 1",
	'COMMIT PREPARED: its messages are delivered, after the earlier ones of their keys');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem.outbox'),
	'0', 'the outbox is empty');

########################################################################
# SIGKILL of the postmaster
########################################################################

$node->safe_psql('postgres', 'CHECKPOINT');
$node->safe_psql('postgres',
	join('', map { send_sql('k', 'kill', $_) } 1 .. 3) . q{
	BEGIN;
	SELECT idem_outbox_send('k', 'kill', '{"n": 100}');
	ROLLBACK;});
# a prepared transaction, committed only after the crash
is(prepare('ob_kill', q{SELECT idem_outbox_send('k', 'kill', '{"n": 4}');}),
	'', 'a transaction that sent a message is prepared');
my $open2 = IdemTest::Session->new($node, 'postgres');
is( $open2->query(
		q{BEGIN; SELECT idem_outbox_send('k', 'kill', '{"n": 101}') IS NOT NULL;}),
	't', 'a message sent in a transaction left open');

my $open2_pid = $open2->query('SELECT pg_backend_pid();');

$log_offset = -s $node->logfile;
$node->kill9;
# The backend notices that the postmaster is gone when it next waits; a
# query sent before that would still be answered.
for (my $i = 0; $i < 10 * $PostgreSQL::Test::Utils::timeout_default; $i++)
{
	last unless kill(0, $open2_pid);
	usleep(100_000);
}
ok($open2->lost, 'the open session lost its connection');
# The backends of the killed postmaster may take a moment to go away.
my $started = 0;
for (my $i = 0; $i < 10 * $PostgreSQL::Test::Utils::timeout_default; $i++)
{
	last if $started = $node->start(fail_ok => 1);
	usleep(100_000);
}
ok($started, 'the server starts again after a SIGKILL of the postmaster');
ok(recovered($log_offset), 'the restart ran crash recovery');

is(deliver(), 'k/kill: 1,2,3',
	'the messages committed before the SIGKILL are delivered, in order; '
	  . 'none that rolled back, was open or is prepared');
is(finish_prepared('COMMIT', 'ob_kill'), '', 'COMMIT PREPARED after the SIGKILL');
is(deliver(), 'k/kill: 4', 'the prepared message is delivered after COMMIT PREPARED');

########################################################################
# Acks cut by a crash
########################################################################

# An ack that deleted its message was still open at the crash: it never
# committed, and the message is a head again once its lease runs out.  The
# other ack's subtransaction had locked its message first, so that the
# deleter is a member of a multixact.
$node->safe_psql('postgres',
	join('', map { send_sql('a', @$_) } ([ 'cut', 1 ], [ 'cutmulti', 1 ], [ 'cut', 2 ])));
is( $node->safe_psql(
		'postgres', q{
	CREATE TABLE cut AS SELECT id, key FROM idem_outbox_lease('tap', 10, '1 hour');
	SELECT string_agg(key, ',' ORDER BY key) FROM cut;}),
	'cut,cutmulti', 'two heads leased');
my $ack_cut = IdemTest::Session->new($node, 'postgres');
is( $ack_cut->query(
		q{BEGIN;
		  SELECT idem_outbox_ack(ARRAY(SELECT id FROM cut WHERE key = 'cut'));}),
	'1', 'an ack left open');
my $ack_multi = IdemTest::Session->new($node, 'postgres');
is( $ack_multi->query(
		q{BEGIN;
		  SAVEPOINT s;
		  SELECT 1 FROM idem.outbox WHERE id = (SELECT id FROM cut WHERE key = 'cutmulti')
		     FOR KEY SHARE;
		  RELEASE s;
		  SELECT idem_outbox_ack(ARRAY(SELECT id FROM cut WHERE key = 'cutmulti'));}),
	"1\n1", 'an ack of a message its subtransaction locked, left open');
is( $node->safe_psql(
		'postgres', q{
	SELECT o.aggregateid, (SELECT count(*) FROM pg_get_multixact_members(o.xmax))
	  FROM idem.outbox o JOIN cut USING (id) WHERE cut.key = 'cutmulti';}),
	'cutmulti|2', 'its message is deleted by a multixact: the locker and the deleter');
# The deletions on disk: the WAL of a transaction still open is not flushed,
# and the crash would otherwise lose them.
$node->safe_psql('postgres', 'CHECKPOINT');

$log_offset = -s $node->logfile;
$node->stop('immediate');
ok($ack_cut->lost && $ack_multi->lost, 'the acks lost their connections');
$node->start;
ok(recovered($log_offset), 'the restart ran crash recovery');

is(deliver(), '', 'the leases of the heads whose acks were cut hold');
$node->safe_psql('postgres',
	q{UPDATE idem.outbox_keys SET available_at = now() - interval '1 second'
	   WHERE key IN ('cut', 'cutmulti')});
is(deliver(), "a/cut: 1\@2,2\na/cutmulti: 1\@2",
	'once the leases run out, the heads whose acks a crash cut are leased again');

########################################################################
# Logical decoding
########################################################################

# What test_decoding shows of the inserts into idem.outbox: n of each, in
# the order decoding gives them.
sub decoded
{
	my $rows = $node->safe_psql(
		'postgres', q{
	SELECT data FROM pg_logical_slot_get_changes('outbox', NULL, NULL,
	                                             'include-xids', '0')
	 WHERE data LIKE 'table idem.outbox: INSERT:%'});
	return join(',', $rows =~ /payload\[jsonb\]:'\{"n": (\d+)\}'/g);
}

$node->safe_psql('postgres',
	q{SELECT 'init' FROM pg_create_logical_replication_slot('outbox', 'test_decoding')});

# s1 sends first and commits last: decoding gives s2's message first.
my $s1 = IdemTest::Session->new($node, 'postgres');
my $s2 = IdemTest::Session->new($node, 'postgres');
$s1->query(q{BEGIN; } . send_sql('ld', 'a', 1));
$s2->query(q{BEGIN; } . send_sql('ld', 'b', 2));
$s2->query(q{COMMIT;});
$node->safe_psql('postgres',
	q{BEGIN; } . send_sql('ld', 'c', 3) . q{ ROLLBACK;});
$s1->query(q{COMMIT;});
$s1->close;
$s2->close;
is(decoded(), '2,1',
	'decoding shows the committed sends in commit order, none of the rolled back one');
$node->safe_psql('postgres', send_sql('ld', 'd', 4));
like(
	$node->safe_psql(
		'postgres', q{
	SELECT data FROM pg_logical_slot_peek_changes('outbox', NULL, NULL)
	 WHERE data LIKE 'table idem.outbox: INSERT:%'}),
	qr/^table idem\.outbox: INSERT: id\[uuid\]:'[0-9a-f-]{36}' aggregatetype\[text\]:'ld' aggregateid\[text\]:'d' .*payload\[jsonb\]:'\{"n": 4\}'/,
	'a decoded insert carries the columns the Outbox Event Router reads');

# A send committed just before a crash is decoded after the restart.  (The
# checkpoint saves how far the slot was read: without it, decoding after the
# crash would give again what was read since the last checkpoint.)
$node->safe_psql('postgres', 'CHECKPOINT');
$node->safe_psql('postgres', send_sql('ld', 'e', 5));
$node->stop('immediate');
$node->start;
is(decoded(), '4,5', 'sends committed before the crash are decoded after it');

$node->safe_psql('postgres', q{SELECT pg_drop_replication_slot('outbox')});

# Relays read messages as UTF-8: in a database of another encoding, a send
# whose text has no UTF-8 form is refused (a lease that met it would fail,
# for ever, and hold back every key), and one that has is delivered as UTF-8.
$node->safe_psql('postgres',
	q{CREATE DATABASE ob_ascii ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0});
$node->safe_psql('postgres',
	q{CREATE DATABASE ob_1252 ENCODING 'WIN1252' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0});
for my $db ('ob_ascii', 'ob_1252')
{
	$node->safe_psql($db, 'CREATE EXTENSION idem');
}
my %bad = (
	'a key' => q{SELECT idem_outbox_send('t', E'k\xff', '{}')},
	'a topic' => q{SELECT idem_outbox_send(E't\xff', 'k', '{}')},
	'a type' => q{SELECT idem_outbox_send('t', 'k', '{}', NULL, E'ty\xff')},
	'a payload' => q{SELECT idem_outbox_send('t', 'k', jsonb_build_object('v', E'\xff'))},
	'headers' => q{SELECT idem_outbox_send('t', 'k', '{}', jsonb_build_object('h', E'\xff'))});
for my $what (sort keys %bad)
{
	is(sqlstate_of($node, 'ob_ascii', "SET client_encoding = 'SQL_ASCII'; $bad{$what}"), '22021',
		"SQL_ASCII: $what not in UTF-8 is refused with 22021");
}
# 0x81 has no character in WIN1252
is(sqlstate_of($node, 'ob_1252', q{SET client_encoding = 'WIN1252'; SELECT idem_outbox_send('t', E'k\x81', '{}')}),
	'22P05', 'WIN1252: a key with no UTF-8 form is refused with 22P05');
is(sqlstate_of($node, 'ob_1252',
		q{SET client_encoding = 'WIN1252'; SELECT idem_outbox_send('t', 'k', jsonb_build_object('v', E'\x81'))}),
	'22P05', 'WIN1252: a payload with no UTF-8 form is refused with 22P05');
is($node->safe_psql('ob_ascii', q{SELECT count(*) FROM idem.outbox}), '0', 'nothing was written');
$node->safe_psql('ob_1252', q{SET client_encoding = 'WIN1252'; SELECT idem_outbox_send('t', E'caf\xe9', jsonb_build_object('v', E'\x80'))});
$node->safe_psql('ob_ascii', q{SELECT idem_outbox_send('t', E'caf\xc3\xa9', jsonb_build_object('v', E'\xe2\x82\xac'))});
for my $db ('ob_ascii', 'ob_1252')
{
	is($node->safe_psql($db, q{SET client_encoding = 'UTF8'; SELECT key, payload->>'v' FROM idem_outbox_lease('r')}),
		"caf\xc3\xa9|\xe2\x82\xac",
		"$db: a text with a UTF-8 form is sent and leased as UTF-8");
}
# Acks of messages of the same keys at once, a relay's late ack of runs
# whose lease ran out and the ack of the heads another relay leased again
# since: no deadlock, no error, every message counted.  The keys come in
# pairs whose ids share a range of the primary key (the same first 32 bits
# of key_hash), where ids follow the order of sending: the first messages
# are sent in the order of the keys, the second in the reverse, so the
# leases' runs and the acks work over interleaved keys.  (That the acks lock
# key rows in the order of the keys, not of the ids, is shown without
# depending on timing by specs/outbox_ack_shared_prefix.)
$node->safe_psql('postgres', q{CREATE DATABASE ob_runs});
$node->safe_psql('ob_runs', q{CREATE EXTENSION idem});
$node->safe_psql('ob_runs', q{
	CREATE TABLE pair_keys AS
	SELECT i, 'c' || c AS k FROM unnest('{
		171641,720010,171640,720011,171643,720012,171642,720013,171613,720060,171612,720061,171611,
		720062,171610,720063,171323,720590,171322,720591,171321,720592,171320,720593,122641,791010,
		122640,791011,122643,791012,122642,791013,122613,791060,122612,791061,122611,791062,122610,
		791063,122323,791590,122322,791591,122321,791592,122320,791593,725708,802968,725709,802969,
		725718,802978,725719,802979,731828,874648,731829,874649,731838,874658,731839,874659,417928,
		910748,417929,910749,417938,910758,417939,910759,410608,913868,410609,913869,410618,913878,
		410619,913879,497708,990968,497709,990969,497718,990978,497719,990979,503389,1711919,549184,
		1772200,549185,1772201,549186,1772202,549187,1772203,549180,1772204,549181,1772205,549182,
		1772206,549183,1772207,549154,1772250,549155,1772251,549156,1772252,549157,1772253,549150,
		1772254,549151,1772255,549152,1772256,549153,1772257,549164,1772260,549165,1772261,549166,
		1772262,549167,1772263,549160,1772264,549161,1772265,549162,1772266,549163,1772267,549174,
		1772270,549175,1772271,549176,1772272,549177,1772273,549170,1772274,549171,1772275,549172,
		1772276,549173,1772277,549104,1772280,549105,1772281,549106,1772282,549107,1772283,549100,
		1772284,549101,1772285,549102,1772286,549103,1772287,548284,1775700,548285,1775701,548286,
		1775702,548287,1775703,548280,1775704,548281,1775705,548282,1775706,548283,1775707,548298,
		1775714,548299,1775715,548294,1775718,548295,1775719,548254,1775750,548255,1775751,548256,
		1775752,548257,1775753,548250,1775754,548251,1775755,548252,1775756,548253,1775757,548274,
		1775770,548275,1775771,548276,1775772,548277,1775773,548270,1775774,548271,1775775,548272,
		1775776,548273,1775777,548204,1775780,548205,1775781,548206,1775782,548207,1775783,548200,
		1775784,548201,1775785,548202,1775786,548203,1775787,544994,1779410,544995,1779411,544996,
		1779412,544997,1779413,544990,1779414,544991,1779415,544992,1779416,544993,1779417,544944,
		1779440,544945,1779441,544946,1779442,544947,1779443,544940,1779444,544941,1779445,544942,
		1779446,544943,1779447,544964,1779460,544965,1779461,544966,1779462,544967,1779463,544960,
		1779464,544961,1779465,544962,1779466,544963,1779467,544974,1779470,544975,1779471,544976,
		1779472,544977,1779473,544970,1779474,544971,1779475,544972,1779476,544973,1779477,544914,
		1779490,544915,1779491,544916,1779492,544917,1779493,544910,1779494,544911,1779495,544912,
		1779496,544913,1779497,544854,1779550,544855,1779551,544856,1779552,544857,1779553,544850,
		1779554,544851,1779555,544852,1779556,544853,1779557,544874,1779570,544875,1779571,544876,
		1779572,544877,1779573,544870,1779574,544871,1779575,544872,1779576,544873,1779577,544808,
		1779584,544809,1779585,544804,1779588,544805,1779589,1508219,1836024,1508218,1836025,1508235,
		1836040,1508234,1836041,1508237,1836042,1508236,1836043,1508231,1836044,1508230,1836045,1508233,
		1836046,1508232,1836047,1508247,1836058,1508246,1836059,1509727,1837138,1509726,1837139,1509779,
		1837144,1509778,1837145,1509743,1837150,1509742,1837151,1509741,1837152,1509740,1837153,1509747,
		1837154,1509746,1837155,1509745,1837156,1509744,1837157,350882,1921910,350881,1921911,350880,
		1921912,350887,1921913,350883,1921917,350890,1921962,350892,1921964,350891,1921965,350894,
		1921966,350893,1921967,350896,1921968,350895,1921969,351192,1922620,351195,1922621,351194,
		1922622,351197,1922623,351196,1922624,351199,1922625,351198,1922626,351162,1922670,351161,
		1922671,351160,1922672,351169,1922679,351176,1922680,351175,1922681,351170,1922682,351177,
		1922683,351179,1922685,351174,1922686,351101,1922691,351102,1922694,351105,1922695,351100,
		1922696,351103,1922697,351106,1922698,351092,1922700,351091,1922701,351090,1922702,351097,
		1922703,351093,1922707,351052,1922740,351051,1922741,351050,1922742,351059,1922749,351682,
		1922930
	}'::int[]) WITH ORDINALITY AS u(c, i);
});
is($node->safe_psql('ob_runs', q{
	SELECT count(*), count(DISTINCT idem._outbox_id_bound('t', k, false)) FROM pair_keys}),
	'500|250', 'the keys share ranges in pairs');
for my $round (1 .. 3)
{
	$node->safe_psql('ob_runs', q{
		SELECT count(idem_outbox_send('t', k, jsonb_build_object('n', 1))) FROM (SELECT k FROM pair_keys ORDER BY i) p;
		SELECT count(idem_outbox_send('t', k, jsonb_build_object('n', 2))) FROM (SELECT k FROM pair_keys ORDER BY i DESC) p;
		SELECT count(idem_outbox_send('t', k, jsonb_build_object('n', 3))) FROM (SELECT k FROM pair_keys ORDER BY i) p;
		CREATE TABLE l1 AS SELECT * FROM idem_outbox_lease('r1', 10000, '1 millisecond', 3);
		SELECT pg_sleep(0.05);
		CREATE TABLE l2 AS SELECT * FROM idem_outbox_lease('r2', 10000, '1 hour', 3);
	});
	is($node->safe_psql('ob_runs', q{SELECT count(*), min(attempt), max(attempt) FROM l2}),
		'500|2|2', "round $round: r2 leased the heads of r1's runs again, alone");
	my $late = $node->safe_psql('ob_runs', q{SELECT string_agg(id::text, ',' ORDER BY id) FROM l1 WHERE payload->>'n' = '2'});
	my $heads = $node->safe_psql('ob_runs', q{SELECT string_agg(id::text, ',' ORDER BY id) FROM l2});
	my $at = $node->safe_psql('ob_runs', q{SELECT clock_timestamp() + interval '1 second'});
	my @acks;
	for my $ids ($late, $heads)
	{
		my %a = (out => '', err => '');
		$a{h} = IPC::Run::start(
			[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('ob_runs'),
			  '-c', "SELECT pg_sleep_until('$at')", '-c', "SELECT idem_outbox_ack('{$ids}'::uuid[])" ],
			'>', \$a{out}, '2>', \$a{err});
		push @acks, \%a;
	}
	$_->{h}->finish for @acks;
	is(join('|', map { $_->{err} } @acks), '|', "round $round: no error (no deadlock) in the two acks");
	is(join('|', map { (split /\n/, $_->{out})[-1] // '' } @acks), '500|500',
		"round $round: each ack counts its 500 messages");
	$node->safe_psql('ob_runs', q{
		DROP TABLE l1, l2;
		DELETE FROM idem.outbox;
		DELETE FROM idem.outbox_keys;
	});
}

$node->stop;
done_testing();
