#!/usr/bin/env bash
# What the statistics cost: idem_claim of new ids (by a loop in one backend,
# and by pgbench -M prepared) on two servers of the same build and settings
# running side by side, one with idem in shared_preload_libraries (every
# claim counted in shared memory at commit), the other without (nothing
# counted).
#
# Made for a small machine that others share, in two parts:
#
#  1. One backend on each server runs a loop of CHUNK claims, a COMMIT
#     after each (so every claim is counted at its own commit), and reports
#     its own CPU time (/proc/self/stat) and duration; the two servers take
#     turns call after call, PAIRS pairs.  The backend's CPU time leaves out
#     the time it waits for a CPU that others hold, and there is no client
#     or network in it: this is the figure that load from elsewhere moves
#     least.  Reported: CPU per claim over all calls and its ratio, and the
#     median of the per-pair ratios of time and CPU.
#  2. pgbench: the two servers stay up, so that a round is only two short
#     runs, one on each, back to back (the one that goes first changing
#     every round).  Each round gives a ratio preloaded / not preloaded of
#     the TPS and of the server CPU per claim (user + system time of the
#     exited backends, from the postmaster's cutime and cstime); the table
#     shows the medians of those ratios beside the medians of the figures.
#     Before every run the server's idem.claims is truncated and a
#     CHECKPOINT taken, so that both runs start alike.
#
# Target: counters cost at most 3%, a TPS ratio of at least 0.97 and a CPU
# ratio of at most 1.03.
#
# With PIN=1 the servers run on the last CPU and pgbench on the first (off
# by default: on a shared machine it ties the server to a CPU that someone
# else may be using).
#
#   bash bench/stats/run.sh
#   DURATION=5 REPEAT=11 CLIENTS="1 8" PAIRS=200 CHUNK=2000 bash bench/stats/run.sh
#
# Runs as root on Debian 12: it builds idem into a private copy of
# PostgreSQL and starts two throwaway servers on Unix sockets (PORT and
# PORT + 1, 5653 and 5654 by default).
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/scripts/common.sh"
need_root

PORT=${PORT:-5653}
DURATION=${DURATION:-3}
REPEAT=${REPEAT:-7}
CLIENTS=${CLIENTS:-"1 8"}
SYNC_COMMIT=${SYNC_COMMIT:-off}
PIN=${PIN:-0}
PAIRS=${PAIRS:-100}
CHUNK=${CHUNK:-2000}
NCPU=$(nproc)
pin_client=()
[ "$PIN" = 1 ] && pin_client=(taskset -c 0)

install_packages
work=$(copy_tree "$here")
dir=$(mktemp -d /tmp/idem-bench-stats.XXXXXX)
chmod 755 "$dir"
cleanup() { stop_cluster "$dir/preload"; stop_cluster "$dir/plain"; rm -rf "$dir" "$work"; }
trap cleanup EXIT

echo "== building in $work"
build_and_install "$work" >/dev/null

as_pg() { runuser -u postgres -- env PATH="$PATH" "$@"; }
declare -A port=([preload]=$PORT [plain]=$((PORT + 1)))
sql() { local m=$1; shift; as_pg psql -h "$dir/$m" -p "${port[$m]}" -X -q -At -v ON_ERROR_STOP=1 -d bench "$@"; }

# start MODE: the server with (preload) or without (plain) idem preloaded
start() {
    local m=$1 extra=()
    # idem's settings only exist when it is preloaded
    [ "$m" = preload ] && extra=("shared_preload_libraries = 'idem'" "idem.maintenance = off")
    start_cluster "$dir/$m" "${port[$m]}" \
        "shared_buffers = '256MB'" \
        "synchronous_commit = $SYNC_COMMIT" \
        "max_wal_size = '4GB'" \
        "checkpoint_timeout = '1h'" \
        "autovacuum = off" \
        "jit = off" \
        "${extra[@]}" >/dev/null
    if [ "$PIN" = 1 ]; then
        # the postmaster and the processes it has started; backends started
        # later inherit the postmaster's CPU set
        local pm p
        pm=$(head -n 1 "$dir/$m/data/postmaster.pid")
        for p in "$pm" $(pgrep -P "$pm"); do
            taskset -a -p -c "$((NCPU - 1))" "$p" >/dev/null || die "taskset of $p failed"
        done
    fi
    as_pg createdb -h "$dir/$m" -p "${port[$m]}" bench || die "createdb failed"
    sql "$m" -c "CREATE EXTENSION idem" >/dev/null || die "CREATE EXTENSION failed"
}
start preload
start plain
[ "$(sql preload -c "SELECT count(*) FROM pg_settings WHERE name = 'idem.max_namespaces'")" = 1 ] ||
    die "idem is not preloaded"
