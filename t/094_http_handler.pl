
# Copyright (c) idem contributors
#
# examples/http_handler.py, an HTTP API on Python's http.server and psycopg2,
# exercised with curl:
#
# - POST /payments with an Idempotency-Key (idem_request_begin and finish,
#   the business row in the same transaction): a retry with the same key
#   and body (written otherwise, 100.0 for 100 too) gets the first answer,
#   status and body byte for byte, and writes nothing; the same key with
#   another body is 422; a request without a key is 400; a retry while the
#   first attempt is still in flight (held on an advisory lock the test
#   owns) is 409, and once the first one finished, its answer; a business
#   write that fails rolls the key back with it, and the key can be used
#   again; a body the business table cannot take as the answer would state
#   it (an amount that is not an integer or out of range, a currency that is
#   not a string), or that is not JSON (NaN) or not jsonb (a \u0000), is a
#   400 that blames the body; an error the handler does not expect is 500,
#   and a retry sent at once is not refused as in flight;
# - POST /orders with a form's single-use token (idem_token_consume in the
#   business transaction): the first submission is 201, the same token
#   again 409, a token never issued 400; one order written; an item that is
#   not a string 400; a database error 500, the token still usable;
# - a body the handler does not read closes the connection, so that it is
#   not read as the next request; SIGTERM and SIGINT stop the handler.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IO::Socket::INET;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use IdemTest;

# Debian's python3 (with python3-psycopg2), whatever else is in PATH
my $python = -x '/usr/bin/python3' ? '/usr/bin/python3' : 'python3';
my $handler_py = "$FindBin::RealBin/../examples/http_handler.py";
my $json = JSON::PP->new->utf8->canonical;

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $node = idem_node('http_handler', "shared_preload_libraries = 'idem'", 'idem.maintenance = off');

sub sql { return $node->safe_psql('postgres', $_[0]); }

sub wait_for
{
	my ($what, $cond) = @_;
	for (my $i = 0; $i < 20 * $PostgreSQL::Test::Utils::timeout_default; $i++)
	{
		return 1 if $cond->();
		usleep(50_000);
	}
	diag("timed out waiting for $what");
	return 0;
}

my %pgenv = (PGHOST => $node->host, PGPORT => $node->port, PGDATABASE => 'postgres', PGUSER => 'postgres');

# start_handler NAME: a handler on a port of its own, written to $tmp/NAME.port
sub start_handler
{
	my ($name) = @_;
	return IPC::Run::start(
		[ $python, $handler_py, '--port', '0', '--port-file', "$tmp/$name.port", '--test-hooks' ],
		'>', "$tmp/$name.out", '2>', "$tmp/$name.err",
		init => sub {
			delete $ENV{$_} for grep { /^PG/ } keys %ENV;
			$ENV{$_} = $pgenv{$_} for keys %pgenv;
		},
		IPC::Run::timeout(3 * $PostgreSQL::Test::Utils::timeout_default));
}

my $handler = start_handler('handler');
ok(wait_for('the handler', sub { -s "$tmp/handler.port" }), 'the HTTP handler listens')
  or diag(slurp_file("$tmp/handler.err"));
my $port = slurp_file("$tmp/handler.port");
my $url = "http://127.0.0.1:$port";

# curl METHOD PATH BODY HEADERS...: (status, body)
sub curl_args
{
	my ($method, $path, $body, @headers) = @_;
	return ('curl', '-sS', '-X', $method, '-o', '-', '-w', '\n%{http_code}',
		(map { ('-H', $_) } ('Content-Type: application/json', @headers)),
		(defined $body ? ('--data-binary', $body) : ()), "$url$path");
}

sub split_answer
{
	my ($out) = @_;
	my ($body, $status) = $out =~ /\A(.*)\n(\d{3})\z/s or return ('', "no answer: $out");
	return ($status, $body);
}

sub curl
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ curl_args(@_) ], '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return split_answer($out);
}

# raw_http REQUEST: the status codes of the answers to REQUEST, sent as is on
# one connection, which the test then closes for writing
sub raw_http
{
	my ($request) = @_;
	my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Proto => 'tcp')
	  or die "cannot connect to the handler: $!";
	print $sock $request;
	shutdown($sock, 1);
	my $all = '';
	local $SIG{ALRM} = sub { die "the handler did not close the connection\n" };
	alarm($PostgreSQL::Test::Utils::timeout_default);
	1 while sysread($sock, $all, 65536, length $all);
	alarm(0);
	close($sock);
	my @codes;
	while ($all =~ m{\GHTTP/1\.[01] (\d{3})[^\n]*\n(.*?)\r\n\r\n}gcs)
	{
		push @codes, $1;
		my ($length) = $2 =~ /^Content-Length: (\d+)/mi;
		pos($all) += $length // 0;
	}
	push @codes, 'garbage' if (pos($all) // 0) < length $all;
	return join(' ', @codes);
}

