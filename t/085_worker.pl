# Copyright (c) idem contributors
#
# The maintenance worker: it purges expired claims, tokens and requests in
# batches and leaves fresh ones; it is restarted after it crashes; a round
# that fails is logged and the next one goes on; idem_maintenance() runs one
# round by hand; a database whose settings make transactions read-only or
# SERIALIZABLE is purged all the same, and one that does not exist or does
# not accept connections is logged once and skipped; the database's owner
# may drop, rename or copy it while a round is in progress.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use IdemTest;

my $node = idem_node('worker',
	"shared_preload_libraries = 'idem'",
	"idem.database = 'postgres'",
	"idem.maintenance_interval = '1s'",
	'idem.maintenance_batch = 100',
	'restart_after_crash = on');

sub poll
{
	my ($sql, $want) = @_;
	for (my $i = 0; $i < 10 * $PostgreSQL::Test::Utils::timeout_default; $i++)
	{
		# the server may be restarting after a crash: failures are retried
		my ($ret, $out) = $node->psql('postgres', $sql);
		return 1 if $ret == 0 && $out eq $want;
		usleep(100_000);
	}
	return 0;
}

sub poll_node
{
	my ($n, $db, $sql, $want) = @_;
	for (my $i = 0; $i < 10 * $PostgreSQL::Test::Utils::timeout_default; $i++)
	{
		my ($ret, $out) = $n->psql($db, $sql);
		return 1 if $ret == 0 && $out eq $want;
		usleep(100_000);
	}
	return 0;
}

sub worker_pid
{
	return $node->safe_psql('postgres',
		q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idem maintenance worker'});
}

ok(poll(q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem maintenance worker'}, '1'),
	'the worker runs');

# expired and fresh rows of every kind; a namespace whose retention is long
# keeps even its old claims
sub fill
{
	$node->safe_psql('postgres', q{
SELECT idem_set_retention('short', '1 hour');
SELECT idem_set_retention('long', '100 days');
INSERT INTO idem.claims SELECT 'short', 'old-' || i, now() - interval '2 days' FROM generate_series(1, 1000) i ON CONFLICT DO NOTHING;
INSERT INTO idem.claims SELECT 'short', 'new-' || i, now() FROM generate_series(1, 50) i ON CONFLICT DO NOTHING;
INSERT INTO idem.claims SELECT 'long', 'old-' || i, now() - interval '2 days' FROM generate_series(1, 50) i ON CONFLICT DO NOTHING;
SELECT count(idem_token_issue('s', '1 millisecond')) FROM generate_series(1, 300);
SELECT count(idem_token_issue('s', '1 hour')) FROM generate_series(1, 20) WHERE NOT EXISTS (SELECT 1 FROM idem.tokens WHERE expires_at > now() + interval '1 minute');});
}

# every statement that deletes claims logs its transaction, how many it
# deleted, when the transaction began and when the statement ended; it
# sleeps 50 ms first, so that each batch takes long enough for its pause
# to be measured
$node->safe_psql('postgres', q{
CREATE TABLE public.purge_log (xid xid8, began timestamptz, ended timestamptz, deleted bigint);
CREATE FUNCTION public.purge_logged() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    SELECT count(*) INTO n FROM gone;
    IF n > 0 THEN
        PERFORM pg_catalog.pg_sleep(0.05);
        INSERT INTO public.purge_log
        VALUES (pg_catalog.pg_current_xact_id(), pg_catalog.transaction_timestamp(),
                pg_catalog.clock_timestamp(), n);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER purge_logged AFTER DELETE ON idem.claims REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION public.purge_logged();});
fill();
ok(poll(q{SELECT count(*) FROM idem.claims WHERE ns = 'short' AND msg_id LIKE 'old-%'}, '0'),
	'expired claims are purged');
# one transaction per batch of idem.maintenance_batch (100); after each, a
# pause so that the worker works idem.maintenance_load (0.25) of the time:
# three times as long as the batch took, but no longer than the interval
# between rounds (1 s here; checked with margins: 2.5 times, 0.9 s)
my $batches = $node->safe_psql('postgres', q{
SELECT count(*), max(deleted), sum(deleted),
       bool_and(next_began IS NULL OR next_began - ended >= least(2.5 * (ended - began), interval '0.9 s'))
  FROM (SELECT xid, min(began) AS began, max(ended) AS ended, sum(deleted) AS deleted,
               lead(min(began)) OVER (ORDER BY min(began)) AS next_began
          FROM public.purge_log GROUP BY xid) b});
is($batches, '10|100|1000|t', 'in 10 transactions of 100, each followed by a pause of three times its length (at most the interval)');
$node->safe_psql('postgres', q{
DROP TRIGGER purge_logged ON idem.claims;
DROP FUNCTION public.purge_logged();
DROP TABLE public.purge_log;});
is($node->safe_psql('postgres', q{
SELECT (SELECT count(*) FROM idem.claims WHERE ns = 'short' AND msg_id LIKE 'new-%'),
       (SELECT count(*) FROM idem.claims WHERE ns = 'long')}),
	'50|50', 'claims inside their retention are kept');
ok(poll(q{SELECT count(*) FROM idem.tokens WHERE expires_at <= now()}, '0'),
	'expired tokens are purged');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem.tokens}), '20',
	'valid tokens are kept');
