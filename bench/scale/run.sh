#!/usr/bin/env bash
# idem.claims at scale: claims per second with ROWS claims in the table
# against an empty table, then a purge of EXPIRED expired claims while
# CLIENTS clients go on claiming, and the table's size before and after.
#
#  1. Two databases of one cluster: "empty" (idem.claims truncated before
#     each of its runs) and "full" (ROWS claims of namespace 'bench', ids
#     'm' followed by 19 digits spread evenly over [1e18, 9e18] and written
#     in an order unrelated to their value, as a stream of random ids would
#     be; the EXPIRED oldest are 10 days old, older than the default
#     retention of 7 days, the others less than a day).  pgbench -M prepared
#     claims new random ids (idem_claim(id, 'bench')) in each, for DURATION
#     seconds, the two alternating for REPEAT rounds (the first changing
#     each round), a CHECKPOINT before every run.  Reported: median TPS and
#     server CPU per claim of each, and full / empty (target >= 0.7).
#  2. Purge: PURGE_ROUNDS runs of the claims on "full" first (the "before"),
#     then the purge starts in one session, as the maintenance worker runs
#     it: idem_maintenance(BATCH) in a transaction of its own, again and
#     again until it purges less than a batch of claims, after each batch
#     the worker's pause (working PURGE_LOAD of the time, 0.25 like
#     idem.maintenance_load's default; 1: no pause); meanwhile the
#     claims run on, in runs of DURATION seconds.  Reported: the purge rate
#     (rows per second), the TPS of the claims during the purge (the runs
#     that ended before it did) as a ratio of before (target >= 0.8).
#  3. Size: table (heap, with its free space map and visibility map) and
#     indexes, in bytes and in bytes per claim, after the fill, after the
#     purge, AV_WAIT seconds later (once autovacuum, with the table's own
#     settings, has had its turn: no VACUUM by hand), and after EXPIRED new
#     claims are written again (as the stream brings them over a retention)
#     and autovacuum has had its turn again: a size equal to the first shows
#     the purged space reused, the table bounded.  RELOPTIONS=default runs
#     with PostgreSQL's autovacuum settings for idem.claims rather than
#     idem's, RELOPTIONS='name = value, ...' with others.
#
#   bash bench/scale/run.sh                         # ROWS=100000000
#   ROWS=1000000 DURATION=3 REPEAT=3 bash bench/scale/run.sh    # quick
#
# Steady state between checkpoints: CHECKPOINT_RUNS=0 (no CHECKPOINT before
# each run), WARMUP (seconds of claims on "full" first, not counted) and
# PREWARM=1 (pg_prewarm the indexes of idem.claims into shared buffers).
# HUGE_PAGES=1 reserves huge pages for shared memory (vm.nr_hugepages, put
# back at the end) and runs the server with huge_pages = on, as a server
# with large shared buffers is run: a backend then maps shared memory in 2 MB
# pages rather than faulting it in 4 kB at a time.  DROP_CACHES=1 drops the
# kernel's page cache once the indexes are in shared buffers (after PREWARM),
# so that their second copy there does not crowd the machine's memory.
# KEEP=1 keeps DIR (its cluster stopped) at the end; REUSE=1 with DIR set
# runs on the cluster a KEEP=1 run left there instead of filling one (its
# "full" database then also holds the claims of the earlier runs).
#
# Settings: ROWS (100000000), EXPIRED (ROWS / 10), CLIENTS (8), DURATION (5),
# REPEAT (5), PURGE_ROUNDS (REPEAT), BATCH (1000, the worker's
# idem.maintenance_batch), SHARED_BUFFERS (2GB), RELOPTIONS (idem), AV_WAIT
# (30), EXTRA (more server settings, separated by ';'), PORT (5681), DIR (a new
# directory under /tmp; the data directory takes about 160 bytes per claim,
# 16 GB at 100M).
#
# The fill is quick: the indexes are dropped, the rows written by
# INSERT ... SELECT from generate_series in the transaction that truncated
# the table (wal_level = minimal then, so no WAL is written for them), and
# the indexes built again (the same definitions); the server is then
# restarted with wal_level = replica for the measurements, the table
# vacuumed and analyzed.
#
# Runs as root on Debian 12: it builds idem into a private copy of
# PostgreSQL and starts a throwaway server on a Unix socket.
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/scripts/common.sh"
need_root