########################################################################
# Request keys
########################################################################

my ($st, $body) = curl('POST', '/payments', '{"amount": 100, "currency": "EUR"}', 'Idempotency-Key: pay-1');
is($st, 201, 'a first POST: 201');
my $first = $body;
is_deeply($json->decode($first), { payment => 1, amount => 100, currency => 'EUR' }, 'with the payment');

($st, $body) = curl('POST', '/payments', '{ "currency":"EUR", "amount":100 }', 'Idempotency-Key: pay-1');
is("$st $body", "201 $first", 'a retry with the same key and body, written otherwise: the first answer, exactly');
is(sql('SELECT count(*) FROM payments'), 1, 'and no second payment');

($st, $body) = curl('POST', '/payments', '{"amount": 500, "currency": "EUR"}', 'Idempotency-Key: pay-1');
is($st, 422, 'the same key with another body: 422');
is(sql('SELECT count(*) FROM payments'), 1, 'nothing written');
# the handler commits the transactions of a replay and a mismatch: counted
is(sql(q{SELECT counters->>'replay', counters->>'mismatch' FROM idem_stats WHERE kind = 'request' AND ns = 'payments'}),
	'1|1', 'the replay and the mismatch are counted in idem_stats');

# The body is checked after the begin: 100.0 has the fingerprint of 100, and
# is a retry of the first payment, not a 400 that a client reads as unpaid.
($st, $body) = curl('POST', '/payments', '{"amount": 100.0, "currency": "EUR"}', 'Idempotency-Key: pay-1');
is("$st $body", "201 $first", 'a retry with the amount written 100.0: the first answer, exactly');

($st, $body) = curl('POST', '/payments', '{"amount": 100, "currency": "EUR"}');
is($st, 400, 'no Idempotency-Key: 400');
($st, $body) = curl('POST', '/payments', '{"amount": 100, "currency": "EUR"}', 'Idempotency-Key: ' . ('x' x 2000));
is($st, 400, 'a key too long: 400') or diag($body);
like($body, qr/invalid Idempotency-Key/, 'blaming the key');

# A business write that fails: the key is rolled back with it.
($st, $body) = curl('POST', '/payments', '{"amount": -5, "currency": "EUR"}', 'Idempotency-Key: pay-2');
is($st, 400, 'an invalid payment: 400');
is(sql(q{SELECT count(*) FROM idem.requests WHERE key = 'pay-2'}), 0,
	'the request key went with the rolled back transaction');
($st, $body) = curl('POST', '/payments', '{"amount": 5, "currency": "EUR"}', 'Idempotency-Key: pay-2');
is($st, 201, 'the same key with a corrected body runs anew: 201 (not 422)');

# Bodies the business table cannot take as the response states them: each
# is a 400 that blames the body (not the key), and nothing is written.
($st, $body) = curl('POST', '/payments', '{"amount": 100.5, "currency": "EUR"}', 'Idempotency-Key: bad-1');
is($st, 400, 'an amount that is not an integer: 400 (it was rounded into the table, and answered unrounded)');
($st, $body) = curl('POST', '/payments', '{"amount": 1, "currency": 5}', 'Idempotency-Key: bad-2');
is($st, 400, 'a currency that is not a string: 400');
($st, $body) = curl('POST', '/payments', '{"amount": {"v": 1}, "currency": "EUR"}', 'Idempotency-Key: bad-3');
is($st, 400, 'an amount that is an object: 400 (there was no answer)');
($st, $body) = curl('POST', '/payments', '{"amount": 100000000000000000000, "currency": "EUR"}',
	'Idempotency-Key: bad-4');
is($st, 400, 'an amount out of the range of the column: 400 (there was no answer)');
($st, $body) = curl('POST', '/payments', '{"amount": NaN, "currency": "EUR"}', 'Idempotency-Key: bad-5');
is($st, 400, 'NaN, which is not JSON: 400');
like($body, qr/the body is not a JSON object/, 'refused as the body is read (Python would take NaN)');
($st, $body) = curl('POST', '/payments', '{"amount": 1, "currency": "EU\\u0000R"}', 'Idempotency-Key: bad-6');
is($st, 400, 'a string that jsonb cannot hold: 400');
unlike($body, qr/Idempotency-Key/, 'blaming the body, not the key');
($st, $body) = curl('POST', '/payments', '{"amount": 1, "currency": "EUR"}', 'Idempotency-Key: bad-7',
	'Content-Length: many');