# the pauses above are those of the default load
is($node->safe_psql('postgres', 'SHOW idem.maintenance_load'), '0.25',
	'idem.maintenance_load is 0.25 by default');

# a round that fails is logged, and the next rounds go on once it works
my $offset = -s $node->logfile;
$node->safe_psql('postgres', q{ALTER FUNCTION idem._purge_expired(regclass, int) RENAME TO _purge_expired_away});
ok(wait_for_log($node, qr/ERROR:.*idem\._purge_expired/, $offset), 'a failing round is logged');
my $pid = worker_pid();
isnt($pid, '', 'the worker is still there after a failing round');
fill();
# a round that began after the claims were there, and failed
$offset = -s $node->logfile;
ok(wait_for_log($node, qr/ERROR:.*idem\._purge_expired/, $offset), 'the next round fails too');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem.claims WHERE ns = 'short' AND msg_id LIKE 'old-%'}),
	'1000', 'nothing was purged while the round failed (it is one transaction)');
$node->safe_psql('postgres', q{ALTER FUNCTION idem._purge_expired_away(regclass, int) RENAME TO _purge_expired});
ok(poll(q{SELECT count(*) FROM idem.claims WHERE ns = 'short' AND msg_id LIKE 'old-%'}, '0'),
	'the rounds after it purge again');
is(worker_pid(), $pid, 'by the same worker');

# The worker runs as a superuser: nothing it runs may be chosen by a role
# with CREATE on the extension's schema (the database's owner owns public),
# here by renaming that schema and making another public with functions of
# idem's names in it.
$node->safe_psql('postgres', q{
CREATE ROLE dbo;
GRANT CREATE ON DATABASE postgres TO dbo;
ALTER SCHEMA public OWNER TO dbo;
CREATE TABLE idem_log (who text, fn text);
GRANT INSERT ON idem_log TO PUBLIC;
SET ROLE dbo;
ALTER SCHEMA public RENAME TO public_old;
CREATE SCHEMA public;
CREATE FUNCTION public.idem_purge(text, int) RETURNS bigint LANGUAGE sql
    AS $$ INSERT INTO public_old.idem_log VALUES (current_user, 'idem_purge') RETURNING 0::bigint $$;
CREATE FUNCTION public.idem_token_purge(int) RETURNS bigint LANGUAGE sql
    AS $$ INSERT INTO public_old.idem_log VALUES (current_user, 'idem_token_purge') RETURNING 0::bigint $$;
CREATE FUNCTION public.idem_request_purge(int) RETURNS bigint LANGUAGE sql
    AS $$ INSERT INTO public_old.idem_log VALUES (current_user, 'idem_request_purge') RETURNING 0::bigint $$;
CREATE FUNCTION public.idem_outbox_purge(interval, int) RETURNS bigint LANGUAGE sql
    AS $$ INSERT INTO public_old.idem_log VALUES (current_user, 'idem_outbox_purge') RETURNING 0::bigint $$;
CREATE FUNCTION public.idem_maintenance(int) RETURNS TABLE (kind text, purged bigint) LANGUAGE sql
    AS $$ INSERT INTO public_old.idem_log VALUES (current_user, 'idem_maintenance') RETURNING 'x', 0::bigint $$;
RESET ROLE;
INSERT INTO idem.claims SELECT 'short', 'old-' || i, now() - interval '2 days' FROM generate_series(1, 50) i;});
ok(poll(q{SELECT count(*) FROM idem.claims WHERE ns = 'short' AND msg_id LIKE 'old-%'}, '0'),
	'the worker purges with the schema of the extension renamed');
