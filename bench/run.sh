#!/usr/bin/env bash
# Benchmarks idem's claims against the hand-written SQL they replace, on one
# throwaway cluster, and prints a markdown table (also written to
# bench/results/latest.md).  Run as root on Debian 12:
#
#   bash bench/run.sh                  full run (about 10 minutes)
#   BENCH_SECONDS=3 bash bench/run.sh  quicker run (about 4 minutes)
#
# Settings (environment):
#   BENCH_SECONDS  duration of each pgbench run, default 10
#   BENCH_ROUNDS   runs of each measurement, the median reported, default 3
#   BENCH_ROWS     ids pre-filled in each table and claimed by one statement,
#                  default 1000000
#   BENCH_REF      a commit to build (e.g. HEAD) instead of the working tree
#
# The runner reports; it does not judge.  A missed target is printed as MISS
# and the exit status stays 0; it is non-zero only when something fails.
set -u -o pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/common.sh"
need_root

SECS=${BENCH_SECONDS:-10}
ROUNDS=${BENCH_ROUNDS:-3}
ROWS=${BENCH_ROWS:-1000000}
BATCH=1000
PORT=5601
DIR=/tmp/idem-bench
DB=bench
CLAIM="$here/bench/claim"
RESULTS="$here/bench/results"

[[ "$SECS" =~ ^[1-9][0-9]*$ ]] || die "BENCH_SECONDS must be a positive integer"
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "BENCH_ROUNDS must be a positive integer"
[[ "$ROWS" =~ ^[1-9][0-9]*$ ]] && [ "$ROWS" -le 8000000 ] ||
    die "BENCH_ROWS must be an integer between 1 and 8000000"

# The pre-filled ids are 'm' followed by 19 digits, spread evenly over
# [1e18, 9e18]; new ids are random over [1e18, 9.2e18], so that they fall
# among the pre-filled ones in the index.
STEP=$((8000000000000000000 / ROWS))

NPROC=$(nproc)
SETTINGS=(
    "shared_buffers = 1GB"
    "synchronous_commit = off"
    "max_wal_size = 4GB"
    "checkpoint_timeout = 30min"
    # Every measured run starts from tables just reset, vacuumed and
    # analyzed: autovacuum would only add noise to one side or the other.
    "autovacuum = off"
    # Compilation time of JIT would be noise in the one-statement runs.
    "jit = off"
    # Loaded once by the postmaster, right after the install: every backend
    # runs the library built here, even if another build is installed in
    # the meantime.
    "shared_preload_libraries = 'idem'"
)

work=
cleanup() {
    stop_cluster "$DIR"
    [ -n "$work" ] && rm -rf "$work"
}
trap cleanup EXIT

install_packages
if [ -n "${BENCH_REF:-}" ]; then
    rev=$(git -C "$here" rev-parse --short --verify "${BENCH_REF}^{commit}") ||
        die "BENCH_REF: no commit $BENCH_REF"
    work=$(mktemp -d /tmp/idem.XXXXXX)
    git -C "$here" archive "$rev" | tar -x -C "$work" || die "git archive $rev failed"
    chown -R postgres:postgres "$work"
else
    work=$(copy_tree "$here")
    rev=$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)
    [ -n "$(git -C "$here" status --porcelain -- . ':!bench/results' 2>/dev/null)" ] &&
        rev="$rev with the uncommitted changes of the working tree"
fi
echo "== building $rev in $work"
build_and_install "$work"

stop_cluster "$DIR"
rm -rf "$DIR"
echo "== starting a cluster in $DIR on port $PORT"
start_cluster "$DIR" "$PORT" "${SETTINGS[@]}"

as_pg() { runuser -u postgres -- env PATH="$PATH" "$@"; }
sql() { as_pg psql -h "$DIR" -p "$PORT" -d "$DB" -X -q -At -v ON_ERROR_STOP=1 "$@"; }

as_pg createdb -h "$DIR" -p "$PORT" "$DB" || die "createdb failed"
sql <<'EOF' || die "setup failed"
CREATE EXTENSION idem;
CREATE SCHEMA bench;
-- The hand-written dedup table: the same columns, collations and primary
-- key as idem's own.
CREATE TABLE bench.dedup (LIKE idem.claims INCLUDING ALL);
EOF

