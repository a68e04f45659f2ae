# Upgrades: a database that installed an older release of idem and runs
# ALTER EXTENSION idem UPDATE ends with the same objects as a fresh install
# of the newest version, keeps every row, and answers as before; every
# update script can run a second time without changing anything (Citus
# runs an extension's update script on every node).

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init(extra => [ '--locale=C.UTF-8', '--encoding=UTF8' ]);
$node->start;

my $describe = slurp_file("$FindBin::RealBin/../test/upgrade/describe.sql");
sub describe { return $node->safe_psql($_[0], $describe); }

my $sharedir = `pg_config --sharedir`;
chomp $sharedir;
my ($default) = slurp_file("$sharedir/extension/idem.control") =~ /^default_version = '([^']+)'/m;
my @updates = sort glob("$sharedir/extension/idem--*--*.sql");
ok(scalar(@updates) >= 1, 'at least one update script is installed');

# What a description has that it should not, and what it lacks.
sub difference
{
	my ($got, $want) = @_;
	my %in_got = map { $_ => 1 } split /\n/, $got;
	my %in_want = map { $_ => 1 } split /\n/, $want;
	return join("\n",
		(map { "missing: $_" } grep { !$in_got{$_} } sort keys %in_want),
		(map { "extra: $_" } grep { !$in_want{$_} } sort keys %in_got));
}

$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('postgres', 'CREATE DATABASE up');
$node->safe_psql('postgres', 'CREATE DATABASE broken');
$node->safe_psql('fresh', 'CREATE EXTENSION idem');
is($node->safe_psql('fresh', "SELECT extversion FROM pg_extension WHERE extname = 'idem'"),
	$default, "a fresh install is at the default version $default");

# The first release, with data of every kind.
$node->safe_psql('up', q{
CREATE EXTENSION idem VERSION '0.1.0';
SELECT idem_claim('u-' || i, 'up') FROM generate_series(1, 100) i;
SELECT idem_set_retention('up', '3 days');
CREATE TABLE kept_token (token text);
INSERT INTO kept_token SELECT idem_token_issue('up', '1 day');
SELECT idem_allow('order', 'new', 'paid'), idem_allow('order', 'paid', 'shipped');
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, version bigint NOT NULL DEFAULT 0);
INSERT INTO orders (id, status) VALUES (1, 'new'), (2, 'new');
SELECT idem_guard('orders', 'order', 'status', 'version');
-- the trigger as the library of 0.1.0 made it (this library makes today's)
DROP TRIGGER idem_guard ON orders;
CREATE TRIGGER idem_guard BEFORE UPDATE ON orders FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'version');
SELECT idem_transition('orders', '1', 'paid');
-- guards made by hand under 0.1.0: one disabled, with a comment, whose
-- version column then lost its NOT NULL (0.1.0 checked no DDL); one on a
-- partitioned table, disabled on one partition only
CREATE TABLE legacy (id int PRIMARY KEY, status text NOT NULL, v bigint NOT NULL DEFAULT 0);
CREATE TRIGGER legacy_guard BEFORE UPDATE ON legacy FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'v');
ALTER TABLE legacy DISABLE TRIGGER legacy_guard;
COMMENT ON TRIGGER legacy_guard ON legacy IS 'kept across the update';
ALTER TABLE legacy ALTER COLUMN v DROP NOT NULL;
CREATE TABLE plegacy (id int, status text NOT NULL, v bigint NOT NULL DEFAULT 0) PARTITION BY RANGE (id);
CREATE TABLE plegacy_1 PARTITION OF plegacy FOR VALUES FROM (0) TO (100);
CREATE TABLE plegacy_2 PARTITION OF plegacy FOR VALUES FROM (100) TO (200);
CREATE TRIGGER pguard BEFORE UPDATE ON plegacy FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'v');
ALTER TABLE plegacy_2 DISABLE TRIGGER pguard;
SELECT idem_set_retention('huge', '10000 years');
SELECT idem_claim('h-1', 'huge');
-- what an administrator granted under 0.1.0
CREATE ROLE upgrade_ops;
GRANT EXECUTE ON FUNCTION idem_release(text, text), idem_purge(text, int) TO upgrade_ops;
-- a state longer than 0.2.0 allows (0.1.0 took it)
SELECT idem_allow('long', repeat('x', 70), 'y');
-- guards made by hand with a WHEN condition, and for some columns only
CREATE TABLE whenguard (id int PRIMARY KEY, status text NOT NULL, v bigint NOT NULL DEFAULT 0);
CREATE TRIGGER whenguard_g BEFORE UPDATE ON whenguard FOR EACH ROW
    WHEN (old.status IS DISTINCT FROM new.status)
    EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'v');
