#!/usr/bin/perl
# Copyright (c) idem contributors
#
# Random calls of idem's functions from several sessions at once, for a
# bounded time.  The functions are found in the catalog (every function that
# belongs to the extension), so each new capability is fuzzed as soon as it
# is installed.  Arguments are drawn by type and by argument name: keys from
# a small pool (so that claims collide), empty, huge, multibyte and NULL
# strings, values read from a table (short, compressed and out-of-line
# varlenas), arrays of every shape, extreme intervals and integers.  The calls
# run inside many statement shapes: single calls, set-returning series,
# transactions with savepoints and two-phase commit, PL/pgSQL exception
# blocks, prepared statements, cursors, read-only transactions, forced
# parallel plans, DDL on idem's tables (reindex, vacuum full, extra indexes,
# DROP EXTENSION rolled back), direct DML, cancels and reconnections.  Some
# shapes chain calls on what others return or hold, in one statement, one
# transaction or one session: requests begun then checkpointed and finished,
# outbox messages leased then acknowledged or failed (retried, dead), ids of
# the messages leased by any session, transitions of guarded rows by the
# values of their primary key, and the OIDs of triggers, guards among them.
#
#   perl test/fuzz/idem_fuzz.pl [--seconds N] [--sessions N] [--seed N]
#                               [--statement-timeout MS] [--quiet]
#
# It connects with psql through the libpq environment (PGHOST, PGPORT,
# PGDATABASE, PGUSER) as a superuser.  The database needs idem and the objects
# of test/fuzz/setup.sql.  Each session checks what every statement did:
# the report lists statements run, errors by SQLSTATE class, internal errors
# (SQLSTATE class XX) with their statement, lost connections (a crashed
# backend) with the statement that was running, statements that did not
# return in time (hangs), and the memory idem's contexts hold per backend.
# The last line is "verdict: PASS" or "verdict: FAIL"; the exit status is 0
# on PASS, 1 on FAIL and 2 when the run could not start.

use strict;
use warnings;

use Encode qw(encode decode);
use File::Temp qw(tempdir);
use Getopt::Long;
use IPC::Run;
use POSIX ();
use Storable qw(store retrieve);
use Time::HiRes qw(time usleep);

my %opt = (
	seconds => 30,
	sessions => 2,
	seed => (time() * 1000 ^ $$) % 1_000_000,
	'statement-timeout' => 5000,
	'max-contexts' => 20,
	quiet => 0,);
GetOptions(\%opt, 'seconds=f', 'sessions=i', 'seed=i', 'statement-timeout=i',
	'max-contexts=i', 'quiet')
  or die "usage: $0 [--seconds N] [--sessions N] [--seed N]\n";

# A statement that has not returned after this long is a hang.
my $hang_after = 60 + $opt{'statement-timeout'} / 1000;

########################################################################
# What is there to call
########################################################################

sub psql_query
{
	my ($sql) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-F', "\t",
		'-c', $sql ], '>', \$out, '2>', \$err)
	  or die "psql failed: $err";
	return map { [ split /\t/, $_, -1 ] } split /\n/, decode('UTF-8', $out);
}

# Every function of the extension, but triggers: name, schema, argument
# types, argument names, number of defaults, result type.
my @funcs;
for my $r (psql_query(q{
	SELECT p.proname, n.nspname,
	       array_to_string(ARRAY(SELECT format_type(t, NULL)
	                               FROM unnest(p.proargtypes) t), '|'),
	       array_to_string(coalesce(p.proargnames, '{}'), '|'),
	       p.pronargdefaults, format_type(p.prorettype, NULL), p.proretset
	  FROM pg_proc p
	  JOIN pg_namespace n ON n.oid = p.pronamespace
	  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass
	                  AND d.objid = p.oid AND d.deptype = 'e'
	  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem'
	 WHERE p.prokind = 'f'
	   AND p.prorettype NOT IN ('trigger'::regtype, 'event_trigger'::regtype)
	 ORDER BY 1, 3}))
{
	my ($name, $nsp, $types, $names, $ndef, $ret, $retset) = @$r;
	my @types = $types eq '' ? () : split /\|/, $types;
	my @names = $names eq '' ? () : split /\|/, $names;
	push @funcs,
	  {
		name => $name,
		qname => ($nsp eq 'public' ? '' : "$nsp.") . $name,
		types => \@types,
		names => \@names,
		ndef => $ndef,
		ret => $ret,
		retset => $retset eq 't',
		parallel_safe => 0,
	  };
}
die "no function of the extension idem found: is it installed?\n"
  unless @funcs;
my %parallel_safe = map { $_->[0] => 1 } psql_query(q{
	SELECT p.proname FROM pg_proc p
	  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass
	                  AND d.objid = p.oid AND d.deptype = 'e'
	  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem'
	 WHERE p.proparallel = 's'});
$_->{parallel_safe} = $parallel_safe{ $_->{name} } ? 1 : 0 for @funcs;
my %have = map { $_->{name} => 1 } @funcs;

# Labels of the enum types, to pass enum arguments.
my %enum_labels;
push @{ $enum_labels{ $_->[0] } }, $_->[1]
  for psql_query(q{SELECT format_type(enumtypid, NULL), enumlabel
                     FROM pg_enum ORDER BY enumtypid, enumsortorder});

# idem's tables, for DDL and DML.
my @idem_tables = map { $_->[0] } psql_query(q{
	SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	 WHERE n.nspname = 'idem' AND c.relkind = 'r' ORDER BY 1});
my %columns;
push @{ $columns{ $_->[0] } }, $_->[1] for psql_query(q{
	SELECT c.relname, a.attname FROM pg_attribute a
	  JOIN pg_class c ON c.oid = a.attrelid
	  JOIN pg_namespace n ON n.oid = c.relnamespace
	 WHERE n.nspname = 'idem' AND c.relkind = 'r' AND a.attnum > 0
	   AND NOT a.attisdropped ORDER BY c.relname, a.attnum});
my %ts_columns;
push @{ $ts_columns{ $_->[0] } }, $_->[1] for psql_query(q{
	SELECT c.relname, a.attname FROM pg_attribute a
	  JOIN pg_class c ON c.oid = a.attrelid
	  JOIN pg_namespace n ON n.oid = c.relnamespace
	 WHERE n.nspname = 'idem' AND c.relkind = 'r' AND a.attnum > 0
	   AND NOT a.attisdropped AND a.atttypid = 'timestamptz'::regtype});

# fuzz.pool: values for arguments of a given name ("ns", "token", ...) or
# type ("type:regclass"), by row number; fuzz.vals: stored values by id.
my %pool;
for my $r (psql_query(q{SELECT arg, n FROM fuzz.pool ORDER BY n}))
{
	push @{ $pool{ $r->[0] } }, $r->[1];
}
# Statements given by the setup, with {name:type} replaced by a random
# value of that type for an argument of that name.
my @templates = map { $_->[0] }
  psql_query(q{SELECT v FROM fuzz.pool WHERE arg = 'statement' ORDER BY n});
my ($nvals) =
  map { $_->[0] } psql_query(q{SELECT count(*) FROM fuzz.vals});
# The tables that a guard can be put on (the fuzz makes none): a backend
# keeps a cache entry, with a memory context, for each guarded one.
my ($ntables) = map { $_->[0] } psql_query(q{
	SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	 WHERE c.relkind IN ('r', 'p')
	   AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'idem')
	   AND n.nspname NOT LIKE 'pg\_toast%'});