ROWS=${ROWS:-100000000}
EXPIRED=${EXPIRED:-$((ROWS / 10))}
CLIENTS=${CLIENTS:-8}
DURATION=${DURATION:-5}
REPEAT=${REPEAT:-5}
PURGE_ROUNDS=${PURGE_ROUNDS:-$REPEAT}
BATCH=${BATCH:-1000}
PURGE_LOAD=${PURGE_LOAD:-0.25}
SHARED_BUFFERS=${SHARED_BUFFERS:-2GB}
PORT=${PORT:-5681}
SYNC_COMMIT=${SYNC_COMMIT:-off}
RELOPTIONS=${RELOPTIONS:-idem}
AV_WAIT=${AV_WAIT:-30}
CHECKPOINT_RUNS=${CHECKPOINT_RUNS:-1}
WARMUP=${WARMUP:-0}
PREWARM=${PREWARM:-0}
HUGE_PAGES=${HUGE_PAGES:-0}
DROP_CACHES=${DROP_CACHES:-0}
KEEP=${KEEP:-0}
REUSE=${REUSE:-0}

[[ "$ROWS" =~ ^[1-9][0-9]*$ ]] && [ "$ROWS" -le 1000000000 ] || die "ROWS must be between 1 and 1e9"
[[ "$EXPIRED" =~ ^[0-9]+$ ]] && [ "$EXPIRED" -le "$ROWS" ] || die "EXPIRED must be between 0 and ROWS"
case "$CHECKPOINT_RUNS" in 0|1) ;; *) die "CHECKPOINT_RUNS: 0 or 1" ;; esac
case "$PREWARM" in 0|1) ;; *) die "PREWARM: 0 or 1" ;; esac
case "$HUGE_PAGES" in 0|1) ;; *) die "HUGE_PAGES: 0 or 1" ;; esac
case "$DROP_CACHES" in 0|1) ;; *) die "DROP_CACHES: 0 or 1" ;; esac
case "$KEEP" in 0|1) ;; *) die "KEEP: 0 or 1" ;; esac
case "$REUSE" in 0) ;; 1) [ -n "${DIR:-}" ] && [ -d "$DIR/cluster/data" ] || die "REUSE=1 needs DIR of a KEEP=1 run" ;; *) die "REUSE: 0 or 1" ;; esac
[[ "$WARMUP" =~ ^[0-9]+$ ]] || die "WARMUP: seconds"

install_packages
work=$(copy_tree "$here")
dir=${DIR:-$(mktemp -d /tmp/idem-bench-scale.XXXXXX)}
mkdir -p "$dir"
chmod 755 "$dir"
nr_hugepages=$(cat /proc/sys/vm/nr_hugepages)
cleanup() {
    [ -n "${purge_pid:-}" ] && kill "$purge_pid" 2>/dev/null
    stop_cluster "$dir/cluster"
    [ "$HUGE_PAGES" = 1 ] && echo "$nr_hugepages" > /proc/sys/vm/nr_hugepages
    if [ "$KEEP" = 1 ]; then echo "== kept $dir"; rm -rf "$work"; else rm -rf "$dir" "$work"; fi
}
trap cleanup EXIT

echo "== building in $work"
build_and_install "$work" >/dev/null

as_pg() { runuser -u postgres -- env PATH="$PATH" "$@"; }
sql() { local db=$1; shift; as_pg psql -h "$dir/cluster" -p "$PORT" -X -q -At -v ON_ERROR_STOP=1 -d "$db" "$@"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR==0) print 0; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b > 0) ? a / b : 0 }'; }