# Every measured run starts from both tables holding the same ROWS claims,
# vacuumed and analyzed.  A run that writes marks its table dirty; the next
# reset_tables rebuilds the dirty ones only.
declare -A DIRTY=([idem.claims]=1 [bench.dedup]=1)
reset_tables() {
    local tab stmts=
    for tab in idem.claims bench.dedup; do
        [ "${DIRTY[$tab]}" = 1 ] || continue
        stmts+="TRUNCATE $tab;
INSERT INTO $tab
    SELECT 'default', 'm' || (1000000000000000000 + g * $STEP::int8), now()
      FROM generate_series(1, $ROWS) g;
VACUUM ANALYZE $tab;
"
    done
    [ -n "$stmts" ] || return 0
    sql <<<"$stmts" >/dev/null || die "reset of the tables failed"
    DIRTY=([idem.claims]=0 [bench.dedup]=0)
}

# wrote SCRIPT: marks the table a pgbench script or a statement writes to
wrote() {
    case "$1" in
        idem_new.sql | idem_batch.sql | batch | perrow) DIRTY[idem.claims]=1 ;;
        sql_new.sql | sql) DIRTY[bench.dedup]=1 ;;
    esac
}

# measure SCRIPT CLIENTS: one pgbench run from the reset tables, its TPS
# left in $tps and the server's CPU time per transaction (microseconds, all
# the run's backends together) in $cpu.
measure() {
    local t0 t1 out ntx
    reset_tables
    t0=$(server_cpu_us "$DIR")
    out=$(pgbench_tps "$1" "$2") || exit 1
    wait_backends_gone "$DIR" "$PORT" "$DB"
    t1=$(server_cpu_us "$DIR")
    read -r tps ntx <<<"$out"
    cpu=$(awk -v d=$((t1 - t0)) -v n="$ntx" 'BEGIN { printf "%.2f", (n > 0) ? d / n : 0 }')
    wrote "$1"
}

checkpoint() { sql -c 'CHECKPOINT' || die "checkpoint failed"; }

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
started=$SECONDS
echo "== filling idem.claims and bench.dedup with $ROWS ids"
t0=$(date +%s.%N)
reset_tables
reset_secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "   ($reset_secs s)"

# What the scripts rely on: a pre-filled id is a duplicate, a new one is not,
# and both sides agree.
check=$(sql <<EOF
BEGIN;
SELECT idem_claim('m' || (1000000000000000000 + $STEP::int8)),
       idem_claim('m' || (1000000000000000000 + $ROWS * $STEP::int8)),
       idem_claim('m1');
WITH i AS (INSERT INTO bench.dedup
           VALUES ('default', 'm' || (1000000000000000000 + $STEP::int8), now()),
                  ('default', 'm1', now())
           ON CONFLICT DO NOTHING RETURNING msg_id)
SELECT string_agg(msg_id, ',') FROM i;
ROLLBACK;
EOF
) || die "sanity check failed"
[ "$check" = $'f|f|t\nm1' ] || die "sanity check: unexpected results: $check"
# the rolled-back rows out of both tables
sql -c 'VACUUM idem.claims, bench.dedup' || die "vacuum failed"

# pgbench_tps SCRIPT CLIENTS: prints the TPS without connection time and
# the number of transactions.
pgbench_tps() {
    local script=$1 clients=$2 jobs out tps failed ntx
    jobs=$(( clients < NPROC ? clients : NPROC ))
    checkpoint
    out=$(as_pg pgbench -h "$DIR" -p "$PORT" -n -M prepared -T "$SECS" \
              -c "$clients" -j "$jobs" -D rows="$ROWS" -D step="$STEP" \
              -D batch="$BATCH" -f "$CLAIM/$script" "$DB" 2>&1) ||
        { echo "$out" >&2; die "pgbench $script failed"; }
    tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' <<<"$out")
    failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' <<<"$out")
    [ -n "$tps" ] || { echo "$out" >&2; die "no TPS in the output of pgbench $script"; }
    [ "${failed:-0}" = 0 ] || { echo "$out" >&2; die "pgbench $script: failed transactions"; }
    ntx=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
    echo "   $script, $clients client(s): $tps TPS" >&2
    echo "$tps $ntx"
}