is($st, 400, 'a Content-Length that is not a number: 400 (there was no answer)');
is(sql(q{SELECT count(*) FROM payments WHERE request_key LIKE 'bad-%'}), 0, 'no payment written');
is(sql(q{SELECT count(*) FROM idem.requests WHERE key LIKE 'bad-%'}), 0, 'no request key kept');

# Errors the handler does not expect, after the begin: 500, a retry sent at
# once is not refused as in flight, and once the cause is gone the retry runs.
# A database error (a trigger that refuses every payment), which ends the
# transaction on the server:
sql(q{CREATE FUNCTION refuse_payment() RETURNS trigger LANGUAGE plpgsql
        AS $$BEGIN RAISE EXCEPTION 'payments are suspended'; END$$;
      CREATE TRIGGER refuse BEFORE INSERT ON payments FOR EACH ROW EXECUTE FUNCTION refuse_payment();});
($st, $body) = curl('POST', '/payments', '{"amount": 9, "currency": "EUR"}', 'Idempotency-Key: pay-4');
is($st, 500, 'a database error: 500') or diag($body);
($st, $body) = curl('POST', '/payments', '{"amount": 9, "currency": "EUR"}', 'Idempotency-Key: pay-4');
is($st, 500, 'retried at once: 500 again, not 409');
sql('DROP TRIGGER refuse ON payments');
($st, $body) = curl('POST', '/payments', '{"amount": 9, "currency": "EUR"}', 'Idempotency-Key: pay-4');
is($st, 201, 'the cause gone, the retry with the same key: 201');
# An exception in the handler itself, its transaction still open (a hold that
# is not a number): the server has not rolled it back, the handler must, before
# it answers.  A retry a few milliseconds later does not show it (close() wins
# that race); the log does, as it has each statement before it runs.
my $log_offset = -s $node->logfile;
($st, $body) = curl('POST', '/payments', '{"amount": 10, "currency": "EUR"}', 'Idempotency-Key: pay-5',
	'X-Test-Hold: none');
is($st, 500, 'an exception in the handler: 500 (there was no answer)') or diag($body);
my $log = slurp_file($node->logfile, $log_offset);
my ($pid) = $log =~ /\[(\d+)\] http_handler LOG:  statement: SELECT status.*'pay-5'/;
$pid //= 'none';
like($log, qr/\[$pid\] http_handler LOG:  statement: ROLLBACK/, 'its transaction rolled back before the answer');
($st, $body) = curl('POST', '/payments', '{"amount": 10, "currency": "EUR"}', 'Idempotency-Key: pay-5');
is($st, 201, 'retried at once: 201, not 409');
is(sql(q{SELECT count(*) FROM payments WHERE request_key IN ('pay-4', 'pay-5')}), 2, 'one payment for each key');

# In flight: the first attempt waits for an advisory lock the test holds,
# inside its transaction, after its begin.
my $holder = IdemTest::Session->new($node, 'postgres');
$holder->query('SELECT pg_advisory_lock(4242);');
my ($slow_out, $slow_err) = ('', '');
my $slow = IPC::Run::start(
	[ curl_args('POST', '/payments', '{"amount": 7, "currency": "EUR"}', 'Idempotency-Key: pay-3',
			'X-Test-Hold: 4242') ],
	'>', \$slow_out, '2>', \$slow_err);
ok( wait_for('the first attempt to wait', sub {
			sql(q{SELECT count(*) FROM pg_stat_activity
			      WHERE application_name = 'http_handler' AND wait_event_type = 'Lock'
			        AND query LIKE '%pg_advisory_xact_lock%'}) == 1 }),
	'the first attempt is in flight, its transaction open');
($st, $body) = curl('POST', '/payments', '{"amount": 7, "currency": "EUR"}', 'Idempotency-Key: pay-3');
is($st, 409, 'a concurrent retry while the first is in flight: 409');
($st, $body) = curl('POST', '/payments', '{"amount": 8, "currency": "EUR"}', 'Idempotency-Key: pay-3');
is($st, 409, 'also with another body: the first attempt decides (409 before 422)');
$holder->query('SELECT pg_advisory_unlock(4242);');
$slow->finish;
my ($slow_st, $slow_body) = split_answer($slow_out);
is($slow_st, 201, 'the first attempt finishes: 201');
($st, $body) = curl('POST', '/payments', '{"amount": 7, "currency": "EUR"}', 'Idempotency-Key: pay-3');
is("$st $body", "201 $slow_body", 'a retry after it: its answer');
is(sql(q{SELECT count(*) FROM payments WHERE request_key = 'pay-3'}), 1, 'one payment for the key');
# the handler commits the transactions of its 409s too: counted
is(sql(q{SELECT counters->>'in_flight' FROM idem_stats WHERE kind = 'request' AND ns = 'payments'}),
	'2', 'the two retries in flight are counted in idem_stats');