settings=(
    "shared_buffers = '$SHARED_BUFFERS'"
    "synchronous_commit = $SYNC_COMMIT"
    "max_wal_size = '8GB'"
    "checkpoint_timeout = '1h'"
    "maintenance_work_mem = '1GB'"
    "max_parallel_maintenance_workers = 1"
    "jit = off"
    "shared_preload_libraries = 'idem'"
    "idem.maintenance = off"
    # autovacuum looks at the tables every 10 s rather than every minute,
    # so that the run need not wait long for it
    "autovacuum_naptime = '10s'"
)
if [ "$HUGE_PAGES" = 1 ]; then
    # shared_buffers and an eighth more for the rest of shared memory
    sb_mb=$(awk -v s="$SHARED_BUFFERS" 'BEGIN { n = s + 0; u = toupper(s); sub(/^[0-9]+/, "", u)
        if (u == "GB") n *= 1024; else if (u == "KB") n /= 1024; else if (u != "MB") n = n * 8 / 1024
        printf "%d", n }')
    pages=$(( (sb_mb + sb_mb / 8 + 256) / 2 ))
    echo "$pages" > /proc/sys/vm/nr_hugepages
    [ "$(cat /proc/sys/vm/nr_hugepages)" -ge "$pages" ] ||
        die "could not reserve $pages huge pages (got $(cat /proc/sys/vm/nr_hugepages))"
fi
# EXTRA: more settings, separated by ';' (e.g. "wal_compression = lz4")
IFS=';' read -r -a extra <<<"${EXTRA:-}"
for e in "${extra[@]}"; do [ -n "$e" ] && settings+=("$e"); done
restart() {
    # restart WAL_LEVEL: the server with wal_level WAL_LEVEL
    local conf="$dir/cluster/data/postgresql.auto.conf"
    stop_cluster "$dir/cluster"
    if [ "$1" = minimal ]; then
        printf "wal_level = minimal\nmax_wal_senders = 0\n" > "$conf"
    else
        : > "$conf"
    fi
    # the settings of this run (also over those of a run whose cluster is reused)
    printf '%s\n' "${settings[@]}" >> "$conf"
    if [ "$HUGE_PAGES" = 1 ]; then echo "huge_pages = on" >> "$conf"; else echo "huge_pages = off" >> "$conf"; fi
    chown postgres:postgres "$conf"
    as_pg pg_ctl -D "$dir/cluster/data" -l "$dir/cluster/server.log" -w start >/dev/null ||
        { tail "$dir/cluster/server.log"; die "server did not start"; }
}

if [ "$REUSE" = 0 ]; then
    start_cluster "$dir/cluster" "$PORT" "${settings[@]}" >/dev/null
    restart minimal
    for db in empty full; do
        as_pg createdb -h "$dir/cluster" -p "$PORT" "$db" || die "createdb failed"
        sql "$db" -c "CREATE EXTENSION idem" || die "CREATE EXTENSION failed"
    done
fi

echo "== $(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)), $(free -g | awk '/^Mem:/ { print $2 }') GB," \
    "PostgreSQL $(pg_config --version | cut -d' ' -f2), $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== ROWS=$ROWS EXPIRED=$EXPIRED CLIENTS=$CLIENTS DURATION=$DURATION REPEAT=$REPEAT BATCH=$BATCH PURGE_LOAD=$PURGE_LOAD shared_buffers=$SHARED_BUFFERS EXTRA='${EXTRA:-}'" \
    "CHECKPOINT_RUNS=$CHECKPOINT_RUNS WARMUP=$WARMUP PREWARM=$PREWARM HUGE_PAGES=$HUGE_PAGES DROP_CACHES=$DROP_CACHES"

# The fill.  Row g (1..ROWS) has the id of position (g * P) mod ROWS of the
# evenly spread ids, P a prime that does not divide ROWS: every id once, in
# an order unrelated to the time of the claim.  Times increase with g.
step=$((8000000000000000000 / ROWS))
prime=1000003
[ $((ROWS % prime)) = 0 ] && prime=999983
if [ "$REUSE" = 0 ]; then
indexes=$(sql full -c "SELECT string_agg(pg_get_indexdef(indexrelid), '; ') FROM pg_index WHERE indrelid = 'idem.claims'::regclass AND NOT indisprimary")
t0=$(now)
sql full <<EOF || die "fill failed"
SET maintenance_work_mem = '1GB';
BEGIN;
TRUNCATE idem.claims;
ALTER TABLE idem.claims DROP CONSTRAINT claims_pkey;
$(sql full -c "SELECT string_agg('DROP INDEX idem.' || quote_ident(c.relname), '; ') FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'idem.claims'::regclass AND NOT i.indisprimary");
INSERT INTO idem.claims (ns, msg_id, claimed_at)
    SELECT 'bench',
           'm' || (1000000000000000000 + ((g::numeric * $prime) % $ROWS)::int8 * $step::int8),
           CASE WHEN g <= $EXPIRED
                THEN now() - interval '10 days' + g * interval '1 microsecond'
                ELSE now() - interval '1 day' + g * interval '1 microsecond' END
      FROM generate_series(1, $ROWS) g;