# timed SQL: runs one statement in its own transaction, prints its seconds
# (client-side, as psql \timing reports it) and checks that the statement
# returns what it should.
timed() {
    local stmt=$1 expect=$2 out ms got
    checkpoint
    out=$(sql -c '\timing on' -c "$stmt") || die "statement failed: $stmt"
    ms=$(sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' <<<"$out" | tail -n 1)
    got=$(grep -v '^Time: ' <<<"$out" | grep -v '^Timing is on' || true)
    [ -n "$ms" ] || die "no timing for: $stmt"
    [ "$got" = "$expect" ] || die "unexpected result '$got' (want '$expect') of: $stmt"
    awk -v ms="$ms" 'BEGIN { printf "%.3f", ms / 1000 }'
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
    if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# num X: rates as integers, seconds with three decimals
num() { awk -v x="$1" 'BEGIN { printf (x >= 100 ? "%.0f" : "%.3f"), x }'; }

ROWS_OUT=()
# row SCENARIO CLIENTS IDEM BASELINE HIGHER|LOWER TARGET
#   HIGHER: ratio idem/baseline must reach TARGET; LOWER: must not exceed it.
row() {
    local scen=$1 clients=$2 idem=$3 base=$4 dir=$5 target=$6 ratio verdict op
    [ "$dir" = HIGHER ] && op=">=" || op="<="
    # judged on the unrounded ratio
    read -r ratio verdict < <(awk -v a="$idem" -v b="$base" -v t="$target" -v op="$op" 'BEGIN {
        r = a / b; ok = (op == ">=") ? (r >= t) : (r <= t)
        printf "%.2f %s\n", r, ok ? "PASS" : "MISS" }')
    idem=$(num "$idem"); base=$(num "$base"); target="$op $target"
    ROWS_OUT+=("| $scen | $clients | $idem | $base | $ratio | $target | $verdict |")
}

CPU_ROWS=()
# cpu_row SCENARIO CLIENTS IDEM_US BASELINE_US: server CPU per unit of work;
# ratio = baseline / idem, so that above 1 means idem does it for less
cpu_row() {
    local r
    r=$(awk -v a="$3" -v b="$4" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "-" }')
    CPU_ROWS+=("| $1 | $2 | $3 | $4 | $r |")
}

DETAILS=()
# detail LABEL VALUES...: the single measurements behind a median
detail() {
    local label=$1 v out=; shift
    for v in "$@"; do out+="${out:+, }$(num "$v")"; done
    DETAILS+=("- $label: $out")
}

# 1. One claim per transaction: idem_claim against INSERT ... ON CONFLICT DO
#    NOTHING, ROUNDS runs of each, alternating, the side that goes first
#    changing from round to round.
echo "== one claim per transaction, pgbench -M prepared, ${SECS} s per run, $ROUNDS rounds"
for c in 1 8; do
    for scen in dup new; do
        A=(); B=(); AC=(); BC=()
        for ((r = 1; r <= ROUNDS; r++)); do
            if ((r % 2)); then
                measure "idem_$scen.sql" "$c"; A+=("$tps"); AC+=("$cpu")
                measure "sql_$scen.sql" "$c"; B+=("$tps"); BC+=("$cpu")
            else
                measure "sql_$scen.sql" "$c"; B+=("$tps"); BC+=("$cpu")
                measure "idem_$scen.sql" "$c"; A+=("$tps"); AC+=("$cpu")
            fi
        done
        [ "$scen" = new ] && what="new ids" || what="duplicate ids"
        row "$what (TPS): idem_claim vs INSERT ON CONFLICT DO NOTHING" "$c" \
            "$(median "${A[@]}")" "$(median "${B[@]}")" HIGHER 1.0
        cpu_row "$what: idem_claim vs INSERT ON CONFLICT DO NOTHING, per transaction" "$c" \
            "$(median "${AC[@]}")" "$(median "${BC[@]}")"
        detail "$what, $c client(s), idem_claim TPS" "${A[@]}"
        detail "$what, $c client(s), INSERT ON CONFLICT DO NOTHING TPS" "${B[@]}"
    done
done

# 2. ROWS new ids in one statement, on tables of ROWS claims, in rounds; the
#    order of the three statements rotates from round to round.
echo "== $ROWS new ids in one statement, $ROUNDS rounds"
declare -A STMT EXPECT
STMT[batch]="SELECT count(*) FILTER (WHERE x) FROM unnest(idem_claim_batch(ARRAY(SELECT 'n'||g FROM generate_series(1,$ROWS) g))) x"
EXPECT[batch]=$ROWS
STMT[perrow]="SELECT count(*) FILTER (WHERE idem_claim('q'||g)) FROM generate_series(1,$ROWS) g"
EXPECT[perrow]=$ROWS
STMT[sql]="INSERT INTO bench.dedup SELECT 'default', 'h'||g, now() FROM generate_series(1,$ROWS) g ON CONFLICT DO NOTHING"
EXPECT[sql]=
declare -A TIMES=([batch]= [perrow]= [sql]=)
order=(batch sql perrow)
for ((r = 1; r <= ROUNDS; r++)); do
    for k in "${order[@]}"; do
        reset_tables
        t=$(timed "${STMT[$k]}" "${EXPECT[$k]}") || exit 1
        wrote "$k"
        echo "   round $r, $k: $t s"
        TIMES[$k]="${TIMES[$k]} $t"
    done
    order=("${order[@]:1}" "${order[0]}")
done
# shellcheck disable=SC2086
{
    sql_med=$(median ${TIMES[sql]})
    row "$ROWS new ids in one statement (s): idem_claim_batch vs INSERT ... SELECT ON CONFLICT DO NOTHING" \
        1 "$(median ${TIMES[batch]})" "$sql_med" LOWER 1.2
    row "$ROWS new ids in one statement (s): idem_claim per row vs INSERT ... SELECT ON CONFLICT DO NOTHING" \
        1 "$(median ${TIMES[perrow]})" "$sql_med" LOWER 1.2
    detail "$ROWS new ids, idem_claim_batch s" ${TIMES[batch]}
    detail "$ROWS new ids, idem_claim per row s" ${TIMES[perrow]}
    detail "$ROWS new ids, INSERT ... SELECT s" ${TIMES[sql]}
}

# 3. Claims per second: idem_claim_batch of BATCH new ids per call against
#    one idem_claim per call, alternating as in 1.
echo "== claims per second, batches of $BATCH against single claims, ${SECS} s per run, $ROUNDS rounds"
for c in 1 8; do
    A=(); B=(); AC=(); BC=()
    for ((r = 1; r <= ROUNDS; r++)); do
        for side in $( ((r % 2)) && echo "batch single" || echo "single batch"); do
            if [ "$side" = batch ]; then
                measure idem_batch.sql "$c"
                A+=("$(awk -v t="$tps" -v n="$BATCH" 'BEGIN { print t * n }')")
                AC+=("$(awk -v u="$cpu" -v n="$BATCH" 'BEGIN { printf "%.2f", u / n }')")
            else
                measure idem_new.sql "$c"; B+=("$tps"); BC+=("$cpu")
            fi
        done
    done
    row "new ids (claims/s): idem_claim_batch of $BATCH vs single idem_claim" "$c" \
        "$(median "${A[@]}")" "$(median "${B[@]}")" HIGHER 5
    cpu_row "new ids: idem_claim_batch of $BATCH vs single idem_claim, per claim" "$c" \
        "$(median "${AC[@]}")" "$(median "${BC[@]}")"
    detail "claims/s, $c client(s), idem_claim_batch of $BATCH" "${A[@]}"
    detail "claims/s, $c client(s), single idem_claim" "${B[@]}"
done

# The report.
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
mem=$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
pgv=$(sql -c 'SHOW server_version')
idemv=$(sql -c "SELECT extversion FROM pg_extension WHERE extname = 'idem'")
settings=$(printf '%s, ' "${SETTINGS[@]}" | sed 's/, $//')

report=$(
    echo "# idem benchmark"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- machine: $NPROC CPUs ($cpu), $mem memory"
    echo "- PostgreSQL $pgv; idem $idemv at $rev"
    echo "- load average (1, 5, 15 min) at the start: $load_start; at the end: $load_end"
    echo "- measured in $(( (SECONDS - started) / 60 )) min $(( (SECONDS - started) % 60 )) s"
    echo "- settings: $settings; fsync on"
    echo "- pgbench -M prepared, ${SECS} s per run, -j min(clients, $NPROC); tables pre-filled with $ROWS ids"
    echo "- baseline: the hand-written INSERT ... ON CONFLICT DO NOTHING into bench.dedup"
    echo "  (LIKE idem.claims INCLUDING ALL), except in the claims/s rows, where it is"
    echo "  one idem_claim per call; ratio = idem / baseline"
    echo
    echo "| scenario | clients | idem | baseline | ratio | target | result |"
    echo "|---|---:|---:|---:|---:|---|---|"
    printf '%s\n' "${ROWS_OUT[@]}"
    echo
    echo "Server CPU time (microseconds, every backend of the run together), median;"
    echo "ratio = baseline / idem, above 1 when idem uses less:"
    echo
    echo "| scenario | clients | idem us | baseline us | ratio |"
    echo "|---|---:|---:|---:|---:|"
    printf '%s\n' "${CPU_ROWS[@]}"
    echo
    echo "Medians of $ROUNDS runs; the runs, in order:"
    echo
    printf '%s\n' "${DETAILS[@]}"
)
mkdir -p "$RESULTS"
echo "$report" > "$RESULTS/latest.md"
echo
echo "$report"
echo
echo "(written to bench/results/latest.md)"