is($node->safe_psql('postgres', q{SELECT count(*) FROM public_old.idem_log}), '0',
	'and runs none of the functions put in a schema of the old name');
$node->safe_psql('postgres', q{
DROP SCHEMA public CASCADE;
ALTER SCHEMA public_old RENAME TO public;
ALTER SCHEMA public OWNER TO pg_database_owner;
DROP TABLE idem_log;
REVOKE CREATE ON DATABASE postgres FROM dbo;
DROP ROLE dbo;});

# a crash of the worker: the postmaster resets the server (the worker
# touches shared memory) and starts it again
kill 'KILL', $pid;
ok(poll(q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem maintenance worker' AND pid <> } . $pid, '1'),
	'a worker killed by SIGKILL is started again');
fill();
ok(poll(q{SELECT count(*) FROM idem.claims WHERE ns = 'short' AND msg_id LIKE 'old-%'}, '0'),
	'and purges');

# a database whose transactions default to SERIALIZABLE: the worker still
# runs its rounds at READ COMMITTED (the purge of idle outbox keys needs it,
# and would otherwise fail every round and undo the others)
$node->safe_psql('postgres', q{ALTER DATABASE postgres SET default_transaction_isolation = 'serializable'});
$node->restart;
ok(poll(q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem maintenance worker'}, '1'),
	'the worker runs again after a restart');
fill();
# an idle outbox key: only a round at READ COMMITTED removes it
$node->safe_psql('postgres', q{
SELECT idem_outbox_send('ser', 'idle', '{}');
SELECT idem_outbox_ack(array_agg(id)) FROM idem_outbox_lease('ser-relay')});
ok(poll(q{SELECT count(*) FROM idem.claims WHERE ns = 'short' AND msg_id LIKE 'old-%'}, '0'),
	'the worker purges in a database whose default isolation is SERIALIZABLE');
ok(poll(q{SELECT count(*) FROM idem.outbox_keys WHERE topic = 'ser'}, '0'),
	'idle outbox keys too: its rounds run at READ COMMITTED');
# by hand at that level: every purge but the outbox's, which says why
# (the claims made in its transaction, which the worker cannot purge first)
my ($rr_ret, $rr_out, $rr_err) = $node->psql('postgres', q{
BEGIN;
INSERT INTO idem.claims SELECT 'short', 'rr-' || i, now() - interval '2 days' FROM generate_series(1, 30) i;
SELECT string_agg(kind || '=' || purged, ',' ORDER BY kind) FROM idem_maintenance(1000) WHERE kind IN ('claims', 'outbox_keys');
COMMIT;});
like($rr_out, qr/^claims=\d+,outbox_keys=0$/, 'idem_maintenance() at SERIALIZABLE purges, but not the idle outbox keys');
cmp_ok(($rr_out =~ /^claims=(\d+)/)[0] // 0, '>=', 30, 'the claims of its transaction among them');
like($rr_err, qr/NOTICE:  idle outbox keys are not purged at the SERIALIZABLE isolation level/, 'and says so');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem.claims WHERE msg_id LIKE 'rr-%'}), '0',
	'its claims were purged');
$node->safe_psql('postgres', q{ALTER DATABASE postgres RESET default_transaction_isolation});

# a database whose transactions default to read-only: the worker's are
# read-write all the same, and no round fails
$node->safe_psql('postgres', q{ALTER DATABASE postgres SET default_transaction_read_only = on});
my $ro_offset = -s $node->logfile;
$node->safe_psql('postgres', q{
SET default_transaction_read_only = off;
INSERT INTO idem.claims SELECT 'short', 'ro-' || i, now() - interval '2 days' FROM generate_series(1, 30) i});
is($node->safe_psql('postgres', 'SHOW default_transaction_read_only'), 'on',
	'the database defaults to read-only transactions');
ok(poll(q{SELECT count(*) FROM idem.claims WHERE msg_id LIKE 'ro-%'}, '0'),
	'the worker purges in a database whose transactions default to read-only');
unlike(slurp_file($node->logfile, $ro_offset), qr/read-only transaction/,
	'and no round failed for it');