CREATE TABLE colguard (id int PRIMARY KEY, status text NOT NULL, v bigint NOT NULL DEFAULT 0);
CREATE TRIGGER colguard_g BEFORE UPDATE OF status ON colguard FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'v');
CREATE TABLE aftguard (id int PRIMARY KEY, status text NOT NULL, v bigint NOT NULL DEFAULT 0);
CREATE TRIGGER aftguard_g AFTER UPDATE ON aftguard FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'v');
-- a comment on a partition's clone of a guard
COMMENT ON TRIGGER pguard ON plegacy_1 IS 'the partition''s own';
-- the index 0.2.0 adds, made beforehand by a CREATE INDEX CONCURRENTLY that
-- was interrupted (it stays invalid)
CREATE INDEX claims_ns_claimed_at_idx ON idem.claims (ns, claimed_at);
UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'idem.claims_ns_claimed_at_idx'::regclass;
-- a guard whose version column is in a unique index (0.1.0 checked no key)
CREATE TABLE ukeyed (id int PRIMARY KEY, status text NOT NULL, v bigint NOT NULL DEFAULT 0, UNIQUE (id, v));
CREATE TRIGGER ukeyed_g BEFORE UPDATE ON ukeyed FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'v');
-- a guard made by hand for INSERT, UPDATE and DELETE
CREATE TABLE iudguard (id int PRIMARY KEY, status text NOT NULL, v bigint NOT NULL DEFAULT 0);
CREATE TRIGGER iudguard_g BEFORE INSERT OR UPDATE OR DELETE ON iudguard FOR EACH ROW
    EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'v');
});
# a guard of 0.1.0 on a temporary table of a session that stays connected
# through the update: no other session can alter that table
my %temp = (out => '', err => '');
$temp{h} = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $node->connstr('up'),
	  '-c', q{CREATE TEMP TABLE tguard (id int PRIMARY KEY, status text NOT NULL, v bigint NOT NULL DEFAULT 0);
	          CREATE TRIGGER tguard_g BEFORE UPDATE ON tguard FOR EACH ROW
	              EXECUTE FUNCTION idem_guard_trigger('order', 'status', 'v')},
	  '-c', 'SELECT pg_sleep(600)' ],
	'>', \$temp{out}, '2>', \$temp{err});
$node->poll_query_until('up', q{SELECT count(*) = 1 FROM pg_trigger WHERE tgname = 'tguard_g'})
  or die 'the temporary table was not made';
# 0.1.0 made the token key from two UUIDs: 12 of its bits are fixed
my $uuid_shaped = q{
SELECT octet_length(key) = 32 AND get_byte(key, 6) >> 4 = 4 AND get_byte(key, 8) >> 6 = 2
       AND get_byte(key, 22) >> 4 = 4 AND get_byte(key, 24) >> 6 = 2 FROM idem.token_key};
is($node->safe_psql('up', $uuid_shaped), 't', 'the key of 0.1.0 has the bits of two UUIDs');
my $key_before = $node->safe_psql('up', q{SELECT encode(key, 'hex') FROM idem.token_key});
my $rows_before = $node->safe_psql('up', q{
SELECT (SELECT count(*) FROM idem.claims), (SELECT count(*) FROM idem.tokens),
       (SELECT count(*) FROM idem.transitions), (SELECT string_agg(n.ns || ' ' || n.retention, ',') FROM idem.namespaces n),
       (SELECT string_agg(id || ' ' || status || ' ' || version, ',' ORDER BY id) FROM orders)});

# with standard_conforming_strings off, which a role or a database may set:
# the update script's literals must not depend on it
my ($up_rc, $up_out, $up_err) = $node->psql('up',
	'SET standard_conforming_strings = off; ALTER EXTENSION idem UPDATE');
