#!/usr/bin/env bash
# The outbox's lease among idle keys: a relay's poll when most keys (the ids
# of orders or accounts, say) have had messages and have none now, and a few
# have some.  Each pgbench transaction is one relay round, as in backlog.sh:
# lease up to 100 messages, at most one per key, each the oldest of its key,
# then acknowledge them; by hand, the ordered flow with a key table.
#
# Both sides start each run from the same state: IDLE keys whose messages
# were all delivered, and LIVE keys with PER_LIVE pending messages each.  The
# backlog is soon delivered, and most rounds find nothing: the table shows
# the median rounds per second and server CPU per round, with ratios, for
# each number of idle keys.
#
#   bash bench/outbox/idle.sh
#   IDLE="10000 100000 1000000" DURATION=5 REPEAT=3 CLIENTS="1 4" bash bench/outbox/idle.sh
#
# Runs as root on Debian 12: it builds idem into a private copy of
# PostgreSQL and starts a throwaway server on a Unix socket (PORT, 5653).
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/scripts/common.sh"
need_root

PORT=${PORT:-5653}
IDLE=${IDLE:-"10000 100000"}
LIVE=${LIVE:-100}
PER_LIVE=${PER_LIVE:-10}
DURATION=${DURATION:-5}
REPEAT=${REPEAT:-3}
CLIENTS=${CLIENTS:-"1 4"}
SYNC_COMMIT=${SYNC_COMMIT:-off}

install_packages
work=$(copy_tree "$here")
dir=$(mktemp -d /tmp/idem-bench-idle.XXXXXX)
chmod 755 "$dir"
scripts=$dir/scripts
mkdir "$scripts"
cleanup() { stop_cluster "$dir/cluster"; rm -rf "$dir" "$work"; }
trap cleanup EXIT

echo "== building in $work"
build_and_install "$work"
start_cluster "$dir/cluster" "$PORT" \
    "shared_buffers = '1GB'" \
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

cat > "$scripts/idem.sql" <<'EOF2'
SELECT coalesce(array_agg(id), '{}') AS ids FROM idem_outbox_lease('relay-' || :client_id, 100, '1 minute') \gset
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
chmod 755 "$scripts"
chmod 644 "$scripts"/*.sql

payload="'{\"key\": \"k0001\", \"event\": \"order.updated\", \"body\": \"' || repeat('x', 150) || '\"}'"
# reset_side SIDE IDLE: the same state on both sides; idem's rows are written
# as idem_outbox_send and idem_outbox_ack leave them
reset_side() {
    local n=$2
    if [ "$1" = idem ]; then
        sql <<SQL >/dev/null || die "reset of idem failed"
TRUNCATE idem.outbox, idem.outbox_keys;
INSERT INTO idem.outbox_keys (topic, key, dead, attempts, available_at)
    SELECT 'events', 'i' || g, false, 0, now() - interval '1 day' FROM generate_series(1, $n) g;
INSERT INTO idem.outbox (id, aggregatetype, aggregateid, type, payload, headers, seq, created_at, key_hash)
    SELECT gen_random_uuid(), 'events', k, NULL, ($payload)::jsonb, NULL, g, now(), idem._outbox_key_hash('events', k)
      FROM (SELECT g, 'k' || (g % $LIVE) AS k FROM generate_series(1, $LIVE * $PER_LIVE) g) m;
INSERT INTO idem.outbox_keys (topic, key, dead, attempts, available_at)
    SELECT DISTINCT aggregatetype, aggregateid, false, 0, now() FROM idem.outbox;
VACUUM (FREEZE, ANALYZE) idem.outbox, idem.outbox_keys;
CHECKPOINT;
SQL
    else
        sql <<SQL >/dev/null || die "reset of hand failed"
TRUNCATE hand.outbox, hand.keys;
INSERT INTO hand.keys SELECT 'i' || g FROM generate_series(1, $n) g;
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

# run_side SIDE IDLE CLIENTS: prints "rounds/s cpu-us-per-round"
run_side() {
    local side=$1 n=$2 c=$3 threads out t0 t1 tx
    threads=$(( c < 2 ? c : 2 ))
    reset_side "$side" "$n"
    t0=$(server_cpu_us "$dir/cluster")
    out=$(as_pg pgbench -h "$dir/cluster" -p "$PORT" -n -M prepared -c "$c" -j "$threads" \
        -T "$DURATION" -f "$scripts/$side.sql" bench 2>&1) || { echo "$out" >&2; die "pgbench failed"; }
    wait_backends_gone "$dir/cluster" "$PORT" bench
    t1=$(server_cpu_us "$dir/cluster")
    [ "$(pending "$side")" = 0 ] || die "$side left messages undelivered"
    tx=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
    echo "$(awk -v m="$tx" -v s="$DURATION" 'BEGIN { printf "%.0f", m / s }') $(awk -v d=$((t1 - t0)) -v n="$tx" 'BEGIN { printf "%.1f", (n > 0) ? d / n : 0 }')"
}

declare -A rate cpu
record() { rate["$1,$2,$3"]="${rate["$1,$2,$3"]:-} $4"; cpu["$1,$2,$3"]="${cpu["$1,$2,$3"]:-} $5"; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR==0) print 0; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

echo "== $(nproc) CPUs, $(sql -c 'SHOW server_version'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== idle keys: $IDLE; $LIVE keys with $PER_LIVE pending messages each at the start of each run"
echo "== $REPEAT x $DURATION s per configuration, relays: $CLIENTS, batches of 100, synchronous_commit = $SYNC_COMMIT"
for rep in $(seq 1 "$REPEAT"); do
    for n in $IDLE; do
        for c in $CLIENTS; do
            if [ $((rep % 2)) = 1 ]; then order="idem hand"; else order="hand idem"; fi
            for side in $order; do
                read -r r u <<<"$(run_side "$side" "$n" "$c")"
                record "$side" "$n" "$c" "$r" "$u"
                echo "   round $rep, $n idle keys, $c relay(s), $side: $r rounds/s, $u us CPU/round"
            done
        done
    done
done

echo
echo "| idle keys | relays | idem rounds/s | hand rounds/s | ratio | idem CPU us/round | hand CPU us/round | CPU ratio (hand/idem) |"
echo "|---|---|---|---|---|---|---|---|"
for n in $IDLE; do
    for c in $CLIENTS; do
        ri=$(echo "${rate["idem,$n,$c"]}" | median); rh=$(echo "${rate["hand,$n,$c"]}" | median)
        ci=$(echo "${cpu["idem,$n,$c"]}" | median); ch=$(echo "${cpu["hand,$n,$c"]}" | median)
        echo "| $n | $c | $ri | $rh | $(awk -v a="$ri" -v b="$rh" 'BEGIN { printf "%.2fx", (b > 0) ? a / b : 0 }') | $ci | $ch | $(awk -v a="$ci" -v b="$ch" 'BEGIN { printf "%.2fx", (a > 0) ? b / a : 0 }') |"
    done
done
