
# Copyright (c) idem contributors
#
# A text argument that idem refuses for its length is refused before it is
# read whole: a value of 200 MB, which compresses into about 2 MB of a
# table, given as a claim's id or namespace, a token's scope, a message's
# topic, key or type, leaves the backend's peak memory (the max resident
# size that log_statement_stats reports) far below the value's size.  So
# does the error of a nack, of which only what is kept is read.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('toasted_args');
$node->safe_psql('postgres', q{CREATE TABLE big AS SELECT repeat('x', 200000000) AS t});
like($node->safe_psql('postgres', q{SELECT pg_column_size(t) < 10000000 AND octet_length(t) = 200000000 FROM big}),
	qr/^t$/, 'the value is 200 MB, stored compressed in less than 10 MB');

for my $case (
	[ 'a claim id', q{idem_claim(t)} ],
	[ 'a claim namespace', q{idem_claim('m', t)} ],
	[ 'a token scope', q{idem_token_issue(t, '1 hour')} ],
	[ 'a message topic', q{idem_outbox_send(t, 'k', '{}')} ],
	[ 'a message key', q{idem_outbox_send('t', t, '{}')} ],
	[ 'a message type', q{idem_outbox_send('t', 'k', '{}', NULL, t)} ])
{
	my ($what, $call) = @$case;
	# each in a new backend: the peak is the process's
	my ($rc, $out, $err) = $node->psql('postgres', qq{
		SET client_min_messages = log;
		SET log_statement_stats = on;
		DO \$\$ BEGIN PERFORM $call FROM big;
		EXCEPTION WHEN string_data_right_truncation THEN RAISE NOTICE 'refused: %', SQLERRM; END \$\$;});
	like($err, qr/NOTICE:  refused: \S+ is too long/, "$what of 200 MB: refused as too long");
	my ($kb) = $err =~ /(\d+) kB max resident size/;
	ok(defined $kb && $kb < 100_000, "$what of 200 MB: the backend's peak is below 100 MB")
	  or diag("max resident size: " . ($kb // 'not reported') . " kB");
}

# A nack's error is cut to 2,000 bytes: no more than that is read of it.
$node->safe_psql('postgres', q{SELECT idem_outbox_send('n', 'k', '{}')});
my $id = $node->safe_psql('postgres', q{SELECT id FROM idem_outbox_lease('r', 1)});
my ($rc, $out, $err) = $node->psql('postgres', qq{
	SET client_min_messages = log;
	SET log_statement_stats = on;
	SELECT idem_outbox_nack('$id', t) FROM big;});
is($rc, 0, 'a nack with an error of 200 MB');
my ($kb) = $err =~ /(\d+) kB max resident size/;
ok(defined $kb && $kb < 100_000, "a nack's error of 200 MB: the backend's peak is below 100 MB")
  or diag("max resident size: " . ($kb // 'not reported') . " kB");
is($node->safe_psql('postgres', q{SELECT octet_length(last_error) FROM idem.outbox_keys WHERE topic = 'n'}),
	'2000', 'the error is kept cut to 2,000 bytes');

done_testing();