[ "$(sql plain -c "SELECT count(*) FROM pg_settings WHERE name = 'idem.max_namespaces'")" = 0 ] ||
    die "idem is preloaded on the plain server"

script="$dir/claim.sql"
cat > "$script" <<'EOF2'
\set r random(1000000000000000000, 9200000000000000000)
SELECT idem_claim('m' || :r, 'bench');
EOF2
chmod 644 "$script"

# run MODE CLIENTS: prints "tps cpu-us-per-claim"
run() {
    local m=$1 c=$2 threads out t0 t1 tps n
    threads=$(( c < 2 ? c : 2 ))
    sql "$m" -c "TRUNCATE idem.claims" -c "CHECKPOINT" >/dev/null
    t0=$(server_cpu_us "$dir/$m")
    out=$("${pin_client[@]}" runuser -u postgres -- env PATH="$PATH" pgbench -h "$dir/$m" -p "${port[$m]}" \
        -n -M prepared -c "$c" -j "$threads" -T "$DURATION" -f "$script" bench 2>&1) ||
        { echo "$out" >&2; die "pgbench failed"; }
    wait_backends_gone "$dir/$m" "${port[$m]}" bench
    t1=$(server_cpu_us "$dir/$m")
    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    n=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
    echo "$tps $(awk -v d=$((t1 - t0)) -v n="$n" 'BEGIN { printf "%.2f", (n > 0) ? d / n : 0 }')"
}

declare -A tps cpu rtps rcpu
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR==0) print 0; else if (NR%2) print a[(NR+1)/2]; else printf "%.3f\n", (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b > 0) ? a / b : 0 }'; }

echo "== $NCPU CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)), PostgreSQL $(pg_config --version | cut -d' ' -f2), $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== $REPEAT rounds of $DURATION s per mode, clients: $CLIENTS, synchronous_commit = $SYNC_COMMIT, PIN=$PIN"
for rep in $(seq 1 "$REPEAT"); do
    if [ $((rep % 2)) = 1 ]; then order="preload plain"; else order="plain preload"; fi
    for c in $CLIENTS; do
        declare -A t=() u=()
        for m in $order; do
            read -r t[$m] u[$m] <<<"$(run "$m" "$c")"
            tps["$m,$c"]="${tps["$m,$c"]:-} ${t[$m]}"
            cpu["$m,$c"]="${cpu["$m,$c"]:-} ${u[$m]}"
        done
        rt=$(ratio "${t[preload]}" "${t[plain]}"); ru=$(ratio "${u[preload]}" "${u[plain]}")
        rtps[$c]="${rtps[$c]:-} $rt"; rcpu[$c]="${rcpu[$c]:-} $ru"
        echo "   round $rep, $c client(s): preload ${t[preload]} tps ${u[preload]} us/claim," \
            "plain ${t[plain]} tps ${u[plain]} us/claim, ratios $rt $ru"
    done
done
# The same claims run by a loop in one backend, COMMIT after each (every
# claim counted at its commit), CHUNK claims per call, the two servers
# taking turns call after call (the first changing every pair): a call
# lasts a fraction of a second, so that both calls of a pair see nearly the
# same load.  Each call reports its own duration and its backend's CPU time
# (/proc/self/stat, read through pg_read_file); the ratios are taken per
# pair and their median reported.  No client, no network: the difference is
# the server's alone.
loop_sql="DO \$\$
DECLARE
    s0 text; s1 text; t0 timestamptz; t1 timestamptz;