is($up_rc, 0, 'ALTER EXTENSION idem UPDATE succeeds, with standard_conforming_strings off') or diag $up_err;
unlike($up_err, qr/nonstandard use of/, 'no literal of the update script depends on it');
like($up_err, qr/WARNING:  guard "whenguard_g" of table whenguard is left as it is/,
	'it warns of a guard with a WHEN condition, which it leaves');
like($up_err, qr/WARNING:  guard "colguard_g" of table colguard is left as it is/,
	'and of one of some columns');
like($up_err, qr/WARNING:  guard "aftguard_g" of table aftguard is left as it is/,
	'and of one that is not BEFORE UPDATE');
like($up_err, qr/WARNING:  guard "legacy_guard" of table legacy fails where it fires: version column "v" must be NOT NULL/,
	'and of one whose version column lost its NOT NULL');
like($up_err, qr/WARNING:  guard "ukeyed_g" of table ukeyed fails where it fires: version column "v" of table "ukeyed" must not be part of a key/,
	'and of one whose version column is in a key');
like($up_err, qr/WARNING:  guard "iudguard_g" of table iudguard fails where it fires: trigger "iudguard_g" of table "iudguard" must be BEFORE INSERT OR UPDATE FOR EACH ROW/,
	'and of one made by hand for INSERT, UPDATE and DELETE');
like($up_err, qr/WARNING:  guard "tguard_g" of table pg_temp_\d+\.tguard is left as it is/,
	"and of one on another session's temporary table, which it leaves");
$node->safe_psql('up', q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                          WHERE query = 'SELECT pg_sleep(600)' AND datname = 'up'});
$temp{h}->finish;
is($node->safe_psql('up', "SELECT extversion FROM pg_extension WHERE extname = 'idem'"),
	$default, "ALTER EXTENSION idem UPDATE reaches $default");

# (b) what 0.1.0 had, kept
like($node->safe_psql('up', q{SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname = 'whenguard_g'}),
	qr/BEFORE UPDATE ON public\.whenguard FOR EACH ROW WHEN/, 'a guard with a WHEN condition is left as it was');
like($node->safe_psql('up', q{SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname = 'colguard_g'}),
	qr/BEFORE UPDATE OF status ON public\.colguard/, 'and so is a guard of some columns');
is($node->safe_psql('up', q{SELECT obj_description(oid, 'pg_trigger') FROM pg_trigger
                             WHERE tgname = 'pguard' AND tgrelid = 'plegacy_1'::regclass}),
	"the partition's own", "a partition's comment on its guard is kept");
is($node->safe_psql('up', q{SELECT indisvalid AND indisready FROM pg_index
                             WHERE indexrelid = 'idem.claims_ns_claimed_at_idx'::regclass}),
	't', 'an index left invalid by an interrupted build is built again');
my ($dump, $dump_err);
IPC::Run::run([ 'pg_dump', '-s', '-d', $node->connstr('up') ], '>', \$dump, '2>', \$dump_err)
  or diag $dump_err;
like($dump, qr/GRANT ALL ON FUNCTION public\.idem_release\([^)]*\) TO upgrade_ops;/,
	'a dump keeps a grant made under 0.1.0 on a function the update revoked from PUBLIC');
like($dump, qr/GRANT ALL ON FUNCTION public\.idem_purge\([^)]*\) TO upgrade_ops;/,
	'and one on a function it left alone');
# a dump of the updated database restores, the long state with it (guards
# made by hand that cannot work are refused by a restore, as when they are
# made: they are left out)
$node->safe_psql('up', 'ALTER TABLE legacy ALTER COLUMN v SET NOT NULL');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$PostgreSQL::Test::Utils::tmp_check/up.dump",
		'-T', 'whenguard', '-T', 'colguard', '-T', 'aftguard', '-T', 'ukeyed', '-T', 'iudguard', '-d', $node->connstr('up') ],
	'the updated database is dumped');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'),
		"$PostgreSQL::Test::Utils::tmp_check/up.dump" ], 'and restores');
is($node->safe_psql('restored', q{SELECT count(*) FROM idem.transitions}),
	$node->safe_psql('up', q{SELECT count(*) FROM idem.transitions}), 'every transition, the long state too');