# The guarded tables of the setup (by their guard on the table itself, not
# the clones on partitions): the columns of their primary key, the values
# of the keys of their rows, and the states of their machine, so that
# idem_transition finds rows by keys of the right shape; and the statements
# that guard a table again once a random call unguarded it: idem_guard, or
# for a guard that does not work, the trigger made again where the check
# of guard DDL does not fire (idem_guard would mend it).
my @guarded;
if (my ($has_guard) = map { $_->[0] }
	psql_query(q{SELECT to_regproc('idem_guard_trigger') IS NOT NULL}))
{
	if ($has_guard eq 't')
	{
		for my $r (psql_query(q{
			SELECT c.oid::regclass::text,
			       (SELECT string_agg(format('%I::text', a.attname), ', ' ORDER BY k.n)
			          FROM unnest(i.indkey) WITH ORDINALITY k(attnum, n)
			          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum),
			       i.indnatts,
			       split_part(encode(t.tgargs, 'escape'), '\000', 1),
			       CASE WHEN idem._guard_problem(t.oid) IS NULL THEN
			           format('SELECT idem_guard(%L, %s);', c.oid::regclass,
			                  (SELECT string_agg(quote_literal(a), ', ')
			                     FROM unnest(string_to_array(
			                              rtrim(encode(t.tgargs, 'escape'), '\000'), '\000')) a))
			       ELSE regexp_replace(pg_get_triggerdef(t.oid), '^CREATE TRIGGER',
			                           'CREATE OR REPLACE TRIGGER') || ';'
			       END,
			       idem._guard_problem(t.oid) IS NOT NULL
			  FROM pg_trigger t
			  JOIN pg_class c ON c.oid = t.tgrelid
			  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'fuzz'
			  JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
			 WHERE t.tgfoid = 'idem_guard_trigger'::regproc AND t.tgparentid = 0
			 ORDER BY 1}))
		{
			my ($tbl, $cols, $ncols, $machine, $reguard, $broken) = @$r;
			my @keys = psql_query("SELECT $cols FROM $tbl ORDER BY $cols");
			my @states = map { $_->[0] } psql_query(
				"SELECT from_state FROM idem.transitions WHERE machine = "
				  . lit($machine)
				  . " UNION SELECT to_state FROM idem.transitions WHERE machine = "
				  . lit($machine)
				  . " ORDER BY 1");
			push @guarded,
			  {
				tbl => $tbl,
				cols => $cols,
				ncols => $ncols,
				keys => \@keys,
				states => \@states,
				broken => $broken eq 't',
				reguard => $broken eq 't'
				? [
					'BEGIN;',
					'SET LOCAL session_replication_role = replica;',
					"DROP TRIGGER IF EXISTS idem_guard ON $tbl;",
					$reguard, 'COMMIT;'
				  ]
				: [$reguard],
			  };
		}
	}
}

########################################################################
# Random values
########################################################################

sub pick { return $_[ int rand @_ ] }
sub chance { return rand() < $_[0] }

# Weighted choice among [weight, code] pairs.
sub wpick
{
	my $total = 0;
	$total += $_->[0] for @_;
	my $r = rand $total;
	for (@_)
	{
		return $_->[1]->() if ($r -= $_->[0]) < 0;
	}
	return $_[-1]->[1]->();
}

sub lit
{
	my ($s) = @_;
	$s =~ s/'/''/g;
	return "'$s'";
}

my @KEYS = map { "k$_" } 0 .. 24;
my @NSS = ('default', 'a', 'b', 'fuzz', "\x{e9}t\x{e9}", '');
my @UNICODE = ("\x{e9}", "\x{df}", "\x{4e2d}", "\x{6587}", "\x{1f642}",
	"\x{301}", "\x{202e}", "\x{feff}", "\x{10fffd}", "\x{200b}", "\x{3c3}",
	"\x{fb01}", "\x{130}");

sub rand_ascii
{
	my ($n) = @_;
	return join '', map { chr(32 + int rand 95) } 1 .. $n;
}

sub rand_unicode
{
	my ($n) = @_;
	return join '',
	  map { chance(0.5) ? pick(@UNICODE) : chr(97 + int rand 26) } 1 .. $n;
}

# Strings around the limits: 63 bytes for namespaces and scopes, 512 for
# keys, in single and multibyte characters; and far beyond.
sub boundary_text
{
	return pick(
		map({ "repeat('x', $_)" } 1, 62, 63, 64, 511, 512, 513, 2000, 8192,
			100_000, 1_048_576),
		"repeat('\x{e9}', 31) || 'x'",    # 63 bytes
		"repeat('\x{e9}', 32)",           # 64 bytes
		"repeat('\x{e9}', 256)",          # 512 bytes
		"repeat('\x{e9}', 257)",          # 514 bytes
		"repeat('\x{4e2d}', 21)",         # 63 bytes
		"repeat('\x{4e2d}', 171)",        # 513 bytes
		"repeat('\x{1f642}', 128)",       # 512 bytes
		"repeat('\x{1f642}', 129)",       # 516 bytes
		"repeat('ab', 4096)",             # compressible
		"(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 64) g)");
}