$node->safe_psql('postgres', q{
SET default_transaction_read_only = off;
ALTER DATABASE postgres RESET default_transaction_read_only});

# a database whose owner sets role and session_authorization for it: the
# worker's rounds run as the bootstrap superuser all the same (as the role
# they set, every round failed for want of privileges)
my $su = $node->safe_psql('postgres', 'SELECT current_user');
$node->safe_psql('postgres', q{CREATE ROLE dbo LOGIN; ALTER DATABASE postgres OWNER TO dbo});
$node->safe_psql('postgres', q{
SET SESSION AUTHORIZATION dbo;
ALTER DATABASE postgres SET role = 'dbo';
ALTER DATABASE postgres SET session_authorization = 'dbo'});
my $as_su = qq{SET SESSION AUTHORIZATION "$su"; SET ROLE NONE;};
my $auth_offset = -s $node->logfile;
is($node->safe_psql('postgres', q{SELECT current_user}), 'dbo',
	'sessions of the database run as the role its settings set');
$node->safe_psql('postgres', qq{$as_su
INSERT INTO idem.claims SELECT 'short', 'auth-' || i, now() - interval '2 days' FROM generate_series(1, 30) i});
ok(poll(qq{$as_su SELECT count(*) FROM idem.claims WHERE msg_id LIKE 'auth-%'}, '0'),
	'the worker purges in a database whose settings set role and session_authorization');
unlike(slurp_file($node->logfile, $auth_offset), qr/permission denied/, 'and no round failed for want of privileges');
$node->safe_psql('postgres', qq{$as_su
ALTER DATABASE postgres RESET role;
ALTER DATABASE postgres RESET session_authorization;
ALTER DATABASE postgres OWNER TO "$su";
DROP ROLE dbo});

# by hand, for pg_cron: at most max_rows of each kind, in the caller's
# transaction (which also keeps the rows it made from the worker)
my $round = $node->safe_psql('postgres', q{
BEGIN;
INSERT INTO idem.claims SELECT 'short', 'hand-' || i, now() - interval '2 days' FROM generate_series(1, 30) i;
INSERT INTO idem.tokens
SELECT 'hand', sha256(convert_to('hand-' || i, 'UTF8')), now() - interval '1 day', NULL FROM generate_series(1, 12) i;
INSERT INTO idem.requests (ns, key, fingerprint, response_code, attempts, created_at, finished_at, expires_at)
SELECT 'hand', 'hand-' || i, 'fp', 200, 1, now() - interval '2 days', now() - interval '2 days', now() - interval '1 day'
  FROM generate_series(1, 12) i;
SELECT string_agg(kind || '=' || purged, ',' ORDER BY kind) FROM idem_maintenance(10);
COMMIT;});
is($round, 'claims=10,outbox_keys=0,requests=10,tokens=10', 'idem_maintenance() purges every kind, max_rows of each');
is(sqlstate_of($node, 'postgres', 'SELECT * FROM idem_maintenance(0)'), '22023', 'a batch of 0 is refused');

# stopping: the worker ends with the server
$node->stop('fast');
like(slurp_file($node->logfile), qr/idem maintenance worker started/, 'the worker logged its start');

# a database whose idem is still at 0.1.0 (a new library installed, the
# update not run yet): logged once, with what to do, no error every round
my $old = idem_node('worker_old', "shared_preload_libraries = 'idem'",
	"idem.maintenance_interval = '1s'");
$old->safe_psql('postgres', 'CREATE DATABASE old');
$old->safe_psql('old', q{CREATE EXTENSION idem VERSION '0.1.0'});
$old->safe_psql('postgres', q{ALTER SYSTEM SET idem.database = 'old'});
$old->restart;
ok(wait_for_log($old, qr/extension "idem" in database "old" is at version 0\.1\.0, which has no idem_maintenance\(\)/, 0),
	'a worker whose database is at 0.1.0 says so');
sleep(3);
my $old_log = slurp_file($old->logfile);
is(scalar(() = $old_log =~ /is at version 0\.1\.0/g), 1, 'once, not every round');
unlike($old_log, qr/ERROR:.*idem_maintenance/, 'and fails no round');
# started before any backend of a database, the worker reads pg_database
# without its index (whose shared relcache entry a start removes)
unlike($old_log, qr/FATAL:  (?!terminating background worker)/, 'the worker and its rounds start without failing');
$old->safe_psql('old', q{
ALTER EXTENSION idem UPDATE;
INSERT INTO idem.claims SELECT 'default', 'up-' || i, now() - interval '30 days' FROM generate_series(1, 20) i});
ok(poll_node($old, 'old', q{SELECT count(*) FROM idem.claims WHERE msg_id LIKE 'up-%'}, '0'),
	'once updated, the worker purges there');

