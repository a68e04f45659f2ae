#!/usr/bin/env bash
# What the statistics cost: idem_claim of new ids with pgbench -M prepared,
# on one server started alternately with idem in shared_preload_libraries
# (every claim counted in shared memory at commit) and without (nothing
# counted).  Every configuration runs REPEAT times, the two modes
# alternating and the one that goes first changing each round; the table
# shows the median TPS and server CPU per claim, and their ratios (target:
# counters cost at most 3%, a ratio of at least 0.97 for TPS and at most
# 1.03 for CPU).
#
#   bash bench/stats/run.sh
#   DURATION=20 REPEAT=5 CLIENTS="1 8" bash bench/stats/run.sh
#
# Runs as root on Debian 12: it builds idem into a private copy of
# PostgreSQL and starts a throwaway server on a Unix socket (PORT, 5653).
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/scripts/common.sh"
need_root

PORT=${PORT:-5653}
DURATION=${DURATION:-10}
REPEAT=${REPEAT:-3}
CLIENTS=${CLIENTS:-"1 8"}
SYNC_COMMIT=${SYNC_COMMIT:-off}

install_packages
work=$(copy_tree "$here")
dir=$(mktemp -d /tmp/idem-bench-stats.XXXXXX)
chmod 755 "$dir"
cleanup() { stop_cluster "$dir/cluster"; rm -rf "$dir" "$work"; }
trap cleanup EXIT

echo "== building in $work"
build_and_install "$work"

as_pg() { runuser -u postgres -- env PATH="$PATH" "$@"; }
sql() { as_pg psql -h "$dir/cluster" -p "$PORT" -X -q -At -v ON_ERROR_STOP=1 -d bench "$@"; }

# start MODE: the server with (preload) or without (plain) idem preloaded
start() {
    local preload="" worker=""
    # idem's settings only exist when it is preloaded
    [ "$1" = preload ] && preload="shared_preload_libraries = 'idem'" && worker="idem.maintenance = off"
    stop_cluster "$dir/cluster"
    rm -rf "$dir/cluster"
    start_cluster "$dir/cluster" "$PORT" \
        "shared_buffers = '1GB'" \
        "synchronous_commit = $SYNC_COMMIT" \
        "max_wal_size = '8GB'" \
        "checkpoint_timeout = '1h'" \
        "autovacuum = off" \
        "jit = off" \
        ${preload:+"$preload"} ${worker:+"$worker"} >/dev/null
    as_pg createdb -h "$dir/cluster" -p "$PORT" bench || die "createdb failed"
    sql -c "CREATE EXTENSION idem" >/dev/null || die "CREATE EXTENSION failed"
}

script="$dir/claim.sql"
cat > "$script" <<'EOF2'
\set r random(1000000000000000000, 9200000000000000000)
SELECT idem_claim('m' || :r, 'bench');
EOF2
chmod 644 "$script"

# run CLIENTS: prints "tps cpu-us-per-claim"
run() {
    local c=$1 threads out t0 t1 tps n
    threads=$(( c < 2 ? c : 2 ))
    sql -c "CHECKPOINT" >/dev/null
    t0=$(server_cpu_us "$dir/cluster")
    out=$(as_pg pgbench -h "$dir/cluster" -p "$PORT" -n -M prepared -c "$c" -j "$threads" \
        -T "$DURATION" -f "$script" bench 2>&1) || { echo "$out" >&2; die "pgbench failed"; }
    wait_backends_gone "$dir/cluster" "$PORT" bench
    t1=$(server_cpu_us "$dir/cluster")
    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    n=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
    echo "$tps $(awk -v d=$((t1 - t0)) -v n="$n" 'BEGIN { printf "%.2f", (n > 0) ? d / n : 0 }')"
}

declare -A tps cpu
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR==0) print 0; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

echo "== $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== $REPEAT x $DURATION s per configuration, clients: $CLIENTS, synchronous_commit = $SYNC_COMMIT"
for rep in $(seq 1 "$REPEAT"); do
    if [ $((rep % 2)) = 1 ]; then order="preload plain"; else order="plain preload"; fi
    for mode in $order; do
        start "$mode"
        if [ "$mode" = preload ]; then
            [ "$(sql -c "SELECT count(*) FROM pg_settings WHERE name = 'idem.max_namespaces'")" = 1 ] ||
                die "idem is not preloaded"
        fi
        for c in $CLIENTS; do
            read -r t u <<<"$(run "$c")"
            tps["$mode,$c"]="${tps["$mode,$c"]:-} $t"
            cpu["$mode,$c"]="${cpu["$mode,$c"]:-} $u"
            echo "   round $rep, $mode, $c client(s): $t tps, $u us CPU/claim"
        done
        if [ "$mode" = preload ]; then
            got=$(sql -c "SELECT counters->>'claimed' FROM idem_stats WHERE ns = 'bench' AND kind = 'claim'")
            [ -n "$got" ] && [ "$got" -gt 0 ] || die "the claims were not counted"
        fi
    done
done

echo
echo "| clients | TPS preloaded | TPS not preloaded | TPS ratio | CPU us/claim preloaded | CPU us/claim not preloaded | CPU ratio |"
echo "|---|---|---|---|---|---|---|"
for c in $CLIENTS; do
    tp=$(echo "${tps["preload,$c"]}" | median); tn=$(echo "${tps["plain,$c"]}" | median)
    cp=$(echo "${cpu["preload,$c"]}" | median); cn=$(echo "${cpu["plain,$c"]}" | median)
    echo "| $c | $tp | $tn | $(awk -v a="$tp" -v b="$tn" 'BEGIN { printf "%.3f", (b > 0) ? a / b : 0 }') | $cp | $cn | $(awk -v a="$cp" -v b="$cn" 'BEGIN { printf "%.3f", (b > 0) ? a / b : 0 }') |"
done
