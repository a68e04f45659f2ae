#!/usr/bin/env bash
# One transaction that works in many namespaces against one that works in
# one, the same number of calls: a transaction's pending statistics (one
# entry per namespace) and the topics an outbox sender remembers are found
# through hash tables once they are many, so both should take about as long.
# Before, each call searched a list of them and such a transaction took time
# growing with the square of their number.  Also the time a cancel takes to
# stop idem_request_fingerprint of a large payload.
#
#   bash bench/stats/many_namespaces.sh              # N=80000 REPEAT=3
#
# Medians of REPEAT rounds that alternate the order of the two.  Runs as
# root on Debian 12: builds idem into a private copy of PostgreSQL and starts
# a throwaway server (idem preloaded) on a Unix socket.
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/scripts/common.sh"
need_root

N=${N:-80000}
REPEAT=${REPEAT:-3}
PORT=${PORT:-5657}

install_packages
work=$(copy_tree "$here")
dir=$(mktemp -d /tmp/idem-bench-ns.XXXXXX)
chmod 755 "$dir"
cleanup() { stop_cluster "$dir/c"; rm -rf "$dir" "$work"; }
trap cleanup EXIT

echo "== building in $work"
build_and_install "$work" >/dev/null
start_cluster "$dir/c" "$PORT" "shared_buffers = '256MB'" "synchronous_commit = off" \
    "shared_preload_libraries = 'idem'" "idem.maintenance = off" "jit = off" >/dev/null
as_pg() { runuser -u postgres -- env PATH="$PATH" "$@"; }
as_pg createdb -h "$dir/c" -p "$PORT" bench
sql() { as_pg psql -h "$dir/c" -p "$PORT" -X -q -At -v ON_ERROR_STOP=1 -d bench "$@"; }
sql -c "CREATE EXTENSION idem" -c "CREATE FUNCTION elapsed(q text) RETURNS float8 LANGUAGE plpgsql AS \$\$
DECLARE t timestamptz := clock_timestamp();
BEGIN EXECUTE q; RETURN extract(epoch FROM clock_timestamp() - t); END \$\$"

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
# timed Q: seconds of Q in a transaction rolled back
timed() { sql -c "BEGIN" -c "SELECT elapsed(\$q\$$1\$q\$)" -c "ROLLBACK"; }

echo "== $(nproc) CPUs, PostgreSQL $(pg_config --version | cut -d' ' -f2), $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg), N=$N REPEAT=$REPEAT"
declare -A q t
q[claims_one]="SELECT count(idem_try_claim('m' || g, 'stm')) FROM generate_series(1, $N) g"
q[claims_many]="SELECT count(idem_try_claim('m', 'stm-' || g)) FROM generate_series(1, $N) g"
q[sends_one]="SELECT count(idem_outbox_send('mt', 'k' || g, '{}')) FROM generate_series(1, $N) g"
q[sends_many]="SELECT count(idem_outbox_send('mt-' || g, 'k', '{}')) FROM generate_series(1, $N) g"
for rep in $(seq 1 "$REPEAT"); do
    for what in claims sends; do
        if [ $((rep % 2)) = 1 ]; then order="one many"; else order="many one"; fi
        for o in $order; do
            s=$(timed "${q[${what}_$o]}")
            t[${what}_$o]="${t[${what}_$o]:-} $s"
            echo "   round $rep, $what in $o: $s s"
        done
    done
done

# a cancel during idem_request_fingerprint of a payload of 5M values
sql -c "CREATE TABLE big AS SELECT ('[' || repeat('1.5,', 5000000) || '1]')::jsonb AS v"
read_s= hash_s= cancel_s=
for rep in $(seq 1 "$REPEAT"); do
    read_s="$read_s $(sql -c "SELECT elapsed('SELECT jsonb_typeof(v) FROM big')")"
    hash_s="$hash_s $(sql -c "SELECT elapsed('SELECT idem_request_fingerprint(v) FROM big')")"
done
r=$(echo "$read_s" | median); h=$(echo "$hash_s" | median)
timeout_ms=$(awk -v r="$r" -v h="$h" 'BEGIN { printf "%d", 1000 * (r + (h - r) / 10) + 1 }')
for rep in $(seq 1 "$REPEAT"); do
    t0=$(date +%s.%N)
    sql -c "SET statement_timeout = $timeout_ms" -c "SELECT idem_request_fingerprint(v) FROM big" >/dev/null 2>&1
    cancel_s="$cancel_s $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')"
done

echo
echo "| work in one transaction ($N calls) | one namespace (s) | $N namespaces (s) | ratio |"
echo "|---|---|---|---|"
for what in claims sends; do
    one=$(echo "${t[${what}_one]}" | median); many=$(echo "${t[${what}_many]}" | median)
    echo "| $what | $one | $many | $(awk -v a="$many" -v b="$one" 'BEGIN { printf "%.2f", a / b }') |"
done
echo
echo "idem_request_fingerprint of 5M values: $h s (reading the payload $r s); with statement_timeout = $timeout_ms ms it stopped after $(echo "$cancel_s" | median) s (median)"
