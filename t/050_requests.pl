
# Copyright (c) idem contributors
#
# Request keys and the liveness of their owners: a request whose owner's
# session is gone is resumed at once by the next caller, whatever its lease;
# across a server crash, a checkpointed request is resumed and a finished
# one replayed.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('requests', 'restart_after_crash = on');

########################################################################
# The owner's session goes away
########################################################################

# The owner begins and checkpoints the request in a connection that stays
# open until psql is stopped.
my $owner = IdemTest::Session->new($node, 'postgres');
is( $owner->query(
		q{SELECT status FROM idem_request_begin('pay-1', 'fp', lease => '1 day');}),
	'new', 'a request is begun, with a lease of a day');
$owner->query(
	q{SELECT idem_request_checkpoint('pay-1', 'charged', '{"charge": "ch_1"}');});
my $owner_pid = $owner->query('SELECT pg_backend_pid();');

is( $node->safe_psql('postgres',
		q{SELECT status FROM idem_request_begin('pay-1', 'fp')}),
	'in_flight', 'in flight while its owner is connected');

# The owner's client goes away (its connection closes): the next begin
# resumes at once, a day before the lease runs out.
$owner->{h}->kill_kill;
$node->poll_query_until('postgres',
	"SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $owner_pid)")
  or die 'the owner did not go away';
is( $node->safe_psql('postgres',
		q{SELECT status, recovery_point, recovery_data, attempts
		    FROM idem_request_begin('pay-1', 'fp')}),
	'resume|charged|{"charge": "ch_1"}|2',
	'resumed from its checkpoint as soon as its owner disconnected');

# An owner terminated in the middle of its transaction: that transaction's
# work is gone, the committed checkpoint is resumed.  Its lease (a
# millisecond) is over: only the transaction that holds the row keeps the
# request in flight.
my $victim = IdemTest::Session->new($node, 'postgres');
$victim->query(q{SELECT idem_request_begin('pay-2', 'fp', lease => '1 millisecond');
                 SELECT idem_request_checkpoint('pay-2', 'step-1');
                 BEGIN;
                 SELECT idem_request_checkpoint('pay-2', 'step-2');});
my $victim_pid = $victim->query('SELECT pg_backend_pid();');
is( $node->safe_psql('postgres',
		q{SELECT status FROM idem_request_begin('pay-2', 'fp')}),
	'in_flight', 'in flight while its owner is in a transaction on it');
is( $node->safe_psql('postgres',
		"SELECT pg_terminate_backend($victim_pid, 60000)"),
	't', 'the owner is terminated');
ok($victim->lost, 'the owner lost its connection');
is( $node->safe_psql('postgres',
		q{SELECT status, recovery_point FROM idem_request_begin('pay-2', 'fp')}),
	'resume|step-1', 'resumed from the last committed checkpoint');

########################################################################
# Server crash
########################################################################

# pay-3: checkpointed by a session alive at the crash, which has a later
# checkpoint and the finish in a transaction not committed (written to disk
# by a CHECKPOINT before the crash); pay-4: finished.
my $holder = IdemTest::Session->new($node, 'postgres');
$holder->query(q{SELECT idem_request_begin('pay-3', 'fp', lease => '1 day');
                 SELECT idem_request_checkpoint('pay-3', 'authorized', '{"auth": 42}');
                 BEGIN;
                 SELECT idem_request_checkpoint('pay-3', 'captured', '{"capture": 1}');
                 SELECT idem_request_finish('pay-3', 201, '{"id": 3}');});
$node->safe_psql('postgres', q{
	SELECT idem_request_begin('pay-4', 'fp');
	SELECT idem_request_finish('pay-4', 201, '{"id": 4}');});
is( $node->safe_psql('postgres',
		q{SELECT status FROM idem_request_begin('pay-3', 'fp')}),
	'in_flight', 'in flight before the crash');

$node->safe_psql('postgres', 'CHECKPOINT');
$node->stop('immediate');
ok($holder->lost, 'the session holding pay-3 lost its connection in the crash');
$node->start;

is( $node->safe_psql('postgres',
		q{SELECT status, recovery_point, recovery_data
		    FROM idem_request_begin('pay-3', 'fp')}),
	'resume|authorized|{"auth": 42}',
	'a checkpointed request is resumed after the crash, from its last committed checkpoint');
is( $node->safe_psql('postgres',
		q{SELECT status, response_code, response_body
		    FROM idem_request_begin('pay-4', 'fp')}),
	'replay|201|{"id": 4}',
	'a finished request is replayed after the crash');

$node->stop;
done_testing();