# between rounds nothing of idem is connected to its database: it can be
# copied as a template and dropped, as a database without sessions; one that
# does not exist is logged once and skipped, without an error every round
$old->safe_psql('postgres', q{ALTER SYSTEM SET idem.maintenance_interval = '1h'; SELECT pg_reload_conf()});
sleep(2);	# a round in progress ends; the next is in an hour
ok(poll_node($old, 'postgres', q{SELECT count(*) FROM pg_stat_activity WHERE datname = 'old'}, '0'),
	'no session of the worker in its database between rounds');
is($old->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem maintenance worker' AND datname IS NULL}),
	'1', 'the worker itself is connected to no database');
my ($tpl_ret, $tpl_out, $tpl_err) = $old->psql('postgres', 'CREATE DATABASE copied TEMPLATE old');
is($tpl_ret, 0, 'the database is copied as a template') or diag $tpl_err;
my ($drop_ret, $drop_out, $drop_err) = $old->psql('postgres', 'DROP DATABASE old');
is($drop_ret, 0, 'and dropped') or diag $drop_err;
my $drop_offset = -s $old->logfile;
$old->safe_psql('postgres', q{ALTER SYSTEM SET idem.maintenance_interval = '1s'; SELECT pg_reload_conf()});
ok(wait_for_log($old, qr/idem maintenance worker: database "old" does not exist/, $drop_offset),
	'a database that does not exist is logged');
sleep(3);
my $drop_log = substr(slurp_file($old->logfile), $drop_offset);
is(scalar(() = $drop_log =~ /idem maintenance worker: database "old" does not exist/g), 1, 'once, not every round');
unlike($drop_log, qr/FATAL:  (?!terminating background worker)/, 'and no round fails to connect');

# a database named with more than NAMEDATALEN - 1 bytes, as CREATE DATABASE
# and a client's connection cut it
my $long = 'long_' . ('d' x 70);
# made first, and a prefix of the name too: but 61 bytes of ASCII are not a
# cut of it
my $decoy = substr($long, 0, 61);
$old->safe_psql('postgres', qq{CREATE DATABASE "$decoy"});
$old->safe_psql($decoy, q{
CREATE EXTENSION idem;
INSERT INTO idem.claims SELECT 'default', 'decoy-' || i, now() - interval '30 days' FROM generate_series(1, 20) i});
$old->safe_psql('postgres', qq{CREATE DATABASE "$long"});
my $cut = substr($long, 0, 63);
$old->safe_psql($cut, q{
CREATE EXTENSION idem;
INSERT INTO idem.claims SELECT 'default', 'long-' || i, now() - interval '30 days' FROM generate_series(1, 20) i});
$old->safe_psql('postgres', qq{ALTER SYSTEM SET idem.database = '$long'});
$old->restart;
ok(poll_node($old, $cut, q{SELECT count(*) FROM idem.claims WHERE msg_id LIKE 'long-%'}, '0'),
	'a database name longer than a name is cut as CREATE DATABASE cuts it');
unlike(slurp_file($old->logfile), qr/database "long_d+" does not exist/, 'and is not reported missing');
is($old->safe_psql($decoy, q{SELECT count(*) FROM idem.claims WHERE msg_id LIKE 'decoy-%'}), '20',
	'a database whose name is a shorter prefix of it is not taken for it');

# a database that does not accept connections (datallowconn off) is logged
# once and skipped, as a missing one: no round tries to connect to it; once
# it accepts connections again, the worker purges there
my $nc_offset = -s $old->logfile;
$old->safe_psql('postgres', qq{ALTER DATABASE "$cut" ALLOW_CONNECTIONS false});
ok(wait_for_log($old, qr/idem maintenance worker: database "\Q$cut\E" does not accept connections/, $nc_offset),
	'a database that does not accept connections is logged');
