# The settings of the topics, judged for many key rows read by a scan that
# lets go of its buffers: on a server whose shared buffers are small, a scan
# of idem.outbox_keys larger than a quarter of them reuses a ring of a few
# buffers, and a key row's topic is gone from its buffer once the scan has
# moved on.  The statistics and the redrive must judge every key by its own
# topic's settings, as a lease does.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('outbox_topics', "shared_buffers = '128kB'", 'max_connections = 10');

# 2,000 keys, every other one in each topic, their rows side by side
$node->safe_psql('postgres', q{
SELECT count(idem_outbox_send(CASE WHEN g % 2 = 0 THEN 'ta' ELSE 'tb' END, 'k' || g, '{}'))
  FROM generate_series(1, 2000) g;
-- every head leased twice, each lease running out at once: 2 attempts, none dead
SELECT count(*) FROM idem_outbox_lease('r', 10000, '1 microsecond');
SELECT count(*) FROM idem_outbox_lease('r', 10000, '1 microsecond');
-- one attempt allowed in ta: each of its heads is dead now, none of tb's
SELECT idem_outbox_configure('ta', 1, '1 second', '1 minute');
});
ok($node->safe_psql('postgres', q{SELECT pg_relation_size('idem.outbox_keys') / 8192}) > 8,
	'the key rows take more than a quarter of the shared buffers');
$node->restart;

is($node->safe_psql('postgres', q{SELECT string_agg(topic || ' ' || pending || ' ' || dead, ',' ORDER BY topic)
                                    FROM idem_outbox_stats()}),
	'ta 0 1000,tb 1000 0', 'the statistics count the dead heads of ta, and none of tb');
is($node->safe_psql('postgres', q{
BEGIN;
SELECT idem_outbox_redrive();
SELECT string_agg(topic || ' ' || reset, ',' ORDER BY topic)
  FROM (SELECT topic, count(*) FILTER (WHERE attempts = 0) AS reset FROM idem.outbox_keys GROUP BY topic) k;
ROLLBACK;}),
	"1000\nta 1000,tb 0", "the redrive takes back the heads of ta, and leaves tb's");
is($node->safe_psql('postgres', q{
BEGIN;
SELECT count(*) FROM idem_outbox_lease('r2', 10000, '1 hour');
SELECT string_agg(topic || ' ' || dead, ',' ORDER BY topic)
  FROM (SELECT topic, count(*) FILTER (WHERE dead) AS dead FROM idem.outbox_keys GROUP BY topic) k;
ROLLBACK;}),
	"1000\nta 1000,tb 0", 'as a lease judges them');

$node->stop;
done_testing();