BEGIN
    s0 := pg_read_file('/proc/self/stat');
    t0 := clock_timestamp();
    FOR i IN 1..$CHUNK LOOP
        PERFORM idem_claim('m' || (1000000000000000000 + floor(random() * 8.2e18))::int8, 'bench');
        COMMIT;
    END LOOP;
    t1 := clock_timestamp();
    s1 := pg_read_file('/proc/self/stat');
    RAISE NOTICE 'loop % %', extract(epoch FROM t1 - t0),
        (split_part(split_part(s1, ') ', 2), ' ', 12)::int8 + split_part(split_part(s1, ') ', 2), ' ', 13)::int8)
      - (split_part(split_part(s0, ') ', 2), ' ', 12)::int8 + split_part(split_part(s0, ') ', 2), ' ', 13)::int8);
END;
\$\$;"
hz=$(getconf CLK_TCK)
declare -A lt lc
lrt= lrc=
for m in preload plain; do sql "$m" -c "TRUNCATE idem.claims" -c "CHECKPOINT" >/dev/null; done
for rep in $(seq 1 "$PAIRS"); do
    if [ $((rep % 2)) = 1 ]; then order="preload plain"; else order="plain preload"; fi
    declare -A w=() k=()
    for m in $order; do
        read -r w[$m] k[$m] <<<"$(sql "$m" -c "$loop_sql" 2>&1 | sed -n 's/.*NOTICE:  loop //p')"
        [ -n "${w[$m]}" ] || die "the loop failed on $m"
        lt[$m]="${lt[$m]:-} $(awk -v w="${w[$m]}" 'BEGIN { printf "%.2f", w / '"$CHUNK"' * 1e6 }')"
        lc[$m]="${lc[$m]:-} ${k[$m]}"
    done
    lrt="$lrt $(ratio "${w[preload]}" "${w[plain]}")"
    [ "${k[plain]}" -gt 0 ] && lrc="$lrc $(ratio "${k[preload]}" "${k[plain]}")"
done
sum() { tr ' ' '\n' | awk '{ s += $1 } END { print s + 0 }'; }
got=$(sql preload -c "SELECT sum((counters->>'claimed')::int8) FROM idem_stats WHERE ns = 'bench' AND kind = 'claim'")
[ -n "$got" ] && [ "$got" -gt 0 ] || die "the claims were not counted"
echo "== load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"

echo
echo "One backend, a loop of $CHUNK claims per call, $PAIRS pairs of calls:"
echo
echo "| | time us/claim (median) | CPU us/claim (all calls) |"
echo "|---|---|---|"
for m in preload plain; do
    echo "| $m | $(echo "${lt[$m]}" | median) | $(awk -v t="$(echo "${lc[$m]}" | sum)" -v n=$((PAIRS * CHUNK)) -v hz="$hz" 'BEGIN { printf "%.2f", t / hz * 1e6 / n }') |"
done
echo "| ratio | $(echo "$lrt" | median) (median of pairs) | $(ratio "$(echo "${lc[preload]}" | sum)" "$(echo "${lc[plain]}" | sum)") (sums), $(echo "$lrc" | median) (median of pairs) |"
echo
echo "pgbench, $REPEAT rounds of $DURATION s per mode:"
echo
echo "| clients | TPS preloaded | TPS not preloaded | TPS ratio (median of rounds) | CPU us/claim preloaded | CPU us/claim not preloaded | CPU ratio (median of rounds) |"
echo "|---|---|---|---|---|---|---|"
for c in $CLIENTS; do
    tp=$(echo "${tps["preload,$c"]:-}" | median); tn=$(echo "${tps["plain,$c"]:-}" | median)
    cp=$(echo "${cpu["preload,$c"]:-}" | median); cn=$(echo "${cpu["plain,$c"]:-}" | median)
    echo "| $c | $tp | $tn | $(echo "${rtps[$c]:-}" | median) | $cp | $cn | $(echo "${rcpu[$c]:-}" | median) |"
done
