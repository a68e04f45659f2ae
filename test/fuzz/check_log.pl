#!/usr/bin/perl
# Copyright (c) idem contributors
#
# Reads the log of a server that was fuzzed and says whether it crashed.
#
#   perl test/fuzz/check_log.pl SERVER_LOG
#
# The server must log with log_line_prefix = '%m [%p] %a %e: ',
# log_min_error_statement = error and log_error_verbosity = verbose (for the
# function that raised each error).  Prints the crashes (a backend terminated
# by a signal or any other abnormal exit, PANIC, failed assertions) with the
# statement that was running, the errors per client (application_name) by
# SQLSTATE class and SQLSTATE, the internal errors (class XX) with their
# statements, and how many errors came from statements that call one of
# idem's functions.  An internal error raised inside PostgreSQL by a
# function that a random statement reaches without idem (listed in
# %core_known) does not count against idem, even when the same statement
# also calls idem.  The last line is "log verdict: PASS" or "log verdict:
# FAIL"; the exit status is 1 on a crash or on an internal error raised by a
# statement that calls idem, 0 otherwise.

use strict;
use warnings;

my $file = shift @ARGV or die "usage: $0 SERVER_LOG\n";
open my $fh, '<:raw', $file or die "cannot read $file: $!\n";

my $head = qr/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ \[(\d+)\] (\S*) ?([0-9A-Z]{5}): ([A-Z0-9]+):  (.*)$/;

my @entries;
while (my $line = <$fh>)
{
	chomp $line;
	if ($line =~ $head)
	{
		my %e = (pid => $1, app => $2, state => $3, level => $4, text => $5);

		# log_error_verbosity = verbose repeats the SQLSTATE in the text
		$e{text} =~ s/^[0-9A-Z]{5}: //;
		push @entries, \%e;
	}
	elsif (@entries)
	{
		$entries[-1]{text} .= "\n$line";
	}
}
close $fh;

my $calls_idem = qr/\bidem_[a-z_]+\s*\(|\bidem\.[a-z_]+\s*\(/;

# Internal errors of PostgreSQL itself that sqlsmith reaches with arguments
# or expressions of its own (all but the file functions seen in statements
# that do not call idem):
#   intervaltypmodout, intervaltypmodleastfield: format_type('interval'::regtype, 57)
#     raises "invalid INTERVAL typmod";
#   SetNextObjectId: pg_stop_making_pinned_objects() after initdb raises
#     "cannot advance OID counter anymore";
#   coerce_type: cast(coalesce(cast(null as unknown), ...) as unknown) raises
#     "failed to find conversion function from unknown to text" in the parser;
#   acldefault_sql: acldefault('i', ...) raises "unrecognized objtype abbreviation";
#   getObjectClass: pg_describe_object() and its kin with random numbers raise
#     "invalid non-zero objectSubId";
#   lo_import_internal, be_lo_export, read_binary_file, pg_stat_file, pg_ls_dir,
#   pg_ls_dir_files: a random text as a file name, too long for the kernel
#     (ENAMETOOLONG, which PostgreSQL reports as XX000), such as
#     lo_import(idem_metrics()) or lo_import(repeat('x', 5000)).
my %core_known = map { $_ => 1 } qw(intervaltypmodout intervaltypmodleastfield
  SetNextObjectId coerce_type acldefault_sql getObjectClass
  lo_import_internal be_lo_export read_binary_file pg_stat_file pg_ls_dir
  pg_ls_dir_files);
my (@crashes, %errors, %by_state, @internal, %idem_errors);
my %last_error;
for my $i (0 .. $#entries)
{
	my $e = $entries[$i];
	my $app = $e->{app} eq '' ? '(no application_name)' : $e->{app};
	$app =~ s/_\d+$//;
	if ($e->{level} eq 'PANIC'
		|| $e->{text} =~ /terminated by signal|exited with exit code [2-9]/)
	{
		# the statement that was running comes as the DETAIL
		my $n = $entries[ $i + 1 ];
		$e->{text} .= "\n    $n->{text}"
		  if $n && $n->{pid} eq $e->{pid} && $n->{level} eq 'DETAIL';
		push @crashes, $e;
	}
	if ($e->{level} eq 'ERROR' || $e->{level} eq 'FATAL')
	{
		$errors{$app}{ substr($e->{state}, 0, 2) }++;
		$by_state{$app}{ $e->{state} }++;
		$e->{app_group} = $app;
		$last_error{ $e->{pid} } = $e;
	}
	elsif ($e->{level} eq 'LOCATION' && $last_error{ $e->{pid} })
	{
		$last_error{ $e->{pid} }{location} = $e->{text};
	}
	elsif ($e->{level} eq 'STATEMENT' && $last_error{ $e->{pid} })
	{
		my $err = delete $last_error{ $e->{pid} };
		$err->{statement} = $e->{text};
		$idem_errors{ $err->{app_group} }{ $err->{state} }++
		  if $e->{text} =~ $calls_idem;
	}
}
for my $e (@entries)
{
	push @internal, $e
	  if ($e->{level} eq 'ERROR' || $e->{level} eq 'FATAL')
	  && $e->{state} =~ /^XX/;
}

# TRAP lines of failed assertions come without the prefix
open $fh, '<', $file or die;
while (<$fh>)
{
	chomp;
	push @crashes, { level => 'assertion', text => $_ } if /^TRAP: /;
}
close $fh;

sub counts
{
	my ($h) = @_;
	return join ', ',
	  map { "$_ $h->{$_}" } sort { $h->{$b} <=> $h->{$a} || $a cmp $b } keys %$h;
}

binmode STDOUT, ':raw';
print "server log: $file\n";
print "crashes: ", scalar(@crashes), "\n";
for my $c (@crashes)
{
	print "  $c->{level}: $c->{text}\n";
}
print "errors by client and SQLSTATE class:\n";
for my $app (sort keys %errors)
{
	print "  $app: ", counts($errors{$app}), "\n";
	print "    by SQLSTATE: ", counts($by_state{$app}), "\n";
}
print "errors of statements that call idem's functions:\n";
print "  $_: ", counts($idem_errors{$_}), "\n" for sort keys %idem_errors;
print "  (none)\n" unless %idem_errors;

my @bad_internal;
print "internal errors (class XX): ", scalar(@internal), "\n";
for my $e (@internal)
{
	my $stmt = $e->{statement} // '';
	my $idem = $stmt =~ $calls_idem;
	my $where = $e->{location} // '';
	my ($func) = $where =~ /^(\w+),/;
	my $core = defined $func && $core_known{$func};
	(my $msg = $e->{text}) =~ s/\n.*//s;
	push @bad_internal, "$e->{state}: $msg" . ($where ne '' ? "  (at $where)" : '')
	  if $idem && !$core;
	print "  [$e->{app}] $e->{state}: $msg",
	  ($where ne '' ? "  (at $where)" : ''),
	  ($idem ? '  (statement calls idem)' : ''),
	  ($idem && $core ? ', raised by PostgreSQL for arguments of its own' : ''),
	  "\n";
	print "    statement: ", substr($stmt, 0, 1500), "\n" if $stmt ne '';
}
# again last, where a report cut to its end still shows them
print "internal errors of statements that call idem: ", scalar(@bad_internal), "\n";
print "  $_\n" for @bad_internal;
my $fail = @crashes || @bad_internal;
print "log verdict: ", ($fail ? 'FAIL' : 'PASS'), "\n";
exit($fail ? 1 : 0);
