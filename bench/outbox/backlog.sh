#!/usr/bin/env bash
# The outbox's lease under a backlog: a million pending messages over
# thousands of keys, and keys held back by dead messages.  Each pgbench
# transaction is one relay round: lease up to 100 messages, at most one per
# key, each the oldest of its key, then acknowledge them.
#
#  - idem: idem_outbox_lease, then idem_outbox_ack, two statements;
#  - by hand, the ordered flow with a key table (the "ord" flow of the
#    peers' harness): BEGIN; lock up to 100 key rows that have messages and
#    are not dead, FOR UPDATE SKIP LOCKED; read each key's oldest message
#    through (key, id); DELETE them; COMMIT.
#
# Both sides start each run from the same backlog: MESSAGES pending messages
# over KEYS keys, and DEAD keys whose oldest message is dead, each with
# PER_DEAD messages behind it.  Every configuration runs REPEAT times, the
# side that goes first alternating; the table shows the median messages per
# second and server CPU per message, with ratios.
#
# With IDLE (a list of numbers), the state is instead IDLE keys whose
# messages were all delivered, and LIVE keys with PER_LIVE pending messages
# each: the backlog is soon delivered, and most rounds find nothing, as for
# a relay that keeps up among the ids of orders or accounts.  The table then
# shows rounds per second and server CPU per round, per number of idle keys.
#
#   bash bench/outbox/backlog.sh
#   MESSAGES=200000 DURATION=5 REPEAT=3 CLIENTS="1 4" bash bench/outbox/backlog.sh
#   IDLE="10000 100000" DURATION=5 bash bench/outbox/backlog.sh
#
# Runs as root on Debian 12: it builds idem into a private copy of
# PostgreSQL and starts a throwaway server on a Unix socket (PORT, 5652).
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/scripts/common.sh"
need_root

PORT=${PORT:-5652}
MESSAGES=${MESSAGES:-1000000}
KEYS=${KEYS:-5000}
DEAD=${DEAD:-1000}
PER_DEAD=${PER_DEAD:-100}
IDLE=${IDLE:-}
LIVE=${LIVE:-100}
PER_LIVE=${PER_LIVE:-10}
DURATION=${DURATION:-10}
REPEAT=${REPEAT:-3}
CLIENTS=${CLIENTS:-"1 4"}
SYNC_COMMIT=${SYNC_COMMIT:-off}

install_packages
work=$(copy_tree "$here")
dir=$(mktemp -d /tmp/idem-bench-backlog.XXXXXX)
chmod 755 "$dir"
cleanup() { stop_cluster "$dir/cluster"; rm -rf "$dir" "$work"; }
trap cleanup EXIT

echo "== building in $work"
build_and_install "$work"
start_cluster "$dir/cluster" "$PORT" \
    "shared_buffers = '2GB'" \
    "synchronous_commit = $SYNC_COMMIT" \
    "max_wal_size = '8GB'" \
    "checkpoint_timeout = '1h'" \
    "jit = off" \
    "max_connections = 50"

as_pg() { runuser -u postgres -- env PATH="$PATH" "$@"; }
sql() { as_pg psql -h "$dir/cluster" -p "$PORT" -X -q -At -v ON_ERROR_STOP=1 -d bench "$@"; }
as_pg createdb -h "$dir/cluster" -p "$PORT" bench || die "createdb failed"