$holder->close;

########################################################################
# Single-use tokens
########################################################################

($st, $body) = curl('GET', '/orders/form');
is($st, 200, 'a form: 200');
my $token = $json->decode($body)->{token};
like($token, qr/^[A-Za-z0-9_-]{51}$/, 'with a token');
my $order = $json->encode({ token => $token, item => 'book' });
($st, $body) = curl('POST', '/orders', $order);
is($st, 201, 'the first submission: 201');
($st, $body) = curl('POST', '/orders', $order);
is($st, 409, 'the same token again: 409');
($st, $body) = curl('POST', '/orders', $json->encode({ token => 'A' x 51, item => 'book' }));
is($st, 400, 'a token never issued: 400');
is(sql('SELECT count(*) FROM orders'), 1, 'one order written');
is(sql(q{SELECT duplicates FROM idem_stats WHERE kind = 'token' AND ns = 'orders'}), '1',
	'the second submission is counted as a duplicate in idem_stats');
is(sql(q{SELECT counters->>'rejected_unknown' FROM idem_stats WHERE kind = 'token' AND ns = 'orders'}), '1',
	'and the token never issued as unknown (the handler commits that refusal too)');

($st, $body) = curl('GET', '/orders/form');
$token = $json->decode($body)->{token};
($st, $body) = curl('POST', '/orders', $json->encode({ token => $token, item => { title => 'book' } }));
is($st, 400, 'an item that is an object: 400 (there was no answer)');
($st, $body) = curl('POST', '/orders', '{"token": "' . $token . '", "item": "bo\u0000ok"}');
is($st, 400, 'an item that text cannot hold: 400 (there was no answer)');
# Database errors: a form that cannot be made, an order that cannot be written
# (the database refuses connections, a trigger refuses orders): 500, and the
# token is still good once the cause is gone.
$node->safe_psql('template1', 'ALTER DATABASE postgres ALLOW_CONNECTIONS false');
($st, $body) = curl('GET', '/orders/form');
$node->safe_psql('template1', 'ALTER DATABASE postgres ALLOW_CONNECTIONS true');
is($st, 500, 'a form while the database refuses connections: 500 (there was no answer)');
sql(q{CREATE FUNCTION refuse_order() RETURNS trigger LANGUAGE plpgsql
        AS $$BEGIN RAISE EXCEPTION 'orders are suspended'; END$$;
      CREATE TRIGGER refuse BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION refuse_order();});
$order = $json->encode({ token => $token, item => 'pen' });
($st, $body) = curl('POST', '/orders', $order);
is($st, 500, 'an order the database refuses: 500 (there was no answer)');
sql('DROP TRIGGER refuse ON orders');
($st, $body) = curl('POST', '/orders', $order);
is($st, 201, 'the cause gone, the same token: 201');

########################################################################
# Bodies left unread
########################################################################

# A body the handler does not read would be read as the next request on the
# connection: the handler closes it instead.  Each request below carries a
# GET /nothere as its body; had that been read as a request, a 404 follows.
my $inner = "GET /nothere HTTP/1.1\r\nHost: x\r\n\r\n";
is(raw_http($inner . $inner), '404 404', 'two requests on one connection: two answers');
is(raw_http("POST /nothere HTTP/1.1\r\nHost: x\r\nContent-Length: " . length($inner) . "\r\n\r\n$inner"),
	'404', 'a POST to an unknown path: one answer, the connection closed');
is(raw_http("POST /payments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: raw-1\r\nContent-Length: many\r\n\r\n$inner"),
	'400', 'a Content-Length that is not a number: one answer, the connection closed');
is(raw_http("POST /payments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: raw-2\r\nTransfer-Encoding: chunked\r\n\r\n$inner"),
	'400', 'a chunked body: one answer, the connection closed');

$handler->signal('TERM');
$handler->finish;
is($handler->full_result(0), 0, 'the handler stops on SIGTERM with exit code 0');
my $second = start_handler('second');
ok(wait_for('the second handler', sub { -s "$tmp/second.port" }), 'a second handler listens');
$second->signal('INT');
eval { $second->finish; };
is($second->full_result(0), 0, 'it stops on SIGINT with exit code 0') or diag($@ . slurp_file("$tmp/second.err"));

$node->stop;
done_testing();