# what the administrator granted is the administrator's: the comparison
# with a fresh install is made without it
$node->safe_psql('up', q{
REVOKE EXECUTE ON FUNCTION idem_release(text, text), idem_purge(text, int) FROM upgrade_ops});

# (a) the same objects as a fresh install
my $fresh = describe('fresh');
my $diff = difference(describe('up'), $fresh);
is($diff, '', 'the upgraded database has the objects of a fresh install');

# the key is replaced by 256 random bits
my $key_after = $node->safe_psql('up', q{SELECT encode(key, 'hex') FROM idem.token_key});
isnt($key_after, $key_before, 'the update replaces the key made from UUIDs');
like($key_after, qr/^[0-9a-f]{64}$/, 'the new key has 32 bytes');
my $after_shaped = $node->safe_psql('up', $uuid_shaped);

# guards made by hand are remade as idem_guard makes them now, keeping their
# comment and whether they are enabled, on the table and on each partition,
# even one the check of guard DDL would refuse today
is($node->safe_psql('up', q{
SELECT string_agg(format('%s %s %s %s %s', tgrelid::regclass, tgname, tgenabled, (tgtype & 4) <> 0,
                         coalesce(obj_description(oid, 'pg_trigger'), '-')), ',' ORDER BY tgrelid::regclass::text)
  FROM pg_trigger WHERE tgname IN ('legacy_guard', 'pguard')}),
	"legacy legacy_guard D t kept across the update,plegacy pguard O t -,plegacy_1 pguard O t the partition's own,plegacy_2 pguard D t -",
	'guards made by hand keep their state and comment');

# a retention stored before the update that no timestamp can subtract does
# not stop purge, of its namespace or of any other
is($node->safe_psql('up', q{SELECT idem_purge('huge'), idem_purge() >= 0, idem_claim('h-1', 'huge')}),
	'0|t|f', 'purge works beside a retention of 10000 years stored by 0.1.0');

# (b) every row is kept, and every function answers as before
is($node->safe_psql('up', q{
SELECT (SELECT count(*) FROM idem.claims), (SELECT count(*) FROM idem.tokens),
       (SELECT count(*) FROM idem.transitions), (SELECT string_agg(n.ns || ' ' || n.retention, ',') FROM idem.namespaces n),
       (SELECT string_agg(id || ' ' || status || ' ' || version, ',' ORDER BY id) FROM orders)}),
	$rows_before, 'every row is kept');
is($node->safe_psql('up', q{
SELECT idem_claim('u-1', 'up'), idem_try_claim('u-2', 'up'), idem_claim_batch(ARRAY['u-3', 'u-101'], 'up'),
       idem_claim_info('u-1', 'up') IS NOT NULL, idem.retention_of('up')}),
	'f|duplicate|{f,t}|t|3 days', 'claims made before the upgrade are still duplicates');
is($node->safe_psql('up', q{
SELECT idem_token_status(token, 'up'), idem_token_consume(token, 'up'),
       idem_token_consume(token, 'up'), idem_token_status(token, 'up') FROM kept_token}),
	'valid|t|f|consumed', 'a token issued before the upgrade is consumed exactly once');
is($node->safe_psql('up', q{
SELECT idem_transition('orders', '1', 'paid'), idem_transition('orders', '1', 'shipped'),
       idem_transition('orders', '2', 'shipped')}),
	'already|applied|illegal', 'the guard set up before the upgrade still decides');
my ($rc, $out, $err) = $node->psql('up', q{UPDATE orders SET status = 'new' WHERE id = 1});
like($err, qr/illegal state transition from "shipped" to "new"/, 'the guard trigger still refuses an illegal UPDATE');

# the guard made by 0.1.0 (BEFORE UPDATE) is now the one idem_guard makes,
# which also checks an INSERT once the machine has initial states
my $guard_def = q{SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'orders'::regclass};
$node->safe_psql('fresh', q{
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, version bigint NOT NULL DEFAULT 0);
SELECT idem_allow('order', 'new', 'paid');
SELECT idem_guard('orders', 'order', 'status', 'version');
});
is($node->safe_psql('up', $guard_def), $node->safe_psql('fresh', $guard_def),
	'the guard made before the upgrade is the trigger idem_guard makes now');