sleep(3);
my $nc_log = slurp_file($old->logfile, $nc_offset);
is(scalar(() = $nc_log =~ /does not accept connections/g), 1, 'once, not every round');
unlike($nc_log, qr/FATAL:  (?!terminating background worker)/, 'and no round fails to connect');
$old->safe_psql('postgres', qq{ALTER DATABASE "$cut" ALLOW_CONNECTIONS true});
$old->safe_psql($cut, q{
INSERT INTO idem.claims SELECT 'default', 'back-' || i, now() - interval '30 days' FROM generate_series(1, 20) i});
ok(poll_node($old, $cut, q{SELECT count(*) FROM idem.claims WHERE msg_id LIKE 'back-%'}, '0'),
	'once it accepts connections again, the worker purges there');

# a name of more than NAMEDATALEN - 1 bytes in a multibyte encoding:
# CREATE DATABASE cuts it at a character's boundary (62 bytes of "é" here,
# not 63) of the encoding it runs in (UTF8), also for a database of another
# encoding (LATIN1, where 63 bytes would be 63 characters), and the worker
# finds it so
my $mb = "\xc3\xa9" x 40;
my $mbcut = "\xc3\xa9" x 31;
$old->safe_psql('postgres', qq{CREATE DATABASE "$mb" ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0});
$old->safe_psql($mbcut, q{
CREATE EXTENSION idem;
INSERT INTO idem.claims SELECT 'default', 'mb-' || i, now() - interval '30 days' FROM generate_series(1, 20) i});
my $mb_offset = -s $old->logfile;
$old->safe_psql('postgres', qq{ALTER SYSTEM SET idem.database = '$mb'});
$old->restart;
ok(poll_node($old, $mbcut, q{SELECT count(*) FROM idem.claims WHERE msg_id LIKE 'mb-%'}, '0'),
	'a multibyte database name longer than a name is cut at a character, as CREATE DATABASE cuts it');
unlike(slurp_file($old->logfile, $mb_offset), qr/does not exist/, 'and is not reported missing');
$old->stop;

# a round in progress is ended by the commands of the database's owner
# that need the database without sessions (as autovacuum's workers are),
# not by another role's attempt; a cancel does not end the launcher
my $own = idem_node('worker_owner', "shared_preload_libraries = 'idem'", "idem.database = 'shop'",
	"idem.maintenance_interval = '1s'");
$own->safe_psql('postgres', q{CREATE ROLE shop_owner LOGIN CREATEDB; CREATE ROLE stranger LOGIN;
                               CREATE DATABASE shop OWNER shop_owner});
# each round stops in a trigger, on an expired claim it never gets to purge
$own->safe_psql('shop', q{
CREATE EXTENSION idem;
CREATE FUNCTION public.stall() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_catalog.pg_sleep(3600);
    RETURN OLD;
END $$;
CREATE TRIGGER stall BEFORE DELETE ON idem.claims FOR EACH ROW EXECUTE FUNCTION public.stall();
INSERT INTO idem.claims VALUES ('default', 'stalled', now() - interval '30 days');});
sub round_pid
{
	my $pid = '';
	poll_node($own, 'postgres', q{SELECT count(*) FROM pg_stat_activity
	                              WHERE backend_type = 'idem maintenance round' AND wait_event = 'PgSleep'}, '1');
	return $own->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idem maintenance round'});
}
my $stalled = round_pid();
isnt($stalled, '', 'a round is in progress in the database');
my ($st_ret, $st_out, $st_err) = $own->psql('postgres', 'DROP DATABASE shop', extra_params => [ '-U', 'stranger' ]);
like($st_err, qr/must be owner of database shop/, 'another role may not drop the database');
is($own->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idem maintenance round'}),
	$stalled, 'and its attempt does not end the round');
($st_ret, $st_out, $st_err) = $own->psql('postgres', 'BEGIN; DROP DATABASE shop;', extra_params => [ '-U', 'shop_owner' ]);
like($st_err, qr/DROP DATABASE cannot run inside a transaction block/,
	'the owner may not drop it in a transaction block');
is($own->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idem maintenance round'}),
	$stalled, 'nor does a command that fails before it counts the sessions');
# nor the owner's commands that the server refuses before it counts the
# sessions: a new name that is taken, a drop while a subscription of the
# database is defined
($st_ret, $st_out, $st_err) = $own->psql('postgres', 'ALTER DATABASE shop RENAME TO postgres',
	extra_params => [ '-U', 'shop_owner' ]);