COMMIT;
EOF
t1=$(now)
sql full <<EOF || die "index build failed"
SET maintenance_work_mem = '1GB';
ALTER TABLE idem.claims ADD CONSTRAINT claims_pkey PRIMARY KEY (ns, msg_id);
$indexes;
EOF
t2=$(now)
restart replica
sql full -c "VACUUM ANALYZE idem.claims" || die "vacuum failed"
sql full -c "CHECKPOINT"
t3=$(now)
echo "== fill: rows $(secs "$t0" "$t1") s, indexes $(secs "$t1" "$t2") s, vacuum $(secs "$t2" "$t3") s"
else
    restart replica
    echo "== reused the cluster in $dir: $(sql full -c "SELECT count(*) FROM idem.claims") claims"
fi
[ "$(sql full -c "SELECT count(*) FROM idem.claims WHERE claimed_at < now() - interval '7 days'")" = "$EXPIRED" ] ||
    die "the table does not hold $EXPIRED expired claims"

sizes() {
    # sizes LABEL: a row of the size table
    sql full -c "SELECT format('| %s | %s | %s | %s | %s | %s |', '$1', n,
                        pg_size_pretty(t), pg_size_pretty(i),
                        round(t::numeric / nullif(n, 0), 1), round(i::numeric / nullif(n, 0), 1))
                   FROM (SELECT (SELECT count(*) FROM idem.claims) n,
                                pg_table_size('idem.claims') t,
                                pg_indexes_size('idem.claims') i) s"
}
size_rows=("$(sizes 'after the fill')")

script="$dir/claim.sql"
cat > "$script" <<'EOF'
\set r random(1000000000000000000, 9200000000000000000)
SELECT idem_claim('m' || :r, 'bench');
EOF
chmod 644 "$script"
threads=$(( CLIENTS < 2 ? CLIENTS : 2 ))

wal() { sql "$1" -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8"; }

# run DB: one run of the claims, prints "tps cpu-us-per-claim wal-bytes-per-claim"
run() {
    local out c0 c1 w0 w1 tps n i
    w0=$(wal "$1")
    c0=$(server_cpu_us "$dir/cluster")
    out=$(as_pg pgbench -h "$dir/cluster" -p "$PORT" -n -M prepared -c "$CLIENTS" -j "$threads" \
        -T "$DURATION" -f "$script" "$1" 2>&1) || { echo "$out" >&2; die "pgbench failed"; }
    # until pgbench's backends have exited, so that their CPU is counted
    # (the purge's backend may still be there)
    for i in $(seq 1 100); do
        [ "$(sql "$1" -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbench'")" = 0 ] && break
        sleep 0.1
    done
    c1=$(server_cpu_us "$dir/cluster")
    w1=$(wal "$1")
    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    n=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
    echo "$(awk -v t="$tps" 'BEGIN { printf "%.0f", t }')" \
        "$(awk -v d=$((c1 - c0)) -v n="$n" 'BEGIN { printf "%.1f", (n > 0) ? d / n : 0 }')" \
        "$(awk -v d=$((w1 - w0)) -v n="$n" 'BEGIN { printf "%.0f", (n > 0) ? d / n : 0 }')"
}

av() { sql full -c "SELECT autovacuum_count || ' ' || n_dead_tup FROM pg_stat_user_tables WHERE relid = 'idem.claims'::regclass"; }
case "$RELOPTIONS" in
    idem) ;;
    default) sql full -c "ALTER TABLE idem.claims RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold)" ;;
    *) sql full -c "ALTER TABLE idem.claims SET ($RELOPTIONS)" || die "bad RELOPTIONS" ;;