sql >/dev/null <<'SQL' || die "setup failed"
CREATE EXTENSION idem;
CREATE SCHEMA hand;
CREATE TABLE hand.outbox (id bigserial PRIMARY KEY, key text NOT NULL, payload jsonb NOT NULL,
                          created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON hand.outbox (key, id);
CREATE TABLE hand.keys (key text PRIMARY KEY, dead bool NOT NULL DEFAULT false);
SQL

scripts=$(mktemp -d /tmp/idem-bench-backlog-scripts.XXXXXX)
chmod 755 "$scripts"
trap 'cleanup; rm -rf "$scripts"' EXIT
cat > "$scripts/idem.sql" <<'EOF2'
SELECT coalesce(array_agg(id), '{}') AS ids, count(*) AS n FROM idem_outbox_lease('relay-' || :client_id, 100, '1 minute') \gset
SELECT idem_outbox_ack(:ids::uuid[]);
EOF2
cat > "$scripts/hand.sql" <<'EOF2'
BEGIN;
SELECT coalesce(array_agg(key), '{}') AS keys FROM (SELECT k.key FROM hand.keys k
 WHERE NOT k.dead AND EXISTS (SELECT 1 FROM hand.outbox o WHERE o.key = k.key)
 LIMIT 100 FOR UPDATE OF k SKIP LOCKED) s \gset
SELECT coalesce(array_agg(h.id), '{}') AS ids FROM unnest(:keys::text[]) u(key) CROSS JOIN LATERAL
 (SELECT id FROM hand.outbox o WHERE o.key = u.key ORDER BY id LIMIT 1) h \gset
DELETE FROM hand.outbox WHERE id = ANY(:ids::bigint[]);
COMMIT;
EOF2
chmod 644 "$scripts"/*.sql

payload="'{\"key\": \"k0001\", \"event\": \"order.updated\", \"body\": \"' || repeat('x', 150) || '\"}'"
# The same backlog on both sides.  idem's rows are written as idem_outbox_send
# writes them (the benchmark measures the lease, not the sends).
reset_side() {
    if [ -n "$IDLE" ]; then reset_idle "$@"; return; fi
    if [ "$1" = idem ]; then
        sql <<SQL >/dev/null || die "reset of idem failed"
TRUNCATE idem.outbox, idem.outbox_keys;
INSERT INTO idem.outbox (id, aggregatetype, aggregateid, type, payload, headers, seq, created_at, key_hash)
    SELECT idem._outbox_id(t, k, g), t, k, NULL, ($payload)::jsonb, NULL, g, now(), idem._outbox_key_hash(t, k)
      FROM (SELECT g, 'events' AS t, 'k' || (g % $KEYS) AS k FROM generate_series(1, $MESSAGES) g
            UNION ALL
            SELECT $MESSAGES + g, 'events', 'd' || (g % $DEAD) FROM generate_series(1, $DEAD * $PER_DEAD) g) m;
SELECT setval('idem.outbox_seq', $MESSAGES + $DEAD * $PER_DEAD);
INSERT INTO idem.outbox_keys (topic, key, dead, attempts, available_at)
    SELECT DISTINCT aggregatetype, aggregateid, aggregateid LIKE 'd%', 0, now() FROM idem.outbox;
UPDATE idem.outbox_keys k SET attempts = 10, last_error = 'rejected',
       head_id = (SELECT id FROM idem.outbox o WHERE o.aggregateid = k.key ORDER BY seq LIMIT 1)
 WHERE dead;
VACUUM (FREEZE, ANALYZE) idem.outbox, idem.outbox_keys;
CHECKPOINT;
SQL
    else
        sql <<SQL >/dev/null || die "reset of hand failed"
TRUNCATE hand.outbox, hand.keys;
INSERT INTO hand.outbox (id, key, payload)
    SELECT g, k, ($payload)::jsonb
      FROM (SELECT g, 'k' || (g % $KEYS) AS k FROM generate_series(1, $MESSAGES) g
            UNION ALL
            SELECT $MESSAGES + g, 'd' || (g % $DEAD) FROM generate_series(1, $DEAD * $PER_DEAD) g) m;
INSERT INTO hand.keys SELECT DISTINCT key, key LIKE 'd%' FROM hand.outbox;
VACUUM (FREEZE, ANALYZE) hand.outbox, hand.keys;
CHECKPOINT;
SQL
    fi
}

# reset_idle SIDE N: N idle keys, and LIVE keys with PER_LIVE messages each
reset_idle() {
    if [ "$1" = idem ]; then
        sql <<SQL >/dev/null || die "reset of idem failed"
TRUNCATE idem.outbox, idem.outbox_keys;
INSERT INTO idem.outbox_keys (topic, key, dead, attempts, available_at)
    SELECT 'events', 'i' || g, false, 0, now() - interval '1 day' FROM generate_series(1, $2) g;
INSERT INTO idem.outbox (id, aggregatetype, aggregateid, type, payload, headers, seq, created_at, key_hash)
    SELECT idem._outbox_id('events', k, g), 'events', k, NULL, ($payload)::jsonb, NULL, g, now(), idem._outbox_key_hash('events', k)
      FROM (SELECT g, 'k' || (g % $LIVE) AS k FROM generate_series(1, $LIVE * $PER_LIVE) g) m;
SELECT setval('idem.outbox_seq', $LIVE * $PER_LIVE);
INSERT INTO idem.outbox_keys (topic, key, dead, attempts, available_at)
    SELECT DISTINCT aggregatetype, aggregateid, false, 0, now() FROM idem.outbox;
VACUUM (FREEZE, ANALYZE) idem.outbox, idem.outbox_keys;
CHECKPOINT;
SQL
    else
        sql <<SQL >/dev/null || die "reset of hand failed"
TRUNCATE hand.outbox, hand.keys;
INSERT INTO hand.keys SELECT 'i' || g FROM generate_series(1, $2) g;
INSERT INTO hand.outbox (id, key, payload)
    SELECT g, 'k' || (g % $LIVE), ($payload)::jsonb FROM generate_series(1, $LIVE * $PER_LIVE) g;
INSERT INTO hand.keys SELECT DISTINCT key FROM hand.outbox;
VACUUM (FREEZE, ANALYZE) hand.outbox, hand.keys;
CHECKPOINT;
SQL
    fi
}

pending() {
    if [ "$1" = idem ]; then sql -c "SELECT count(*) FROM idem.outbox"; else sql -c "SELECT count(*) FROM hand.outbox"; fi
}

# run_side SIDE STATE CLIENTS: prints "rate cpu-us-per-unit", the unit being a
# message delivered (backlog) or a round (IDLE; STATE is the idle keys)
run_side() {
    local side=$1 n=$2 c=$3 threads out t0 t1 before after units
    threads=$(( c < 2 ? c : 2 ))
    reset_side "$side" "$n"
    before=$(pending "$side")
    t0=$(server_cpu_us "$dir/cluster")
    out=$(as_pg pgbench -h "$dir/cluster" -p "$PORT" -n -M prepared -c "$c" -j "$threads" \
        -T "$DURATION" -f "$scripts/$side.sql" bench 2>&1) || { echo "$out" >&2; die "pgbench failed"; }
    wait_backends_gone "$dir/cluster" "$PORT" bench
    t1=$(server_cpu_us "$dir/cluster")
    after=$(pending "$side")
    if [ -n "$IDLE" ]; then
        [ "$after" = 0 ] || die "$side left messages undelivered"
        units=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
    else
        units=$((before - after))
    fi
    echo "$(awk -v m="$units" -v s="$DURATION" 'BEGIN { printf "%.0f", m / s }') $(awk -v d=$((t1 - t0)) -v n="$units" 'BEGIN { printf "%.2f", (n > 0) ? d / n : 0 }')"
}

# what the benchmark relies on: the dead keys hold their messages back, and a
# lease gives one message per key
if [ -z "$IDLE" ]; then
    reset_side idem
    got=$(sql -c "SELECT count(*), count(DISTINCT key), bool_and(key LIKE 'k%') FROM idem_outbox_lease('check', 100)")
    [ "$got" = "100|100|t" ] || die "idem's lease did not give 100 live keys: $got"
    states=backlog
    unit=message
    units=msgs
    echo "== backlog: $MESSAGES messages over $KEYS keys, and $DEAD dead keys with $PER_DEAD messages each"
else
    states=$IDLE
    unit=round
    units=rounds
    echo "== idle keys: $IDLE; $LIVE keys with $PER_LIVE pending messages each at the start of each run"
fi

declare -A rate cpu
record() { rate["$1,$2,$3"]="${rate["$1,$2,$3"]:-} $4"; cpu["$1,$2,$3"]="${cpu["$1,$2,$3"]:-} $5"; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR==0) print 0; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

echo "== $(nproc) CPUs, $(sql -c 'SHOW server_version'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== $REPEAT x $DURATION s per configuration, relays: $CLIENTS, batches of 100, synchronous_commit = $SYNC_COMMIT"
for rep in $(seq 1 "$REPEAT"); do
    for n in $states; do
        for c in $CLIENTS; do
            if [ $((rep % 2)) = 1 ]; then order="idem hand"; else order="hand idem"; fi
            for side in $order; do
                read -r r u <<<"$(run_side "$side" "$n" "$c")"
                record "$side" "$n" "$c" "$r" "$u"
                echo "   round $rep, ${IDLE:+$n idle keys, }$c relay(s), $side: $r $units/s, $u us CPU/$unit"
            done
        done
    done
done

echo
echo "|${IDLE:+ idle keys |} relays | idem $units/s | hand $units/s | ratio | idem CPU us/$unit | hand CPU us/$unit | CPU ratio (hand/idem) |"
echo "|${IDLE:+---|}---|---|---|---|---|---|---|"
for n in $states; do
    for c in $CLIENTS; do
        ri=$(echo "${rate["idem,$n,$c"]}" | median); rh=$(echo "${rate["hand,$n,$c"]}" | median)
        ci=$(echo "${cpu["idem,$n,$c"]}" | median); ch=$(echo "${cpu["hand,$n,$c"]}" | median)
        echo "|${IDLE:+ $n |} $c | $ri | $rh | $(awk -v a="$ri" -v b="$rh" 'BEGIN { printf "%.2fx", (b > 0) ? a / b : 0 }') | $ci | $ch | $(awk -v a="$ci" -v b="$ch" 'BEGIN { printf "%.2fx", (a > 0) ? b / a : 0 }') |"
    done
done