$node->safe_psql('fresh', q{
SELECT idem_unguard('orders');
DROP TABLE orders;
SELECT idem_disallow('order', 'new', 'paid');
});
$node->safe_psql('up', q{SELECT idem_allow_initial('order', 'new')});
($rc, $out, $err) = $node->psql('up', q{INSERT INTO orders (id, status) VALUES (3, 'shipped')});
like($err, qr/ERROR:  .*"shipped"/, 'that guard refuses an INSERT in a state that is not initial');
is($node->safe_psql('up', q{
INSERT INTO orders (id, status) VALUES (4, 'new');
DELETE FROM orders WHERE id = 4;
SELECT idem_disallow_initial('order', 'new')}), 't', 'and accepts one in an initial state');

# (c) every update script's statements, run a second time, change nothing:
# not idem's objects, nor any other (a second run outside the extension
# would make an object it creates again under a new name no member)
my $every_object = q{
SELECT string_agg(l, E'\n' ORDER BY l COLLATE "C") FROM (
    SELECT 'relation ' || n.nspname || '.' || c.relname || ' ' || c.relkind::text
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
    UNION ALL
    SELECT 'function ' || p.oid::regprocedure::text
      FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
    UNION ALL
    SELECT 'type ' || t.oid::regtype::text
      FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
     WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
    UNION ALL
    SELECT 'constraint ' || c.conrelid::regclass::text || ' ' || c.conname
      FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
     WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
    UNION ALL
    SELECT 'trigger ' || tgrelid::regclass::text || ' ' || tgname FROM pg_trigger WHERE NOT tgisinternal
    UNION ALL
    SELECT 'event trigger ' || evtname FROM pg_event_trigger
    UNION ALL
    SELECT 'policy ' || polrelid::regclass::text || ' ' || polname FROM pg_policy
    UNION ALL
    SELECT 'schema ' || nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\_%'
) o(l)};
my $objects_before = $node->safe_psql('up', $every_object);
for my $script (@updates)
{
	my $sql = slurp_file($script);
	$sql =~ s/^\\echo .*$//mg;
	$sql =~ s/\@extschema\@/public/g;
	$sql =~ s/MODULE_PATHNAME/\$libdir\/idem/g;
	my $name = $script =~ s{.*/}{}r;
	($rc, $out, $err) = $node->psql('up', "SET search_path = public;\n$sql",
		extra_params => [ '-v', 'ON_ERROR_STOP=1' ]);
	is($rc, 0, "$name runs a second time without an error") or diag $err;
}
is(difference(describe('up'), $fresh), '', 'running the update scripts again changed nothing');
is(difference($node->safe_psql('up', $every_object), $objects_before), '',
	'and made no object that is not a member');
# A second run keeps the key, unless chance gave the new one the bits of
# two UUIDs (one time in 4096): then it replaces it once more.
ok($node->safe_psql('up', q{SELECT encode(key, 'hex') FROM idem.token_key}) eq $key_after
	  || $after_shaped eq 't', 'a second run keeps the random key');

# The comparison sees an upgrade that leaves something out: here, one that
# forgot to revoke idem_release from PUBLIC.
$node->safe_psql('broken', q{
CREATE EXTENSION idem VERSION '0.1.0';
ALTER EXTENSION idem UPDATE;
GRANT EXECUTE ON FUNCTION idem_release(text, text) TO PUBLIC;
});
like(difference(describe('broken'), $fresh), qr/function idem_release/,
	'the comparison finds a privilege the upgrade missed');
$node->safe_psql('broken', q{
ALTER EXTENSION idem DROP FUNCTION idem_token_purge(integer);
DROP FUNCTION idem_token_purge(integer);
});
like(difference(describe('broken'), $fresh), qr/^missing: member function idem_token_purge/m,
	'the comparison finds an object missing from the upgrade');

# A type of the user's own with the name of one of idem's is not adopted
$node->safe_psql('postgres', 'CREATE DATABASE clash');
$node->safe_psql('clash', q{CREATE TYPE idem_request AS (a int)});
($rc, $out, $err) = $node->psql('clash', 'CREATE EXTENSION idem');
like($err, qr/type "idem_request" already exists/, "CREATE EXTENSION refuses to take a user's type for its own");

$node->stop;
done_testing();