esac
echo "== idem.claims: $(sql full -c "SELECT coalesce(array_to_string(reloptions, ', '), 'PostgreSQL defaults') FROM pg_class WHERE oid = 'idem.claims'::regclass")"

# PREWARM=1: the indexes of idem.claims read into shared buffers first
# (pg_prewarm), as a server whose shared_buffers holds them has them after
# a while.  WARMUP: seconds of claims on "full" before the measured runs,
# not counted, so that the pages they change have had their full-page image
# since the last checkpoint (with CHECKPOINT_RUNS=0, runs without a
# checkpoint before each: the steady state between checkpoints, where a
# page's first change after a checkpoint writes its image once; with 1, the
# default, every run starts at a checkpoint, the most images per claim).
if [ "$PREWARM" = 1 ]; then
    sql full -c "SET client_min_messages = warning" -c "CREATE EXTENSION IF NOT EXISTS pg_prewarm" || die "pg_prewarm is missing"
    t0=$(now)
    blocks=$(sql full -c "SELECT sum(pg_prewarm(c.oid)) FROM pg_class c WHERE c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'idem.claims'::regclass)")
    echo "== prewarm: $((blocks * 8 / 1024)) MB in $(secs "$t0" "$(now)") s"
fi
if [ "$DROP_CACHES" = 1 ]; then
    sync
    echo 1 > /proc/sys/vm/drop_caches
    echo "== page cache dropped: $(free -m | awk '/^Mem:/ { print $4 }') MB free"
fi
if [ "$WARMUP" -gt 0 ]; then
    sql full -c "CHECKPOINT"
    saved=$DURATION; DURATION=$WARMUP
    read -r t u w <<<"$(run full)"
    DURATION=$saved
    echo "   warm-up on full ($WARMUP s, not counted): $t tps, $u us CPU/claim, $w WAL bytes/claim"
fi

# 1. full against empty
declare -A tps cpu walc
for rep in $(seq 1 "$REPEAT"); do
    if [ $((rep % 2)) = 1 ]; then order="empty full"; else order="full empty"; fi
    for db in $order; do
        [ "$db" = empty ] && sql empty -c "TRUNCATE idem.claims"
        [ "$CHECKPOINT_RUNS" = 1 ] && sql "$db" -c "CHECKPOINT"
        read -r t u w <<<"$(run "$db")"
        tps[$db]="${tps[$db]:-} $t"; cpu[$db]="${cpu[$db]:-} $u"; walc[$db]="${walc[$db]:-} $w"
        echo "   round $rep, $db: $t tps, $u us CPU/claim, $w WAL bytes/claim"
    done
done
te=$(echo "${tps[empty]}" | median); tf=$(echo "${tps[full]}" | median)
ce=$(echo "${cpu[empty]}" | median); cf=$(echo "${cpu[full]}" | median)
we=$(echo "${walc[empty]}" | median); wf=$(echo "${walc[full]}" | median)

# 2. the purge under load
sql full -c "CHECKPOINT"
before=
for rep in $(seq 1 "$PURGE_ROUNDS"); do
    read -r t u w <<<"$(run full)"
    before="$before $t"
    echo "   before the purge, run $rep: $t tps, $u us CPU/claim, $w WAL bytes/claim"