like($st_err, qr/database "postgres" already exists/, 'the owner may not rename it to a name that is taken');
is($own->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idem maintenance round'}),
	$stalled, 'and its attempt does not end the round');
$own->safe_psql('shop', q{CREATE SUBSCRIPTION shop_sub CONNECTION 'dbname=nowhere' PUBLICATION p
                          WITH (connect = false, slot_name = NONE, enabled = false)});
($st_ret, $st_out, $st_err) = $own->psql('postgres', 'DROP DATABASE shop', extra_params => [ '-U', 'shop_owner' ]);
like($st_err, qr/being used by logical replication subscription/, 'nor drop it while a subscription is defined');
is($own->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idem maintenance round'}),
	$stalled, 'and its attempt does not end the round');
$own->safe_psql('shop', 'DROP SUBSCRIPTION shop_sub');
my ($cp_ret, $cp_out, $cp_err) = $own->psql('postgres', 'CREATE DATABASE shop_copy TEMPLATE shop',
	extra_params => [ '-U', 'shop_owner' ]);
is($cp_ret, 0, "the owner copies the database as a template while a round is in progress") or diag $cp_err;
isnt(round_pid(), '', 'the next round is in progress');
my ($rn_ret, $rn_out, $rn_err) = $own->psql('postgres', 'ALTER DATABASE shop RENAME TO shop_renamed',
	extra_params => [ '-U', 'shop_owner' ]);
is($rn_ret, 0, 'the owner renames it while a round is in progress') or diag $rn_err;
$own->psql('postgres', 'ALTER DATABASE shop_renamed RENAME TO shop') if $rn_ret == 0;
isnt(round_pid(), '', 'the next round is in progress');
# a move to another tablespace (the server counts the sessions there too)
my $tsdir = PostgreSQL::Test::Utils::tempdir;
$own->safe_psql('postgres', "CREATE TABLESPACE shop_ts LOCATION '$tsdir'");
my $moving = round_pid();
my ($ts_ret, $ts_out, $ts_err) = $own->psql('postgres', 'ALTER DATABASE shop SET TABLESPACE shop_ts',
	extra_params => [ '-U', 'shop_owner' ]);
like($ts_err, qr/permission denied for tablespace shop_ts/, 'the owner may not move it where it may not create');
is($own->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idem maintenance round'}),
	$moving, 'and its attempt does not end the round');
$own->safe_psql('postgres', 'GRANT CREATE ON TABLESPACE shop_ts TO shop_owner');
($ts_ret, $ts_out, $ts_err) = $own->psql('postgres', 'ALTER DATABASE shop SET TABLESPACE shop_ts',
	extra_params => [ '-U', 'shop_owner' ]);
is($ts_ret, 0, 'the owner moves it to another tablespace while a round is in progress') or diag $ts_err;
isnt(round_pid(), '', 'the next round is in progress');
my ($dr_ret, $dr_out, $dr_err) = $own->psql('postgres', 'DROP DATABASE shop', extra_params => [ '-U', 'shop_owner' ]);
is($dr_ret, 0, 'the owner drops it while a round is in progress, without FORCE') or diag $dr_err;
my $launcher = $own->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idem maintenance worker'});
my $cancel_offset = -s $own->logfile;
$own->safe_psql('postgres', "SELECT pg_cancel_backend($launcher)");
sleep(1);
is($own->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idem maintenance worker'}),
	$launcher, 'a cancel does not end the launcher');
unlike(slurp_file($own->logfile, $cancel_offset), qr/exited with exit code/, 'nothing exits');
$own->stop;

# off switch
my $off = idem_node('worker_off', "shared_preload_libraries = 'idem'", 'idem.maintenance = off',
	"idem.database = 'postgres'", "idem.maintenance_interval = '1s'");
$off->safe_psql('postgres',
	q{INSERT INTO idem.claims SELECT 'default', 'off-' || i, now() - interval '30 days' FROM generate_series(1, 20) i});
# an absence: three intervals in which a worker would have purged them
sleep(3);
is($off->safe_psql('postgres',
	q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem maintenance worker'}),
	'0', 'idem.maintenance = off starts no worker');
is($off->safe_psql('postgres', q{SELECT count(*) FROM idem.claims WHERE msg_id LIKE 'off-%'}),
	'20', 'and nothing is purged');
$off->stop;
done_testing();
