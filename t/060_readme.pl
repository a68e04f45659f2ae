
# Copyright (c) idem contributors
#
# Every SQL example of README.md runs as written and answers what its
# comments say, so that the examples cannot drift from the behaviour.
#
# The ```sql blocks run in their order in one database of a fresh server
# (with the roles "ops" and "app" that the grants name), each block in one
# psql session.  A statement ends at a line ending in ";" or "\gset" (after
# its comment is taken off).  The comment of that line says what it answers
# when it starts with one of:
#   ERROR xxxxx      the statement fails with SQLSTATE xxxxx
#   true / false     psql prints t / f
#   word, 'word'     psql prints word; followed by ":", " (" or nothing
# Any other statement must succeed.
#
# The README's statements about encodings are checked at the end.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $readme = slurp_file("$FindBin::RealBin/../README.md");
my @blocks = $readme =~ /^```sql\n(.*?)^```\s*$/msg;
cmp_ok(scalar(@blocks), '>=', 5, 'README.md has SQL examples');

# The statements of a block, each with the comment of its last line.
sub statements
{
	my ($block) = @_;
	my (@stmts, $text);
	$text = '';
	foreach my $line (split /\n/, $block)
	{
		next if $text eq '' && $line =~ /^\s*(--.*)?$/;
		$text .= "$line\n";
		my ($code, $comment) = $line =~ /^(.*?)(?:\s*--\s*(.*))?$/;
		if ($code =~ /(;|\\gset)\s*$/)
		{
			push @stmts, { sql => $text, comment => $comment // '' };
			$text = '';
		}
	}
	push @stmts, { sql => $text, comment => '' } if $text =~ /\S/;
	return @stmts;
}

# What a comment says the statement answers: [sqlstate, output or undef].
sub expectation
{
	my ($comment) = @_;
	return [ $1, undef ] if $comment =~ /^ERROR ([0-9A-Z]{5})\b/;
	if ($comment =~ /^'?([\w-]+)'?(?::|\s\(|$)/)
	{
		my $v = $1;
		$v = 't' if $v eq 'true';
		$v = 'f' if $v eq 'false';
		return [ '00000', $v ];
	}
	return [ '00000', undef ];
}

my $node = idem_node('readme', "shared_preload_libraries = 'idem'");
$node->safe_psql('postgres', q{
CREATE ROLE ops;
CREATE ROLE app;
CREATE DATABASE readme;});

my ($statements, $answers) = (0, 0);
for my $b (0 .. $#blocks)
{
	my @stmts = statements($blocks[$b]);
	my $script = '';
	for my $s (0 .. $#stmts)
	{
		$script .= "\\echo \@\@begin $s\n$stmts[$s]{sql}\\echo \@\@end $s :SQLSTATE\n";
	}
	my ($rc, $out, $err) = $node->psql('readme', $script, on_error_stop => 0, extra_params => [ '-q' ]);
	my %got;
	while ($out =~ /^\@\@begin (\d+)\n(.*?)^\@\@end \1 (\S+)$/msg)
	{
		my ($s, $printed, $sqlstate) = ($1, $2, $3);
		$printed =~ s/\n$//;
		$got{$s} = [ $sqlstate, $printed ];
	}
	my $first = (split /\n/, $stmts[0]{sql})[0];
	for my $s (0 .. $#stmts)
	{
		my ($sqlstate, $output) = @{ expectation($stmts[$s]{comment}) };
		my $what = "block " . ($b + 1) . " ($first), statement " . ($s + 1);
		my $g = $got{$s} // [ 'not run', '' ];
		(my $one_line = $stmts[$s]{sql}) =~ s/\s+/ /g;
		is($g->[0], $sqlstate, "$what: SQLSTATE $sqlstate") or diag "$one_line\n$err";
		$statements++;
		next unless defined $output;
		is($g->[1], $output, "$what: answers $output") or diag $one_line;
		$answers++;
	}
}
cmp_ok($statements, '>=', 30, "the examples have $statements statements");
cmp_ok($answers, '>=', 9, "$answers of them say what they answer");

# Encodings, as the README states them: in UTF8 the server refuses invalid
# UTF-8 before idem sees it; in SQL_ASCII every byte string is a key of its
# own, so the same text in two client encodings makes two keys.
$node->safe_psql('postgres', q{
CREATE DATABASE ascii ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0;});
$node->safe_psql('ascii', 'CREATE EXTENSION idem');
is(sqlstate_of($node, 'readme', q{SELECT idem_claim(E'caf\xe9', 'enc')}),
	'22021', 'UTF8: a key that is not valid UTF-8 is refused with 22021');
is($node->safe_psql('ascii', q{
SELECT idem_claim(E'caf\xc3\xa9', 'enc'), idem_claim(E'caf\xe9', 'enc'), idem_claim(E'\xff', 'enc'),
       idem_claim(E'caf\xc3\xa9', 'enc')}),
	't|t|t|f', 'SQL_ASCII: any bytes are a key; "café" in UTF-8 and in LATIN1 are two keys');

$node->stop;
done_testing();