done
tb=$(echo "$before" | median)
read -r av0 dead0 <<<"$(av)"
purge_log="$dir/purge.log"
# One statement per batch, each its own transaction, as the worker runs
# them: the backend reports its deletes to the cumulative statistics between
# statements (a loop in one DO block would report them only at its end, and
# autovacuum would not see the dead rows until then).  psql stops at the
# first batch that is not full.
block=$(cat <<EOF
SELECT clock_timestamp() AS t \\gset
SELECT purged AS n FROM idem_maintenance($BATCH) WHERE kind = 'claims' \\gset
SELECT :n < $BATCH AS done \\gset
\\if :done
SELECT extract(epoch FROM clock_timestamp() - :'t0');
\\q
\\endif
SELECT pg_sleep(extract(epoch FROM clock_timestamp() - :'t') * (1 - $PURGE_LOAD) / $PURGE_LOAD);
EOF
)
{
    echo "SELECT clock_timestamp() AS t0 \\gset"
    for i in $(seq 1 $((EXPIRED / BATCH * 2 + 100))); do printf '%s\n' "$block"; done
} > "$dir/purge.sql"
chmod 644 "$dir/purge.sql"
sql full -f "$dir/purge.sql" > "$purge_log" 2>&1 &
purge_pid=$!
during= all_during=
while kill -0 "$purge_pid" 2>/dev/null; do
    read -r t u w <<<"$(run full)"
    if kill -0 "$purge_pid" 2>/dev/null; then
        during="$during $t"
        echo "   during the purge: $t tps, $u us CPU/claim, $w WAL bytes/claim"
    else
        echo "   during the purge (ended meanwhile, left out): $t tps, $u us CPU/claim, $w WAL bytes/claim"
    fi
    all_during="$all_during $t"
done
wait "$purge_pid" || { cat "$purge_log"; die "the purge failed"; }
purge_pid=
purge_secs=$(tail -n 1 "$purge_log")
[ -n "$during" ] || during=$all_during
td=$(echo "$during" | median)
left=$(sql full -c "SELECT count(*) FROM idem.claims WHERE claimed_at < now() - interval '7 days'")
[ "$left" = 0 ] || die "$left expired claims were left"
rate=$(awk -v n="$EXPIRED" -v s="$purge_secs" 'BEGIN { printf "%.0f", (s > 0) ? n / s : 0 }')
size_rows+=("$(sizes 'after the purge')")

# autovacuum's turn: the table is vacuumed by autovacuum alone, with its
# settings (RELOPTIONS), as it would be in production
wait_autovacuum() {
    local i
    sleep "$AV_WAIT"
    for i in $(seq 1 600); do
        [ "$(sql full -c "SELECT count(*) FROM pg_stat_progress_vacuum WHERE relid = 'idem.claims'::regclass")" = 0 ] && break
        sleep 1
    done
}
wait_autovacuum
read -r av1 dead1 <<<"$(av)"
size_rows+=("$(sizes "$AV_WAIT s later: autovacuum ran $((av1 - av0)) times, $dead1 dead rows left")")

# 3. as many claims again, new ids among the others: the space is reused
sql full <<EOF || die "refill failed"
INSERT INTO idem.claims (ns, msg_id, claimed_at)
    SELECT 'bench',
           'm' || (1000000000000000000 + ((g::numeric * $prime) % $ROWS)::int8 * $step::int8 + $step::int8 / 2),
           now()
      FROM generate_series(1, $EXPIRED) g;
EOF
size_rows+=("$(sizes "after $EXPIRED new claims")")
wait_autovacuum
read -r av2 dead2 <<<"$(av)"
size_rows+=("$(sizes "$AV_WAIT s later: autovacuum ran $((av2 - av0)) times in all, $dead2 dead rows left")")

echo
echo "### Claims with $ROWS rows in idem.claims against an empty table ($CLIENTS clients)"
echo
echo "| table | TPS | CPU us/claim | WAL bytes/claim |"
echo "|---|---|---|---|"
echo "| empty | $te | $ce | $we |"
echo "| $ROWS rows | $tf | $cf | $wf |"
echo "| ratio | $(ratio "$tf" "$te") | $(ratio "$cf" "$ce") | $(ratio "$wf" "$we") |"
echo
echo "### Purge of $EXPIRED expired claims (batches of $BATCH, PURGE_LOAD $PURGE_LOAD) while $CLIENTS clients claim"
echo
echo "| purge | rate | TPS before | TPS during | ratio |"
# (the server's CPU and WAL per claim of the runs during the purge, in the
# log above, include the purge's)
echo "|---|---|---|---|---|"
echo "| $(awk -v s="$purge_secs" 'BEGIN { printf "%.1f", s }') s | $rate rows/s | $tb | $td | $(ratio "$td" "$tb") |"
echo
echo "### Size of idem.claims"
echo
echo "| when | claims | table | indexes | table bytes/claim | index bytes/claim |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${size_rows[@]}"
