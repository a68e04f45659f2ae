
# Copyright (c) idem contributors
#
# Small helpers shared by idem's TAP tests:
#
#   idem_node(NAME, CONF...)     an initialised (UTF8, C.UTF-8), started
#                                node with idem installed in "postgres"
#   sqlstate_of(NODE, DB, SQL)   the SQLSTATE SQL fails with, '' on success
#   wait_for_log(NODE, RE, OFF)  wait until the server log matches RE after
#                                byte OFF; true if it did in time
#   IdemTest::Session            a psql session that stays open between
#                                queries (a transaction can be left open)

package IdemTest;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes qw(usleep);

our @EXPORT = qw(idem_node sqlstate_of wait_for_log);

sub idem_node
{
	my ($name, @conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(extra => [ '--locale=C.UTF-8', '--encoding=UTF8' ]);
	$node->append_conf('postgresql.conf', join("\n", @conf)) if @conf;
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION idem');
	return $node;
}

sub sqlstate_of
{
	my ($node, $db, $sql) = @_;
	my ($ret, $stdout, $stderr) =
	  $node->psql($db, "\\set VERBOSITY verbose\n$sql");
	return $stderr =~ /ERROR:  ([0-9A-Z]{5}):/ ? $1 : '';
}

sub wait_for_log
{
	my ($node, $re, $offset) = @_;
	for (my $i = 0; $i < 10 * $PostgreSQL::Test::Utils::timeout_default; $i++)
	{
		return 1
		  if slurp_file($node->logfile, $offset) =~ $re;
		usleep(100_000);
	}
	return 0;
}

package IdemTest::Session;

use PostgreSQL::Test::Utils;

sub new
{
	my ($class, $node, $db, @psql_args) = @_;
	my $self = { in => '', out => '', err => '' };
	$self->{timer} = IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default);
	$self->{h} = IPC::Run::start(
		[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-f', '-',
		  '-d', $node->connstr($db), @psql_args ],
		'<', \$self->{in}, '>', \$self->{out}, '2>', \$self->{err},
		$self->{timer});
	return bless $self, $class;
}

# Runs SQL and returns what it printed, without the trailing newline; undef
# if psql ended or timed out first.
sub query
{
	my ($self, $sql) = @_;
	$self->{out} = '';
	$self->{timer}->start($PostgreSQL::Test::Utils::timeout_default);
	$self->{in} .= "$sql\n\\echo __idem_done__\n";
	return undef
	  unless pump_until($self->{h}, $self->{timer}, \$self->{out},
		qr/__idem_done__\r?\n/);
	(my $res = $self->{out}) =~ s/\r?\n?__idem_done__\r?\n//;
	return $res;
}

# True if the server side of the session is gone: the next query fails
# with a lost connection and psql exits.
sub lost
{
	my ($self) = @_;
	$self->{err} = '';
	$self->{timer}->start($PostgreSQL::Test::Utils::timeout_default);
	$self->{in} .= "SELECT 1;\n";
	my $lost = pump_until($self->{h}, $self->{timer}, \$self->{err},
		qr/server closed the connection unexpectedly|terminating connection|no connection to the server/);
	$self->{h}->kill_kill;
	return $lost;
}

sub close
{
	my ($self) = @_;
	$self->{in} .= "\\q\n";
	$self->{h}->finish;
	return;
}

1;