sub special_text
{
	return pick(
		"E'\\x01'", "E'\\t'", "E'a\\nb'", "' '", "'  k1  '", "'k1 '", "'K1'",
		q{'\\'}, q{''''}, "'%s%n%x'", "'NULL'", "'default'", "'-1'", "'0'",
		"E'\\x7f'", lit("\x{feff}k1"), lit("a\x{301}"), lit("\x{e1}"),
		lit("\x{202e}k1"), "'k1' COLLATE \"POSIX\"", "'k1'::varchar(1)",
		"'k1'::name::text", "'k1'::char(5)::text", "upper('k1')",
		"chr(1114111)", "'\$'", "'\$\$'");
}

# Text for an argument whose name says what it is.
sub text_expr
{
	my ($role, $ctx) = @_;
	$ctx //= {};
	return lit(pick(@NSS[0 .. 4])) if $role eq 'ns' && chance(0.6);
	return lit(pick(@KEYS)) if $role eq 'key' && chance(0.5);
	return "'s' || (g % 7)"
	  if $ctx->{series} && $role eq 'key' && chance(0.5);
	return wpick(
		[ 5, sub { 'NULL' } ],
		[ 4, sub { "''" } ],
		[ 12, sub { lit(rand_ascii(1 + int rand 20)) } ],
		[ 7, sub { lit(rand_unicode(1 + int rand 12)) } ],
		[ 8, \&boundary_text ],
		[ 6, \&special_text ],
		[
			6,
			sub {
				'(SELECT v FROM fuzz.vals WHERE id = ' . (1 + int rand $nvals) . ')';
			}
		],
		[ 3, sub { call_returning('text', $ctx) // 'NULL' } ],
		[
			2,
			sub {
				pick('now()::text', 'md5(random()::text)',
					"(random() * 30)::int::text", 'current_user::text',
					'pg_backend_pid()::text');
			}
		]);
}

# HTTP status codes for a response code (and some beyond them); small
# counts for a batch size, a run length or a number of attempts.
my %int_role = (
	response_code => [
		100, 101, 199, 200, 201, 202, 204, 299, 301, 304, 400, 404, 409, 422,
		429, 499, 500, 502, 503, 599
	],
	max_messages => [ 1, 2, 3, 5, 10, 100, 1000, 10000 ],
	per_key => [ 1, 1, 2, 3, 10, 10000 ],
	max_attempts => [ 1, 2, 3, 10, 1000 ],);

sub int_expr
{
	my ($type, $argname) = @_;
	$argname //= '';
	if ($int_role{$argname} && chance(0.85))
	{
		my @r = @{ $int_role{$argname} };
		push @r, 100 + int rand 500 if $argname eq 'response_code';
		push @r, 1 + int rand 20 unless $argname eq 'response_code';
		return '(' . pick(@r) . ")::$type";
	}
	return '(' . pick(99, 600, 0, -1, 1000, 10001) . ")::$type"
	  if $int_role{$argname} && chance(0.5);
	my @v = (0, 1, -1, 2, 5, 100, 10000, 2147483647, -2147483648,
		1 + int rand 50);
	push @v, '9223372036854775807', '-9223372036854775808'
	  if $type eq 'bigint';
	return chance(0.08) ? "NULL::$type" : '(' . pick(@v) . ")::$type";
}

# Spans that idem takes for a lease, a retry or a backoff: more than
# nothing and at most a day.
my %interval_role = map { $_ => 1 }
  qw(lease retry_after backoff_base backoff_max);

sub interval_expr
{
	my ($argname) = @_;
	$argname //= '';
	return lit(
		pick(
			'1 microsecond', '1 millisecond', '10 milliseconds',
			'100 milliseconds', '1 second', '30 seconds', '5 minutes',
			'1 hour', '1 day', '24:00:00', (1 + int rand 900) . ' milliseconds',
			$argname eq 'retry_after' ? ('0', '0') : ()))
	  . '::interval'
	  if $interval_role{$argname} && chance(0.75);
	return 'NULL::interval' if chance(0.08);
	return lit(
		pick(
			'0', '1 microsecond', '-1 microsecond', '1 second', '1 hour',
			'7 days', '1 mon', '1 mon -30 days', '-1 day', '1 year',
			'1 year 1 day', '100 years', '178000000 years',
			'-178000000 years', '1 day -86400 seconds', '00:00:00.000001',
			(1 + int rand 100) . ' seconds', (1 + int rand 48) . ' hours'))
	  . '::interval';
}

sub timestamptz_expr
{
	return pick('NULL::timestamptz', 'now()', "'infinity'::timestamptz",
		"'-infinity'::timestamptz", "'epoch'::timestamptz",
		"'294276-12-31'::timestamptz", "'4713-01-01 BC'::timestamptz",
		"now() - interval '8 days'", "now() + interval '1 hour'");
}

sub json_value
{
	my ($depth) = @_;
	return wpick(
		[ 3, sub { pick('null', 'true', '1', '-1.5e300', '"x"', '""') } ],
		[
			2,
			sub {
				my $s = rand_ascii(int rand 8);
				$s =~ s/(["\\])/\\$1/g;
				return "\"$s\"";
			}
		],
		[
			$depth < 4 ? 2 : 0,
			sub {
				'['
				  . join(',', map { json_value($depth + 1) } 1 .. int rand 4)
				  . ']';
			}
		],
		[
			$depth < 4 ? 2 : 0,
			sub {
				'{'
				  . join(',',
					map { "\"" . pick(@KEYS, 'a', 'from', 'to') . "\":" . json_value($depth + 1) }
					  1 .. int rand 4)
				  . '}';
			}
		]);
}

# The id of an outbox message: one leased now (by any session), one in the
# outbox, a dead head; or one that is no message's.
sub uuid_expr
{
	my $k = int rand 8;
	return wpick(
		[
			4,
			sub {
				'(SELECT head_id FROM idem.outbox_keys WHERE leased_by IS NOT NULL '
				  . "ORDER BY available_at DESC, topic, key OFFSET $k LIMIT 1)";
			}
		],
		[
			3,
			sub {
				'(SELECT id FROM idem.outbox ORDER BY '
				  . pick('id', 'seq', 'seq DESC')
				  . " OFFSET $k LIMIT 1)";
			}
		],
		[
			1,
			sub {
				'(SELECT head_id FROM idem.outbox_keys WHERE dead '
				  . "ORDER BY topic, key OFFSET $k LIMIT 1)";
			}
		],
		[
			3,
			sub {
				pick('NULL::uuid', 'gen_random_uuid()',
					"'00000000-0000-0000-0000-000000000000'::uuid",
					"'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid");
			}
		]);
}

# An OID, as taken by the functions of a trigger: a guard's (also one cloned
# on a partition), any other trigger's, or none.
sub oid_expr
{
	my $k = int rand 12;
	return pick(
		"(SELECT oid FROM pg_trigger WHERE tgfoid = 'idem_guard_trigger'::regproc "
		  . "ORDER BY oid OFFSET $k LIMIT 1)",
		"(SELECT oid FROM pg_trigger ORDER BY oid DESC OFFSET $k LIMIT 1)",
		'(SELECT max(oid) + 1 FROM pg_trigger)', "'fuzz.events'::regclass::oid",
		'0::oid', "'4294967295'::oid", 'NULL::oid');
}

sub array_expr
{
	my ($elemtype, $argname, $ctx) = @_;
	my $type = "$elemtype\[\]";
	return wpick(
		[ 3, sub { "NULL::$type" } ],
		[ 3, sub { "'{}'::$type" } ],
		[
			12,
			sub {
				my @e = map { value_expr($elemtype, $argname, $ctx) }
				  0 .. int rand 8;
				return "ARRAY[" . join(', ', @e) . "]::$type";
			}
		],
		[
			$elemtype eq 'text' ? 6 : 0,
			sub {
				my @e = map { lit(pick(@KEYS[0 .. 5])) } 0 .. int rand 10;
				return "ARRAY[" . join(', ', @e) . "]::$type";
			}
		],
		[
			$elemtype eq 'text' ? 4 : 0,
			sub {
				my $n = pick(10, 100, 1000, 20000);
				my $m = pick(3, 50, 1_000_000);
				return "ARRAY(SELECT 'b' || (g % $m) FROM generate_series(1, $n) g)";
			}
		],
		[
			$elemtype eq 'text' ? 3 : 0,
			sub {
				pick("'{{k1,k2},{k3,k4}}'::text[]", "'[0:1]={k1,k2}'::text[]",
					"'[-5:-5]={k9}'::text[]", "'{{{k1}}}'::text[]",
					"'{k1,NULL}'::text[]", "'{NULL}'::text[]",
					"array_fill('k1'::text, ARRAY[0])",
					"array_fill('k1'::text, ARRAY[2, 0])",
					"array_fill(NULL::text, ARRAY[3])");
			}
		],
		[
			$elemtype eq 'text' ? 3 : 0,
			sub {
				'(SELECT a FROM fuzz.vals WHERE id = ' . (1 + int rand $nvals) . ')';
			}
		],
		[
			# the ids of the messages leased now, or of any, some twice
			$elemtype eq 'uuid' ? 10 : 0,
			sub {
				pick(
					'ARRAY(SELECT head_id FROM idem.outbox_keys WHERE leased_by IS NOT NULL)',
					'ARRAY(SELECT head_id FROM idem.outbox_keys WHERE leased_by IS NOT NULL '
					  . 'ORDER BY available_at DESC LIMIT ' . (1 + int rand 5) . ')',
					'ARRAY(SELECT id FROM idem.outbox ORDER BY seq LIMIT '
					  . pick(1, 5, 50) . ')',
					'ARRAY(SELECT k.head_id FROM idem.outbox_keys k, generate_series(1, 2) '
					  . 'WHERE k.head_id IS NOT NULL)',
					'ARRAY(SELECT head_id FROM idem.outbox_keys WHERE leased_by IS NOT NULL '
					  . 'UNION ALL SELECT gen_random_uuid())');
			}
		]);
}

sub role_of
{
	my ($argname) = @_;
	return 'ns' if $argname =~ /(^|_)(ns|scope|namespace)$/;
	return 'key' if $argname =~ /(id|key|token|ids|keys)$/;
	return '';
}

# An SQL expression of the given type.
sub value_expr
{
	my ($type, $argname, $ctx) = @_;
	$argname //= '';
	$ctx //= {};

	for my $k ("$argname:$type", $argname, "type:$type")
	{
		if ($pool{$k} && chance(0.55))
		{
			return "(SELECT v::$type FROM fuzz.pool WHERE n = "
			  . pick(@{ $pool{$k} }) . ')';
		}
	}
	if (($ctx->{depth} // 0) < 2 && chance(0.03))
	{
		my $c = call_returning($type, $ctx);
		return $c if defined $c;
	}
	return array_expr($1, $argname, $ctx) if $type =~ /^(.*)\[\]$/;
	if ($type eq 'text' || $type eq 'name' || $type eq 'character varying')
	{
		my $e = text_expr(role_of($argname), $ctx);
		return $type eq 'text' ? "$e" : "($e)::$type";
	}
	return int_expr($type, $argname) if $type =~ /^(integer|bigint|smallint)$/;
	return interval_expr($argname) if $type eq 'interval';
	return timestamptz_expr() if $type eq 'timestamp with time zone';
	return pick('true', 'false', 'NULL::boolean') if $type eq 'boolean';
	return pick("NULL::$type", lit(json_value(0)) . "::$type")
	  if $type eq 'jsonb' || $type eq 'json';
	return pick(
		'NULL::bytea', "'\\x'::bytea", "'\\x00'::bytea",
		"sha256('k1')", "decode(md5(random()::text), 'hex')",
		"decode(repeat('ff', 5000), 'hex')")
	  if $type eq 'bytea';
	return pick(
		'NULL::regclass', "'idem.claims'::regclass",
		"'fuzz.events'::regclass", "'pg_class'::regclass",
		'0::oid::regclass', '12345::oid::regclass',
		"'idem.claims_pkey'::regclass", "'pg_stat_activity'::regclass")
	  if $type eq 'regclass';
	return uuid_expr() if $type eq 'uuid';
	return oid_expr() if $type eq 'oid';
	return pick('NULL::numeric', '0::numeric', "'NaN'::numeric",
		'1e100::numeric', '-1.5::numeric')
	  if $type eq 'numeric';
	if ($enum_labels{$type})
	{
		return chance(0.1)
		  ? "NULL::$type"
		  : lit(pick(@{ $enum_labels{$type} })) . "::$type";
	}
	return "NULL::$type";
}

# A value without a subquery, as EXECUTE takes.
sub plain_value
{
	my ($type, $argname) = @_;
	for (1 .. 50)
	{
		my $v = value_expr($type, $argname);
		return $v unless $v =~ /\bSELECT\b/i;
	}
	return "NULL::$type";
}

# A call of one of the functions, with random arguments.  Trailing
# arguments that have defaults are sometimes left out, and names are
# sometimes used.
sub call_expr
{
	my ($f, $ctx) = @_;
	my %c = (%{ $ctx // {} }, depth => ($ctx->{depth} // 0) + 1);
	my @types = @{ $f->{types} };
	my $n = @types;
	$n -= int rand($f->{ndef} + 1) if $f->{ndef} && chance(0.3);
	my @args = map { value_expr($types[$_], $f->{names}[$_], \%c) } 0 .. $n - 1;
	if (@{ $f->{names} } == @types && $n > 1 && chance(0.2))
	{
		my @named = map { "$f->{names}[$_] => $args[$_]" } 0 .. $n - 1;
		@named = reverse @named if chance(0.5);
		return "$f->{qname}(" . join(', ', @named) . ')';
	}
	return "$f->{qname}(" . join(', ', @args) . ')';
}

sub call_returning
{
	my ($type, $ctx) = @_;
	my @f = grep { $_->{ret} eq $type && !$_->{retset} } @funcs;
	return undef unless @f;
	return call_expr(pick(@f), $ctx);
}

sub any_call
{
	my ($ctx) = @_;
	my $f = pick(@funcs);
	my $c = call_expr($f, $ctx);
	return $f->{retset} ? "(SELECT count(*) FROM $c)" : $c;
}

########################################################################
# Statement shapes: each returns a list of statements, sent one by one
########################################################################

my $session_no;
my $uniq = 0;
my @prepared_gids;

sub select_calls
{
	my $n = chance(0.7) ? 1 : 2 + int rand 3;
	return 'SELECT ' . join(', ', map { any_call() } 1 .. $n) . ';';
}

sub series_calls
{
	my $n = pick(2, 5, 50, 500);
	my $ctx = { series => 1 };
	return 'SELECT count(*), count(DISTINCT x) FROM (SELECT '
	  . any_call($ctx)
	  . "::text AS x FROM generate_series(1, $n) g) s;";
}

sub inner_statement
{
	return wpick(
		[ 10, \&select_calls ],
		[ 2, \&series_calls ],
		[ 2, sub { 'SAVEPOINT s' . int(rand(3)) . ';' } ],
		[ 2, sub { 'ROLLBACK TO SAVEPOINT s' . int(rand(3)) . ';' } ],
		[ 1, sub { 'RELEASE SAVEPOINT s' . int(rand(3)) . ';' } ],
		[
			1,
			sub {
				"SET LOCAL lock_timeout = '" . pick(1, 10, 200) . "ms';";
			}
		],
		[
			1,
			sub {
				"SET LOCAL statement_timeout = '" . pick(1, 20, 300) . "ms';";
			}
		],
		[ 1, sub { 'SELECT pg_sleep(' . pick(0.01, 0.05, 0.2) . ');' } ],
		[ 2, \&dml ],
		[
			1,
			sub {
				my $t = pick(@idem_tables);
				"SELECT count(*) FROM (SELECT 1 FROM idem.$t TABLESAMPLE BERNOULLI (20) "
				  . pick('FOR UPDATE', 'FOR SHARE', 'FOR KEY SHARE',
					'FOR NO KEY UPDATE', 'FOR UPDATE SKIP LOCKED')
				  . ') s;';
			}
		]);
}

sub txn
{
	my @s = ('\\set ON_ERROR_ROLLBACK ' . (chance(0.7) ? 'on' : 'off'),
		'BEGIN'
		  . pick('', '', ' ISOLATION LEVEL REPEATABLE READ',
			' ISOLATION LEVEL SERIALIZABLE', ' ISOLATION LEVEL READ COMMITTED')
		  . ';');
	push @s, inner_statement() for 0 .. int rand 6;
	my $end = wpick(
		[ 55, sub { 'COMMIT;' } ],
		[ 35, sub { 'ROLLBACK;' } ],
		[
			10,
			sub {
				my $gid = "fz_${session_no}_" . ++$uniq;
				push @prepared_gids, $gid;
				"PREPARE TRANSACTION '$gid';";
			}
		]);
	push @s, $end, '\\set ON_ERROR_ROLLBACK off';
	return @s;
}

# A prepared transaction stays in flight for a few statements.
sub finish_prepared
{
	return () unless @prepared_gids && chance(0.5);
	my $gid = shift @prepared_gids;
	return (pick('COMMIT', 'ROLLBACK') . " PREPARED '$gid';");
}

sub do_block
{
	my $body = join ' ', map { 'PERFORM ' . any_call() . ';' } 0 .. int rand 3;
	my $fail = pick('', 'PERFORM 1 / 0;', "RAISE EXCEPTION 'fz';",
		"RAISE SQLSTATE 'XA001';", 'PERFORM pg_sleep(0.01);');
	my $handler =
	  chance(0.5) ? 'PERFORM ' . any_call() . ';' : 'NULL;';
	my $inner = chance(0.4)
	  ? "BEGIN PERFORM " . any_call()
	  . "; PERFORM 1 / 0; EXCEPTION WHEN division_by_zero THEN NULL; END;"
	  : '';
	return ("DO \$fz\$ BEGIN $body $inner $fail "
		  . "EXCEPTION WHEN others THEN $handler END \$fz\$;");
}

sub prepared_statement
{
	my $f = pick(grep { !$_->{retset} } @funcs);
	my @types = @{ $f->{types} };
	my $name = 'p' . ++$uniq;
	my @s;
	if (@types)
	{
		push @s,
		  "PREPARE $name("
		  . join(', ', @types)
		  . ") AS SELECT $f->{qname}("
		  . join(', ', map { "\$$_" } 1 .. @types) . ');';
		for (0 .. int rand 8)
		{
			push @s,
			  "EXECUTE $name("
			  . join(', ', map { plain_value($types[$_], $f->{names}[$_]) } 0 .. $#types)
			  . ');';
		}
	}
	else
	{
		push @s, "PREPARE $name AS SELECT $f->{qname}();";
		push @s, "EXECUTE $name;" for 0 .. int rand 8;
	}
	push @s, "DEALLOCATE $name;";
	return @s;
}

sub cursor
{
	my $c = 'c' . ++$uniq;
	my $hold = chance(0.3);
	my @s = ('BEGIN;',
		"DECLARE $c "
		  . pick('', 'SCROLL ', 'NO SCROLL ')
		  . 'CURSOR '
		  . ($hold ? 'WITH HOLD ' : '')
		  . 'FOR SELECT '
		  . any_call({ series => 1 })
		  . ' FROM generate_series(1, '
		  . pick(3, 20, 200) . ') g;',
		"FETCH " . pick(1, 2, 10) . " FROM $c;",
		select_calls(),
		"FETCH ALL FROM $c;");
	push @s, "FETCH BACKWARD 2 FROM $c;" if chance(0.3);
	push @s, pick('COMMIT;', 'ROLLBACK;');
	push @s, "CLOSE $c;" if $hold;
	return @s;
}

sub read_only
{
	return pick(
		[ 'BEGIN READ ONLY;', select_calls(), 'ROLLBACK;' ],
		[ 'BEGIN;', 'SET TRANSACTION READ ONLY;', select_calls(), 'COMMIT;' ],
		[
			'SET default_transaction_read_only = on;', select_calls(),
			'RESET default_transaction_read_only;'
		])->@*;
}

sub parallel
{
	my @safe = grep { $_->{parallel_safe} && !$_->{retset} } @funcs;
	my $f = @safe && chance(0.7) ? pick(@safe) : pick(grep { !$_->{retset} } @funcs);
	return (
		'BEGIN;',
		'SET LOCAL force_parallel_mode = ' . pick('on', 'regress') . ';',
		'SET LOCAL parallel_setup_cost = 0;',
		'SET LOCAL parallel_tuple_cost = 0;',
		'SET LOCAL min_parallel_table_scan_size = 0;',
		'SELECT count(x) FROM (SELECT ' . call_expr($f)
		  . '::text AS x FROM fuzz.vals) s;',
		pick('COMMIT;', 'ROLLBACK;'));
}

sub dml
{
	my $t = pick(@idem_tables);
	my $ts = $ts_columns{$t} ? $ts_columns{$t}[0] : undef;
	return wpick(
		[
			4,
			sub {
				'INSERT INTO fuzz.events (msg_id, ns) VALUES '
				  . join(', ',
					map { '(' . text_expr('key') . ', ' . lit(pick(@NSS[0 .. 3])) . ')' }
					  0 .. int rand 4)
				  . pick('', ' ON CONFLICT DO NOTHING', ' RETURNING id')
				  . ';';
			}
		],
		[
			$ts ? 3 : 0,
			sub {
				"UPDATE idem.$t SET $ts = $ts - interval '"
				  . pick('2 hours', '8 days', '1 year')
				  . "' WHERE ctid = ANY (ARRAY(SELECT ctid FROM idem.$t "
				  . "TABLESAMPLE BERNOULLI (10) LIMIT 20));";
			}
		],
		[
			2,
			sub {
				"DELETE FROM idem.$t WHERE ctid = ANY (ARRAY(SELECT ctid "
				  . "FROM idem.$t TABLESAMPLE BERNOULLI (5) LIMIT 5));";
			}
		],
		[
			1,
			sub {
				my $c = $columns{$t}[-1];
				"UPDATE idem.$t SET $c = $c "
				  . "WHERE ctid = ANY (ARRAY(SELECT ctid FROM idem.$t LIMIT 3));";
			}
		]);
}

# DDL on idem's tables: in a transaction rolled back when it would change
# the schema for good, committed when it only rewrites or reindexes.
sub ddl
{
	my $t = pick(@idem_tables);
	my $c0 = $columns{$t}[0];
	my $call = sub { select_calls() };
	return wpick(
		[
			3,
			sub {
				(pick("VACUUM idem.$t;", "VACUUM FULL idem.$t;",
						"ANALYZE idem.$t;", "REINDEX TABLE idem.$t;",
						"REINDEX TABLE CONCURRENTLY idem.$t;",
						"CLUSTER idem.$t USING ${t}_pkey;"),
					$call->());
			}
		],
		[
			3,
			sub {
				(
					'BEGIN;',
					pick(
						"CREATE INDEX ON idem.$t ((length($c0)));",
						"CREATE INDEX ON idem.$t ($c0) WHERE $c0 <> 'a';",
						"CREATE UNIQUE INDEX ON idem.$t ($c0);",
						"ALTER TABLE idem.$t ADD COLUMN fz int;",
						"ALTER TABLE idem.$t ADD COLUMN fz int DEFAULT 1 NOT NULL;",
						"ALTER TABLE idem.$t DROP CONSTRAINT ${t}_pkey;",
						"ALTER TABLE idem.$t SET UNLOGGED;",
						"TRUNCATE idem.$t;",
						"LOCK TABLE idem.$t IN ACCESS EXCLUSIVE MODE;",
						'DROP EXTENSION idem CASCADE;',
						'DROP EXTENSION idem CASCADE; CREATE EXTENSION idem;',
						"REINDEX TABLE idem.$t;"),
					$call->(), $call->(), 'ROLLBACK;');
			}
		],
		[
			2,
			sub {
				pick(
					"CREATE INDEX IF NOT EXISTS fz_extra ON idem.claims ((length(msg_id)));",
					"CREATE INDEX IF NOT EXISTS fz_extra ON idem.claims (claimed_at) WHERE ns <> 'b';",
					'DROP INDEX IF EXISTS idem.fz_extra;');
			}
		],
		[
			# a cancelled REINDEX CONCURRENTLY leaves copies of the indexes
			1,
			sub {
				q{SELECT format('DROP INDEX IF EXISTS %s;', c.oid::regclass) }
				  . q{FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace }
				  . q{WHERE n.nspname = 'idem' AND c.relkind = 'i' }
				  . q{AND c.relname ~ '_cc(new|old)[0-9]*$' \gexec};
			}
		]);
}

sub cancel_others
{
	return 'SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity '
	  . "WHERE application_name LIKE 'idem_fuzz%' "
	  . "AND pid <> pg_backend_pid() AND state = 'active';";
}

sub template
{
	my $t = pick(@templates);
	$t =~ s/\{(\w+):([^}]+)\}/value_expr($2, $1)/ge;
	return $t;
}

# ---- Requests: begin, checkpoint and finish of the same key ----

# Keys this session began (SQL of the key and of the namespace), which later
# statements checkpoint and finish; the oldest are forgotten.
my @begun;

sub request_ns
{
	return chance(0.9) ? lit(pick('default', 'a', 'b')) : value_expr('text', 'ns');
}

# A key: new to this session, one it began, one of the setup's (finished,
# released, resumable), or any.
sub request_key
{
	return wpick(
		[ 5, sub { lit("rq_${session_no}_" . ++$uniq) } ],
		[ @begun ? 3 : 0, sub { pick(@begun)->[0] } ],
		[ 2, sub { lit('r' . (1 + int rand 9)) } ],
		[ 1, sub { value_expr('text', 'key') } ]);
}

sub request_begin
{
	my ($k, $ns) = @_;
	my $fp = wpick(
		[ 6, sub { lit('fp' . int rand 3) } ],
		[
			2,
			sub { 'idem_request_fingerprint(' . lit(json_value(0)) . '::jsonb)' }
		],
		[ 1, sub { value_expr('text', 'fingerprint') } ]);
	return "idem_request_begin($k, $fp, $ns"
	  . (chance(0.5) ? ', ' . interval_expr('lease') : '') . ')';
}

sub request_checkpoint
{
	my ($k, $ns) = @_;
	my $data = chance(0.3) ? 'NULL::jsonb' : lit(json_value(0)) . '::jsonb';
	my $point = chance(0.85) ? lit('step' . int rand 4) : value_expr('text', 'recovery_point');
	return "idem_request_checkpoint($k, $point, $data, $ns)";
}

sub request_finish
{
	my ($k, $ns) = @_;
	my $body = chance(0.3) ? 'NULL::jsonb' : lit(json_value(0)) . '::jsonb';
	return "idem_request_finish($k, "
	  . int_expr('integer', 'response_code')
	  . ", $body, $ns"
	  . (chance(0.3) ? ', ' . pick('true', 'true', 'false', 'false', 'NULL::boolean') : '') . ')';
}

sub remember_begun
{
	my ($k, $ns) = @_;
	push @begun, [ $k, $ns ];
	shift @begun while @begun > 30;
	return;
}

# Statements that begin a request and go on with it: in one statement, in a
# transaction, in a PL/pgSQL block that looks at the status, or over several
# statements of the session (the key is remembered).
sub request_flow
{
	my $k = request_key();
	my $ns = request_ns();
	my $ok = q{b.status IN ('new', 'resume')};
	return wpick(
		[
			3,
			sub {
				'SELECT b.status, ' . request_checkpoint($k, $ns) . ', '
				  . request_finish($k, $ns) . ' FROM '
				  . request_begin($k, $ns) . ' b;';
			}
		],
		[
			3,
			sub {
				"SELECT b.status, CASE WHEN $ok THEN "
				  . request_finish($k, $ns)
				  . ' IS NULL END FROM '
				  . request_begin($k, $ns) . ' b;';
			}
		],
		[
			4,
			sub {
				my @s = ('\set ON_ERROR_ROLLBACK ' . (chance(0.7) ? 'on' : 'off'),
					'BEGIN;', 'SELECT status, attempts FROM ' . request_begin($k, $ns) . ';');
				push @s, 'SELECT ' . request_checkpoint($k, $ns) . ';' for 1 .. int rand 3;
				push @s, pick('SAVEPOINT r;', 'SELECT 1;');
				push @s, 'SELECT ' . request_finish($k, $ns) . ';' if chance(0.8);
				push @s, 'ROLLBACK TO SAVEPOINT r;' if chance(0.15);
				push @s, 'SELECT status FROM ' . request_begin($k, $ns) . ';' if chance(0.3);
				my $end = wpick([ 70, sub { 'COMMIT;' } ], [ 20, sub { 'ROLLBACK;' } ],
					[
						10,
						sub {
							my $gid = "fz_${session_no}_" . ++$uniq;
							push @prepared_gids, $gid;
							"PREPARE TRANSACTION '$gid';";
						}
					]);
				remember_begun($k, $ns) if $end eq 'ROLLBACK;' || chance(0.3);
				return (@s, $end, '\set ON_ERROR_ROLLBACK off');
			}
		],
		[
			3,
			sub {
				'DO $fz$ DECLARE b idem_request; BEGIN b := '
				  . request_begin($k, $ns) . '; '
				  . "IF $ok THEN PERFORM "
				  . request_checkpoint($k, $ns)
				  . '; PERFORM '
				  . request_finish($k, $ns)
				  . '; END IF; '
				  . (chance(0.3) ? 'RAISE SQLSTATE ' . lit('XA002') . '; ' : '')
				  . 'EXCEPTION WHEN SQLSTATE ' . lit('XA002') . ' THEN NULL; END $fz$;';
			}
		],
		[
			# begun now, checkpointed and finished by later statements
			3,
			sub {
				remember_begun($k, $ns);
				return 'SELECT status FROM ' . request_begin($k, $ns) . ';';
			}
		],
		[
			@begun ? 5 : 0,
			sub {
				my $b = pick(@begun);
				return 'SELECT '
				  . (chance(0.4) ? request_checkpoint(@$b) : request_finish(@$b)) . ';';
			}
		]);
}

# ---- Outbox: messages sent, leased, acknowledged and failed ----

sub relay_expr
{
	return chance(0.9)
	  ? lit(pick('r1', 'r2', "fz$session_no", 'setup'))
	  : value_expr('text', 'relay');
}

sub topic_expr
{
	return chance(0.9) ? lit(pick('t1', 't2', 't3', 't4')) : value_expr('text', 'topic');
}

sub lease_call
{
	my @a = (relay_expr());
	push @a, int_expr('integer', 'max_messages') if chance(0.9);
	push @a,
	  lit(pick('10 milliseconds', '100 milliseconds', '1 second', '30 seconds'))
	  . '::interval'
	  if @a == 2 && chance(0.9);
	push @a, int_expr('integer', 'per_key') if @a == 3 && chance(0.6);
	return 'idem_outbox_lease(' . join(', ', @a) . ')';
}

sub nack_call
{
	my ($id) = @_;
	my @a = ($id,
		chance(0.9) ? lit(pick('timeout', 'refused', "err $uniq")) : value_expr('text', 'error'));
	push @a, interval_expr('retry_after') if chance(0.8);
	push @a, pick('NULL::text', relay_expr()) if @a == 3 && chance(0.6);
	push @a, pick('false', 'false', 'true', 'l.attempt > 1') if @a == 4 && chance(0.6);
	return 'idem_outbox_nack(' . join(', ', @a) . ')';
}

sub send_call
{
	my ($key) = @_;
	$key //= lit('k' . int rand 5);
	return 'idem_outbox_send(' . topic_expr() . ", $key, "
	  . (chance(0.9) ? lit(json_value(0)) . '::jsonb' : value_expr('jsonb', 'payload'))
	  . (chance(0.3) ? ', ' . lit('{"h": "' . int(rand 9) . '"}') . '::jsonb' : '')
	  . ')';
}

# Leases whose messages the same statement or transaction acknowledges or
# fails (which retries them or makes them dead), sends that feed them, and
# acks and nacks of what other sessions leased.
sub outbox_flow
{
	my $agg = chance(0.8) ? q{coalesce(array_agg(l.id), '{}')} : 'array_agg(l.id)';
	return wpick(
		[ 5, sub { "SELECT idem_outbox_ack($agg) FROM " . lease_call() . ' l;' } ],
		[
			4,
			sub {
				'SELECT count(' . nack_call('l.id') . ') FROM ' . lease_call() . ' l;';
			}
		],
		[
			3,
			sub {
				'WITH l AS MATERIALIZED (SELECT l.*, row_number() OVER () AS n FROM '
				  . lease_call()
				  . ' l) SELECT idem_outbox_ack(ARRAY(SELECT id FROM l WHERE n % '
				  . pick(2, 3) . ' = 0)), (SELECT count('
				  . nack_call('l.id')
				  . ') FROM l WHERE n % 2 = 1);';
			}
		],
		[
			3,
			sub {
				my $n = pick(1, 3, 10, 50);
				my $m = pick(1, 3, 7);
				my $key = chance(0.7) ? "'k' || (g % $m)" : "'n${session_no}_' || (g % $m)";
				return 'SELECT count(' . send_call($key) . ") FROM generate_series(1, $n) g;";
			}
		],
		[
			4,
			sub {
				my @s = ('\set ON_ERROR_ROLLBACK ' . (chance(0.7) ? 'on' : 'off'),
					'BEGIN;');
				push @s, 'SELECT ' . send_call() . ';' for 0 .. int rand 3;
				push @s, "SELECT coalesce(array_agg(l.id), '{}')::text AS fz_ids FROM "
				  . lease_call() . ' l \gset';
				push @s,
				  wpick(
					[ 3, sub { q{SELECT idem_outbox_ack(:'fz_ids'::uuid[]);} } ],
					[
						3,
						sub {
							'SELECT count(' . nack_call('l.id')
							  . q{) FROM unnest(:'fz_ids'::uuid[]) WITH ORDINALITY l(id, attempt);};
						}
					],
					[
						1,
						sub {
							q{SELECT idem_outbox_ack((:'fz_ids'::uuid[])[1:1]), (SELECT count(}
							  . nack_call('l.id')
							  . q{) FROM unnest((:'fz_ids'::uuid[])[2:]) WITH ORDINALITY l(id, attempt));};
						}
					]);
				push @s, q{SELECT idem_outbox_ack(:'fz_ids'::uuid[]);} if chance(0.2);
				push @s, pick('COMMIT;', 'COMMIT;', 'ROLLBACK;'),
				  '\set ON_ERROR_ROLLBACK off';
				return @s;
			}
		],
		[
			# the ids leased by the statement before, acknowledged or failed
			# by the next one
			2,
			sub {
				(
					"SELECT coalesce(array_agg(l.id), '{}')::text AS fz_ids FROM "
					  . lease_call() . ' l \gset',
					chance(0.5)
					? q{SELECT idem_outbox_ack(:'fz_ids'::uuid[]);}
					: 'SELECT count(' . nack_call('l.id')
					  . q{) FROM unnest(:'fz_ids'::uuid[]) WITH ORDINALITY l(id, attempt);});
			}
		],
		[
			2,
			sub {
				'SELECT idem_outbox_ack(ARRAY(SELECT head_id FROM idem.outbox_keys '
				  . 'WHERE leased_by = ' . relay_expr() . '));';
			}
		],
		[
			2,
			sub {
				'SELECT count(' . nack_call('l.head_id') . ') FROM (SELECT head_id, attempts AS attempt '
				  . 'FROM idem.outbox_keys WHERE leased_by IS NOT NULL ORDER BY available_at DESC LIMIT '
				  . pick(1, 3) . ') l;';
			}
		],
		[
			1,
			sub {
				'SELECT idem_outbox_redrive('
				  . (chance(0.5) ? topic_expr() : '') . '), count(*) FROM '
				  . lease_call() . ' l;';
			}
		],
		[
			1,
			sub {
				'SELECT idem_outbox_configure(' . topic_expr() . ', '
				  . int_expr('integer', 'max_attempts') . ', '
				  . interval_expr('backoff_base') . ', '
				  . interval_expr('backoff_max') . ');';
			}
		]);
}

# ---- Guarded tables: transitions by keys of the right shape ----

sub transition_flow
{
	# mostly the guards that work, whose rows move
	my @working = grep { !$_->{broken} } @guarded;
	my $g = @working && chance(0.8) ? pick(@working) : pick(@guarded);
	my @vals = @{ pick(@{ $g->{keys} }) // [] };
	my $arr = 'ARRAY[' . join(', ', map { lit($_) } @vals) . ']::text[]';
	my $key = wpick(
		[ 6, sub { $arr } ],
		[ $g->{ncols} == 1 ? 3 : 0, sub { lit($vals[0] // '') } ],
		[
			2,
			sub {
				"(SELECT ARRAY[$g->{cols}] FROM $g->{tbl} ORDER BY $g->{cols} OFFSET "
				  . int(rand(@{ $g->{keys} } + 1))
				  . ' LIMIT 1)';
			}
		],
		[
			2,
			sub {
				my @w = @vals;
				wpick(
					[ 1, sub { push @w, $w[0] // 'x' } ],
					[ 1, sub { pop @w } ],
					[ 1, sub { @w = reverse @w } ],
					[ 1, sub { $w[-1] = ($w[-1] // '') . ' ' } ],
					[ 1, sub { $w[0] = '99' } ]);
				return 'ARRAY[' . join(', ', map { lit($_) } @w) . ']::text[]';
			}
		],
		[ 1, sub { value_expr('text[]', 'key') } ]);
	my $to =
	  chance(0.85) && @{ $g->{states} } ? lit(pick(@{ $g->{states} })) : value_expr('text', 'to_state');
	my @a = ("'$g->{tbl}'", $key, $to);
	push @a, pick('NULL::bigint', '0::bigint', '1::bigint', '2::bigint', '-1::bigint')
	  if chance(0.4);
	my $call = 'idem_transition(' . join(', ', @a) . ')';
	my @reguard = chance(0.3) ? @{ $g->{reguard} } : ();
	return (@reguard, wpick(
		[ 5, sub { "SELECT $call;" } ],
		[ 2, sub { "SELECT $call, $call;" } ],
		[
			2,
			sub {
				my $to2 = @{ $g->{states} } ? lit(pick(@{ $g->{states} })) : $to;
				(my $again = $call) =~ s/\Q$to\E\)$/$to2)/;
				('BEGIN;', "SELECT $call;", "SELECT $again;",
					pick('COMMIT;', 'ROLLBACK;'));
			}
		],
		[
			1,
			sub {
				"SELECT count(*) FROM generate_series(1, 3) g, LATERAL $call t;";
			}
		]));
}

my $settings_sql;

sub reconnect
{
	return ('\\c', $settings_sql);
}

# idem's own memory contexts, and executor state that lives as long as the
# backend (where memory taken per call would pile up); apart, the contexts
# of the cache entries of guarded tables, one per table at most
my $memcheck_sql =
  q{SELECT 'idem_mem', pg_backend_pid(), }
  . q{count(*) FILTER (WHERE name ILIKE '%idem%' AND name <> 'idem guarded table'), }
  . q{coalesce(sum(total_bytes) FILTER (WHERE name ILIKE '%idem%'), 0), }
  . q{coalesce(sum(total_bytes) FILTER (WHERE name = 'ExecutorState' AND parent = 'TopMemoryContext'), 0), }
  . q{count(*) FILTER (WHERE name = 'idem guarded table') }
  . q{FROM pg_backend_memory_contexts;};

sub shape
{
	return wpick(
		[ 30, sub { ('select', select_calls()) } ],
		[ 8, sub { ('series', series_calls()) } ],
		[ 20, sub { ('transaction', txn()) } ],
		[ 8, sub { ('do_block', do_block()) } ],
		[ 5, sub { ('prepared', prepared_statement()) } ],
		[ 4, sub { ('cursor', cursor()) } ],
		[ 3, sub { ('read_only', read_only()) } ],
		[ 4, sub { ('parallel', parallel()) } ],
		[ 3, sub { ('ddl', ddl()) } ],
		[ 6, sub { ('dml', dml()) } ],
		[ @templates ? 8 : 0, sub { ('template', template()) } ],
		[ $have{idem_request_finish} ? 8 : 0, sub { ('request', request_flow()) } ],
		[ $have{idem_outbox_nack} ? 10 : 0, sub { ('outbox', outbox_flow()) } ],
		[ @guarded ? 5 : 0, sub { ('transition', transition_flow()) } ],
		[ 1, sub { ('cancel', cancel_others()) } ],
		[ 1, sub { ('reconnect', reconnect()) } ],
		[ 2, sub { ('memcheck', $memcheck_sql) } ]);
}

########################################################################
# Sessions
########################################################################

sub run_session
{
	my ($no, $deadline, $file) = @_;
	$session_no = $no;
	srand($opt{seed} + 7919 * $no);
	$settings_sql =
	    "SET application_name = 'idem_fuzz_$no'; "
	  . "SET statement_timeout = '$opt{'statement-timeout'}ms'; "
	  . "SET lock_timeout = '1s'; SET deadlock_timeout = '100ms'; "
	  . "SET client_min_messages = warning;";

	my %r = (
		statements => 0,
		shapes => {},
		calls => {},
		sqlstates => {},
		internal => [],
		lost => [],
		hangs => [],
		mem => {},);
	my ($in, $out, $err) = ('', '', '');
	my $timer = IPC::Run::timeout($hang_after);
	my $h = IPC::Run::start([ 'psql', '-X', '-q', '-A', '-t', '-f', '-' ],
		'<', \$in, '>', \$out, '2>', \$err, $timer);
	my $sync = 0;
	my @recent;
	my $alive = 1;

	my $send = sub {
		my ($sql) = @_;
		$sync++;
		$err = '';
		$in .= encode('UTF-8', "$sql\n\\warn __sync_$sync\n");
		$timer->start($hang_after);
		my $ok = eval {
			$h->pump until $err =~ /__sync_$sync\n/;
			1;
		};
		if (!$ok)
		{
			my $why = $@;
			if ($why =~ /timeout/i)
			{
				push @{ $r{hangs} }, $sql;
			}
			else
			{
				push @{ $r{lost} },
				  { sql => $sql, recent => [@recent], err => decode('UTF-8', $err) };
			}
			$alive = 0;
			return;
		}
		my $e = decode('UTF-8', $err);
		push @recent, $sql;
		shift @recent while @recent > 10;
		while ($e =~ /(ERROR|FATAL|PANIC):  ([0-9A-Z]{5}): ([^\n]*)/g)
		{
			my ($level, $state, $msg) = ($1, $2, $3);
			$r{sqlstates}{$state}++;
			push @{ $r{internal} }, { state => $state, msg => $msg, sql => $sql }
			  if $state =~ /^XX/ || $level ne 'ERROR';
		}
		if ($e =~ /server closed the connection|connection to server was lost|no connection to the server/)
		{
			push @{ $r{lost} }, { sql => $sql, recent => [@recent], err => $e };
			$alive = 0;
		}
		$r{statements}++ unless $sql =~ /^\\/;
		while ($sql =~ /\b([a-z_.]*idem[a-z_]*)\(/g)
		{
			(my $fn = $1) =~ s/^(public|idem)\.//;
			$r{calls}{$fn}++;
		}
	};

	$send->("\\set VERBOSITY verbose");
	$send->("\\set fz_ids '{}'");
	$send->($settings_sql);
	while ($alive && time() < $deadline)
	{
		my ($shape, @stmts) = shape();
		$r{shapes}{$shape}++;
		for my $sql (@stmts, finish_prepared())
		{
			$send->($sql);
			last unless $alive;
		}
	}
	if ($alive)
	{
		# transactions left open by a statement that failed, then the
		# prepared transactions of this session
		$send->('ROLLBACK;');
		$send->(
			"SELECT count(*) FROM (SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'fz\\_${no}\\_%') s;"
		);
		$send->("ROLLBACK PREPARED '$_';") for @prepared_gids;
		$send->($memcheck_sql) if $alive;
		$send->('SELECT pg_stat_force_next_flush();') if $alive;
		$send->('SELECT 1;') if $alive;
		$in .= "\\q\n";
		eval { $h->finish; };
	}
	else
	{
		eval { $h->kill_kill; };
	}
	for my $line (split /\n/, $out)
	{
		if ($line =~ /^idem_mem\|(\d+)\|(\d+)\|(\d+)\|(\d+)\|(\d+)$/)
		{
			my $m = $r{mem}{$1} //=
			  { contexts => 0, bytes => 0, executor => 0, tables => 0 };
			$m->{contexts} = $2 if $2 > $m->{contexts};
			$m->{bytes} = $3 if $3 > $m->{bytes};
			$m->{executor} = $4 if $4 > $m->{executor};
			$m->{tables} = $5 if $5 > $m->{tables};
		}
	}
	store(\%r, $file);
	return;
}

########################################################################
# Main
########################################################################

my $dir = tempdir(CLEANUP => 1);
my $deadline = time() + $opt{seconds};
my @kids;
for my $no (1 .. $opt{sessions})
{
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		run_session($no, $deadline, "$dir/$no");
		POSIX::_exit(0);
	}
	push @kids, $pid;
}
waitpid($_, 0) for @kids;

my (%tot, %shapes, %calls, %states, @internal, @lost, @hangs, %mem);
my $missing = 0;
for my $no (1 .. $opt{sessions})
{
	unless (-f "$dir/$no")
	{
		$missing++;
		next;
	}
	my $r = retrieve("$dir/$no");
	$tot{statements} += $r->{statements};
	$shapes{$_} += $r->{shapes}{$_} for keys %{ $r->{shapes} };
	$calls{$_} += $r->{calls}{$_} for keys %{ $r->{calls} };
	$states{$_} += $r->{sqlstates}{$_} for keys %{ $r->{sqlstates} };
	push @internal, @{ $r->{internal} };
	push @lost, @{ $r->{lost} };
	push @hangs, @{ $r->{hangs} };
	$mem{$_} = $r->{mem}{$_} for keys %{ $r->{mem} };
}

my %class_name = (
	'08' => 'connection exception', '0A' => 'feature not supported',
	'22' => 'data exception', '23' => 'integrity constraint violation',
	'25' => 'invalid transaction state', '26' => 'invalid statement name',
	'2B' => 'dependent objects still exist', '34' => 'invalid cursor name',
	'3B' => 'savepoint exception', '40' => 'transaction rollback',
	'42' => 'syntax error or access rule violation',
	'53' => 'insufficient resources', '54' => 'program limit exceeded',
	'55' => 'object not in prerequisite state', '57' => 'operator intervention',
	'P0' => 'PL/pgSQL error', 'XX' => 'internal error');
my %classes;
$classes{ substr($_, 0, 2) } += $states{$_} for keys %states;
my $nerr = 0;
$nerr += $_ for values %states;

binmode STDOUT, ':encoding(UTF-8)';
print "idem_fuzz: seed $opt{seed}, $opt{sessions} sessions, $opt{seconds} s\n";
print "statements: ", $tot{statements} // 0, "; errors: $nerr\n";
print "shapes: ", join(', ', map { "$_ $shapes{$_}" } sort keys %shapes), "\n";
print "calls written: ", join(', ', map { "$_ $calls{$_}" } sort keys %calls),
  "\n";
print "errors by class:\n";
printf "  %s %-40s %d\n", $_, $class_name{$_} // '', $classes{$_}
  for sort keys %classes;
print "errors by SQLSTATE: ",
  join(', ', map { "$_ $states{$_}" } sort { $states{$b} <=> $states{$a} } keys %states),
  "\n";
my ($max_ctx, $max_bytes, $max_exec, $max_tables) = (0, 0, 0, 0);
for (values %mem)
{
	$max_ctx = $_->{contexts} if $_->{contexts} > $max_ctx;
	$max_bytes = $_->{bytes} if $_->{bytes} > $max_bytes;
	$max_exec = $_->{executor} if $_->{executor} > $max_exec;
	$max_tables = $_->{tables} if $_->{tables} > $max_tables;
}
print "idem memory contexts per backend: max $max_ctx ($max_bytes bytes), "
  . "and max $max_tables of guarded tables (of $ntables tables), "
  . scalar(keys %mem) . " backends measured\n";
print "executor state kept for the backend's life: max $max_exec bytes\n";

my $fail = 0;
print "internal errors: ", scalar(@internal), "\n";
for (@internal)
{
	print "  $_->{state}: $_->{msg}\n    statement: ",
	  substr($_->{sql}, 0, 2000), "\n";
}
$fail = 1 if @internal;
print "lost connections: ", scalar(@lost), "\n";
for (@lost)
{
	print "  while running: ", substr($_->{sql}, 0, 2000), "\n";
	print "  psql said: ", substr($_->{err}, 0, 1000), "\n";
	print "  statements before it:\n";
	print "    ", substr($_, 0, 500), "\n" for @{ $_->{recent} };
}
$fail = 1 if @lost;
print "hangs (no answer after ${hang_after} s): ", scalar(@hangs), "\n";
print "  ", substr($_, 0, 2000), "\n" for @hangs;
$fail = 1 if @hangs;
if ($max_ctx > $opt{'max-contexts'})
{
	print "too many idem memory contexts in one backend: $max_ctx > $opt{'max-contexts'}\n";
	$fail = 1;
}
if ($max_tables > $ntables)
{
	print "more contexts of guarded tables in one backend than tables: $max_tables > $ntables\n";
	$fail = 1;
}
if ($missing)
{
	print "sessions that left no report: $missing\n";
	$fail = 1;
}
print "verdict: ", ($fail ? 'FAIL' : 'PASS'), "\n";
exit($fail ? 1 : 0);
