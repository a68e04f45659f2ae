#!/usr/bin/env bash
# Claims per second and server CPU per claim on Citus (one coordinator and
# two workers on this machine, idem's tables distributed) against one server
# without Citus; and, on one server without Citus, this tree against a
# commit without the Citus detection (BENCH_BASE), to show that the check
# costs the single-server path nothing.  Rounds alternate, so that other
# load on the machine affects both sides alike.  Run as root on Debian 12,
# with Citus installed in the system's PostgreSQL (scripts/test.sh citus
# builds it):
#
#   bash bench/citus/run.sh
#
#   BENCH_SECONDS  duration of each pgbench run, default 10
#   BENCH_ROUNDS   rounds of each comparison, the median reported, default 5
#   BENCH_CLIENTS  pgbench clients, default 4
#   BENCH_BASE     the commit compared with the tree, default the merge base
#                  with main
#
# All servers listen on Unix sockets in /tmp/idem-bench-citus only (ports
# 15701 to 15705 name the sockets).  The runner reports; it does not judge.
set -u -o pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/scripts/common.sh"
need_root

SECS=${BENCH_SECONDS:-10}
ROUNDS=${BENCH_ROUNDS:-5}
CLIENTS=${BENCH_CLIENTS:-4}
BASE=${BENCH_BASE:-$(git -C "$here" merge-base HEAD main 2>/dev/null || echo HEAD~1)}
DIR=/tmp/idem-bench-citus
SCRIPT=$here/bench/claim/idem_new.sql

[ -f "$(/usr/lib/postgresql/$PG_MAJOR/bin/pg_config --pkglibdir)/citus.so" ] ||
    die "Citus is not installed: run scripts/test.sh citus (with CITUS_SOURCE) first"
for d in c w1 w2 one base; do stop_cluster "$DIR/$d"; done
rm -rf "$DIR"; mkdir -p "$DIR"

# the tree and the base commit, each in its own private installation
tree=$(copy_tree "$here")
build_and_install "$tree" >/dev/null
TREE_BIN=$PG_BIN
base=$(mktemp -d /tmp/idem.XXXXXX)
git -C "$here" archive "$BASE" | tar -x -C "$base"
chown -R postgres:postgres "$base"
build_and_install "$base" >/dev/null
BASE_BIN=$PG_BIN

as_pg() { runuser -u postgres -- env PATH="$1:$PATH" "${@:2}"; }
psql_at() { as_pg "$1" psql -h "$2" -p "$3" -d postgres -X -At -v ON_ERROR_STOP=1 -c "$4"; }

start() {   # start BIN DIR PORT SETTINGS...
    local bin=$1 dir=$2 port=$3; shift 3
    PATH="$bin:$PATH" start_cluster "$dir" "$port" "$@" \
        "shared_buffers = '256MB'" "synchronous_commit = off" "max_connections = 50"
}
CITUS=("shared_preload_libraries = 'citus'" "max_prepared_transactions = 50"
       "citus.node_conninfo = 'sslmode=disable'" "citus.shard_count = 8")
start "$TREE_BIN" "$DIR/c" 15701 "${CITUS[@]}" "citus.local_hostname = '$DIR/c'"
start "$TREE_BIN" "$DIR/w1" 15702 "${CITUS[@]}" "citus.local_hostname = '$DIR/w1'"
start "$TREE_BIN" "$DIR/w2" 15703 "${CITUS[@]}" "citus.local_hostname = '$DIR/w2'"
start "$TREE_BIN" "$DIR/one" 15704
start "$BASE_BIN" "$DIR/base" 15705
for n in c:15701 w1:15702 w2:15703; do psql_at "$TREE_BIN" "$DIR/${n%%:*}" "${n##*:}" "CREATE EXTENSION citus" >/dev/null; done
psql_at "$TREE_BIN" "$DIR/c" 15701 "SELECT citus_set_coordinator_host('$DIR/c', 15701)" >/dev/null
psql_at "$TREE_BIN" "$DIR/c" 15701 "SELECT citus_add_node('$DIR/w1', 15702)" >/dev/null
psql_at "$TREE_BIN" "$DIR/c" 15701 "SELECT citus_add_node('$DIR/w2', 15703)" >/dev/null
psql_at "$TREE_BIN" "$DIR/c" 15701 "CREATE EXTENSION idem; SELECT count(*) FROM idem_distribute()" >/dev/null
psql_at "$TREE_BIN" "$DIR/one" 15704 "CREATE EXTENSION idem" >/dev/null
psql_at "$BASE_BIN" "$DIR/base" 15705 "CREATE EXTENSION idem" >/dev/null

# run BIN DIR PORT: claims per second, and server CPU per claim (us) summed
# over the nodes given in CPU_DIRS
run() {
    local bin=$1 dir=$2 port=$3 out tps cpu0=0 cpu1=0 d n
    for d in ${CPU_DIRS:-$dir}; do cpu0=$((cpu0 + $(server_cpu_us "$d"))); done
    out=$(as_pg "$bin" pgbench -h "$dir" -p "$port" -n -M prepared -T "$SECS" -c "$CLIENTS" -j "$CLIENTS" \
        -f "$SCRIPT" postgres 2>&1) || { echo "$out" >&2; die "pgbench failed on $dir"; }
    wait_backends_gone "$dir" "$port" postgres
    n=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | tail -n 1)
    for d in ${CPU_DIRS:-$dir}; do cpu1=$((cpu1 + $(server_cpu_us "$d"))); done
    echo "$tps $(( (cpu1 - cpu0) / (n > 0 ? n : 1) ))"
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

declare -a c_tps c_cpu o_tps o_cpu b_tps b_cpu
for r in $(seq 1 "$ROUNDS"); do
    read -r x y < <(CPU_DIRS="$DIR/c $DIR/w1 $DIR/w2" run "$TREE_BIN" "$DIR/c" 15701); c_tps+=("$x"); c_cpu+=("$y")
    read -r x y < <(run "$TREE_BIN" "$DIR/one" 15704); o_tps+=("$x"); o_cpu+=("$y")
    read -r x y < <(run "$BASE_BIN" "$DIR/base" 15705); b_tps+=("$x"); b_cpu+=("$y")
    echo "round $r: citus ${c_tps[-1]}/s ${c_cpu[-1]} us, one server ${o_tps[-1]}/s ${o_cpu[-1]} us," \
         "base ${b_tps[-1]}/s ${b_cpu[-1]} us" >&2
done

m() { printf '%s\n' "$@" | median; }
echo
echo "One new claim per transaction (bench/claim/idem_new.sql), pgbench -M prepared, $CLIENTS clients," \
     "$SECS s, median of $ROUNDS alternating rounds; CPU: the servers' backends, all nodes summed."
echo
echo "| setup | claims/s | server CPU per claim (us) |"
echo "|---|---|---|"
echo "| Citus: coordinator + 2 workers, idem distributed | $(m "${c_tps[@]}") | $(m "${c_cpu[@]}") |"
echo "| one server, Citus absent (this tree) | $(m "${o_tps[@]}") | $(m "${o_cpu[@]}") |"
echo
echo "| single server, Citus absent | claims/s | server CPU per claim (us) |"
echo "|---|---|---|"
echo "| $(git -C "$here" rev-parse --short "$BASE") (no detection) | $(m "${b_tps[@]}") | $(m "${b_cpu[@]}") |"
echo "| this tree (detection) | $(m "${o_tps[@]}") | $(m "${o_cpu[@]}") |"

for d in c w1 w2 one base; do stop_cluster "$DIR/$d"; done
rm -rf "$DIR" "$tree" "$base"
