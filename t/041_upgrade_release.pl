# Copyright (c) idem contributors
#
# An upgrade as a user makes it: a server runs release 0.1.0, built from its
# commit (scripts/test.sh builds it into a copy of PostgreSQL of its own,
# IDEM_PG_0_1_0), whose library writes the claims, tokens, transitions and
# guards.  Then the package of today replaces the library and the scripts,
# the server restarts, the old objects answer through the new library, and
# ALTER EXTENSION idem UPDATE ends with what a fresh install has; every row
# made by the old library answers as it did.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

plan skip_all => 'release 0.1.0 was not built (its commit is not in this clone)'
  unless $ENV{IDEM_PG_0_1_0};

my $old_install = $ENV{IDEM_PG_0_1_0};
my $new_bindir = `pg_config --bindir`;
chomp $new_bindir;
my $new_install = dirname($new_bindir);

my $node = PostgreSQL::Test::Cluster->new('release', install_path => $old_install);
$node->init(extra => [ '--locale=C.UTF-8', '--encoding=UTF8' ]);
$node->start;

$node->safe_psql('postgres', 'CREATE EXTENSION idem');
is($node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'idem'"),
	'0.1.0', 'the old install is at 0.1.0');
sub control
{
	my ($install) = @_;
	my $sharedir = `$install/bin/pg_config --sharedir`;
	chomp $sharedir;
	return slurp_file("$sharedir/extension/idem.control");
}
like(control($old_install), qr/^default_version = '0\.1\.0'/m, 'its control file is that of 0.1.0');

# rows of every kind, written by the library of 0.1.0
$node->safe_psql('postgres', q{
SELECT idem_claim('r-' || i, 'rel') FROM generate_series(1, 100) i;
SELECT idem_set_retention('rel', '3 days');
CREATE TABLE tokens_made (name text PRIMARY KEY, token text NOT NULL);
INSERT INTO tokens_made VALUES ('spent', idem_token_issue('rel', '1 day')),
                               ('kept', idem_token_issue('rel', '1 day')),
                               ('late', idem_token_issue('rel', '1 day'));
SELECT idem_token_consume(token, 'rel') FROM tokens_made WHERE name = 'spent';
SELECT idem_allow('order', 'new', 'paid'), idem_allow('order', 'paid', 'shipped');
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, version bigint NOT NULL DEFAULT 0);
INSERT INTO orders (id, status) VALUES (1, 'new'), (2, 'new'), (3, 'new');
SELECT idem_guard('orders', 'order', 'status', 'version');
SELECT idem_transition('orders', '1', 'paid');
});
my $state = q{SELECT string_agg(id || ' ' || status || ' ' || version, ',' ORDER BY id) FROM orders};
is($node->safe_psql('postgres', $state), '1 paid 1,2 new 0,3 new 0', 'the guard of 0.1.0 moved an order');
my $token_states = q{SELECT string_agg(name || ' ' || idem_token_status(token, 'rel')::text, ',' ORDER BY name)
                       FROM tokens_made};
my $tokens_before = $node->safe_psql('postgres', $token_states);
$node->stop;

# the package of today: its library and scripts, the same data directory
$node->{_install_path} = $new_install;
$node->start;
like(control($new_install), qr/^default_version = '(?!0\.1\.0')/m,
	'the new install has a newer default version');

# before the update: the objects of 0.1.0 through the new library
is($node->safe_psql('postgres', q{SELECT idem_claim('r-1', 'rel'), idem_claim('r-101', 'rel')}),
	'f|t', 'before the update, a claim of 0.1.0 is a duplicate and a new one is claimed');
is($node->safe_psql('postgres', $token_states), $tokens_before,
	'the tokens issued by 0.1.0 have the same status');
is($node->safe_psql('postgres', q{SELECT idem_token_consume(token, 'rel') FROM tokens_made WHERE name = 'late'}),
	't', 'a token of 0.1.0 is consumed');
is(sqlstate_of($node, 'postgres', q{UPDATE orders SET status = 'shipped' WHERE id = 2}), '23514',
	'the guard of 0.1.0 refuses a transition not allowed');

my ($rc, $out, $err) = $node->psql('postgres', 'ALTER EXTENSION idem UPDATE');
is($rc, 0, 'ALTER EXTENSION idem UPDATE succeeds') or diag $err;
isnt($node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'idem'"),
	'0.1.0', 'the extension left 0.1.0');

# after the update: every row made by the library of 0.1.0 answers as before
is($node->safe_psql('postgres', q{SELECT idem_claim('r-2', 'rel'), idem_claim('r-101', 'rel'), idem_claim('r-102', 'rel')}),
	'f|f|t', 'claims made by 0.1.0 and before the update are duplicates');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem.claims WHERE ns = 'rel'}), '102',
	'no claim lost');
is($node->safe_psql('postgres', q{SELECT retention FROM idem.namespaces WHERE ns = 'rel'}), '3 days',
	'the retention set under 0.1.0 is kept');
is($node->safe_psql('postgres', q{SELECT idem_token_consume(token, 'rel') FROM tokens_made WHERE name = 'kept'}),
	't', 'a token issued by 0.1.0 is consumed once after the update');
is($node->safe_psql('postgres', q{SELECT string_agg(idem_token_consume(token, 'rel')::text, ',' ORDER BY name)
                                   FROM tokens_made}),
	'false,false,false', 'and no token of 0.1.0 is consumed twice');
is($node->safe_psql('postgres', q{SELECT idem_transition('orders', '1', 'shipped')}), 'applied',
	'the guard made by 0.1.0 moves an order on');
is(sqlstate_of($node, 'postgres', q{UPDATE orders SET status = 'shipped' WHERE id = 3}), '23514',
	'and refuses a transition not allowed');
is($node->safe_psql('postgres', $state), '1 shipped 2,2 new 0,3 new 0', 'the versions go on from those of 0.1.0');

# the same objects as a fresh install of today's version
my $describe = slurp_file("$FindBin::RealBin/../test/upgrade/describe.sql");
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION idem');
is($node->safe_psql('postgres', $describe), $node->safe_psql('fresh', $describe),
	'the updated database has the objects of a fresh install');

$node->stop;
done_testing();
