#!/usr/bin/env bash
# Benchmark of the state-transition guard, with pgbench -M prepared:
#
#  1. idem_transition() against the hand-written conditional UPDATE with a
#     version check, UPDATE t SET status = $2, version = version + 1
#     WHERE id = $1 AND version = $3, each transaction moving one row of a
#     table of ROWS rows from 'new' to 'paid' (every client walks rows of
#     its own, so every move is a real one; the rows are checked afterwards).
#     The same on a table partitioned in 8 (LIST on shard = id % 8, primary
#     key (shard, id)): idem_transition('p', ARRAY[shard, id], ...) through
#     the parent against UPDATE p SET ... WHERE shard = $1 AND id = $2 AND
#     version = $3 on the unguarded partitioned table.
#  2. the cost of the guard trigger on plain UPDATEs of random rows that do
#     not touch the state: the same statement on an unguarded table and on
#     guarded ones.
#
# Every configuration runs REPEAT times, interleaved; the table shows the
# median tps and the ratios.  Targets: idem_transition >= 0.9 x the
# hand-written UPDATE; the guarded UPDATE at most 10% slower.
#
#   bash bench/guard/run.sh
#   DURATION=30 REPEAT=5 CLIENTS="1 8" SYNC_COMMIT=on bash bench/guard/run.sh
#   MOVES="p_hand p_idem" PLAIN= bash bench/guard/run.sh   # partitioned only
#
# Runs as root on Debian 12: it builds and installs the extension and starts
# a throwaway server on a Unix socket (PORT, default 5641).
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/scripts/common.sh"
need_root

PORT=${PORT:-5641}
ROWS=${ROWS:-1000000}
DURATION=${DURATION:-10}
REPEAT=${REPEAT:-3}
CLIENTS=${CLIENTS:-"1 8"}
SYNC_COMMIT=${SYNC_COMMIT:-off}
MOVES=${MOVES-"hand hand_guarded idem p_hand p_idem"}
PLAIN=${PLAIN-"u_plain u_guarded u_guarded_state u_empty_trigger"}

install_packages
work=$(copy_tree "$here")
dir=$(mktemp -d /tmp/idem-bench-guard.XXXXXX)
chmod 755 "$dir"
cleanup() { stop_cluster "$dir/cluster"; rm -rf "$dir" "$work"; }
trap cleanup EXIT

# The server runs from a private copy of the PostgreSQL installation with
# this build of idem in it (scripts/common.sh).
echo "== building in $work"
build_and_install "$work"
pg="$work/pg"
# autovacuum is off so that runs are alike; each run starts from a vacuumed
# table and a checkpoint.
start_cluster "$dir/cluster" "$PORT" \
    "shared_buffers = '1GB'" \
    "synchronous_commit = $SYNC_COMMIT" \
    "max_wal_size = '8GB'" \
    "checkpoint_timeout = '1h'" \
    "autovacuum = off" \
    "jit = off" \
    "max_connections = 50"

as_pg() { runuser -u postgres -- env PATH="$PATH" "$@"; }
sql() { as_pg psql -h "$dir/cluster" -p "$PORT" -X -q -At -v ON_ERROR_STOP=1 -d bench "$@"; }
as_pg createdb -h "$dir/cluster" -p "$PORT" bench || die "createdb failed"
[ "$(sql -c "SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'")" = "$pg/lib/postgresql/$PG_MAJOR/lib" ] ||
    die "the server does not run from the copy of PostgreSQL"

echo "== loading $ROWS rows into each table"
sql >/dev/null <<SQL || die "setup failed"
CREATE EXTENSION idem;
SELECT idem_allow('order', 'new', 'paid');
SELECT idem_allow('order', 'paid', 'shipped');
-- moves: one table per variant
CREATE TABLE t_hand (id integer PRIMARY KEY, status text NOT NULL,
                     version bigint NOT NULL, payload integer NOT NULL);
CREATE TABLE t_hand_guarded (LIKE t_hand INCLUDING ALL);
CREATE TABLE t_idem (LIKE t_hand INCLUDING ALL);
SELECT idem_guard('t_hand_guarded', 'order', 'status', 'version');
SELECT idem_guard('t_idem', 'order', 'status', 'version');
-- moves on partitioned tables: 8 partitions, a composite primary key
CREATE TABLE p_hand (shard integer NOT NULL, id integer NOT NULL, status text NOT NULL,
                     version bigint NOT NULL, payload integer NOT NULL,
                     PRIMARY KEY (shard, id)) PARTITION BY LIST (shard);
CREATE TABLE p_idem (LIKE p_hand INCLUDING ALL) PARTITION BY LIST (shard);
SELECT format('CREATE TABLE %I PARTITION OF %I FOR VALUES IN (%s)', t || '_' || s, t, s)
  FROM unnest(ARRAY['p_hand', 'p_idem']) t, generate_series(0, 7) s \gexec
SELECT idem_guard('p_idem', 'order', 'status', 'version');
-- plain updates
CREATE TABLE u_plain (LIKE t_hand INCLUDING ALL);
CREATE TABLE u_guarded (LIKE t_hand INCLUDING ALL);
CREATE TABLE u_guarded_state (LIKE t_hand INCLUDING ALL);
-- the cost of any BEFORE ROW trigger, for reference: one that does nothing
CREATE TABLE u_empty_trigger (LIKE t_hand INCLUDING ALL);
CREATE FUNCTION return_new() RETURNS trigger LANGUAGE plpgsql AS
\$\$ BEGIN RETURN NEW; END; \$\$;
CREATE TRIGGER empty BEFORE UPDATE ON u_empty_trigger
    FOR EACH ROW EXECUTE FUNCTION return_new();
SELECT idem_guard('u_guarded', 'order', 'status', 'version');
SELECT idem_guard('u_guarded_state', 'order', 'status');
INSERT INTO u_plain SELECT g, 'new', 0, 0 FROM generate_series(1, $ROWS) g;
INSERT INTO u_guarded SELECT * FROM u_plain;
INSERT INTO u_guarded_state SELECT * FROM u_plain;
INSERT INTO u_empty_trigger SELECT * FROM u_plain;
SQL

scripts=$(mktemp -d /tmp/idem-bench-guard-scripts.XXXXXX)
chmod 755 "$scripts"
trap 'cleanup; rm -rf "$scripts"' EXIT
# Client c (from 0) moves rows c+1, c+1+nc, c+1+2nc, ...
walk='\set n :n + 1
\set id :client_id + 1 + :nc * (:n - 1)'
printf '%s\nUPDATE t_hand SET status = :to, version = version + 1 WHERE id = :id AND version = :ver;\n' \
    "$walk" > "$scripts/hand.sql"
printf '%s\nUPDATE t_hand_guarded SET status = :to, version = version + 1 WHERE id = :id AND version = :ver;\n' \
    "$walk" > "$scripts/hand_guarded.sql"
printf '%s\nSELECT idem_transition('"'"'t_idem'"'"', :id, :to, :ver);\n' \
    "$walk" > "$scripts/idem.sql"
printf '%s\n\\set shard :id %% 8\nUPDATE p_hand SET status = :to, version = version + 1 WHERE shard = :shard AND id = :id AND version = :ver;\n' \
    "$walk" > "$scripts/p_hand.sql"
printf '%s\n\\set shard :id %% 8\nSELECT idem_transition('"'"'p_idem'"'"', ARRAY[:shard::text, :id::text], :to, :ver);\n' \
    "$walk" > "$scripts/p_idem.sql"
for t in u_plain u_guarded u_guarded_state u_empty_trigger; do
    printf '\\set id random(1, %s)\nUPDATE %s SET payload = payload + 1 WHERE id = :id;\n' \
        "$ROWS" "$t" > "$scripts/$t.sql"
done
chmod 644 "$scripts"/*.sql

reset_moves() {
    local t=$1 cols="g, 'new', 0, 0"
    case $t in p_*) cols="g % 8, $cols" ;; esac
    sql <<SQL || die "reset of $t failed"
TRUNCATE $t;
INSERT INTO $t SELECT $cols FROM generate_series(1, $ROWS) g;
VACUUM (FREEZE, ANALYZE) $t;
CHECKPOINT;
SQL
}

prepare_plain() {
    sql -c "VACUUM (FREEZE, ANALYZE) $1" -c "CHECKPOINT" >/dev/null || die "vacuum of $1 failed"
}

# run_pgbench SCRIPT CLIENTS: prints "tps transactions cpu-us-per-transaction"
# (the server's CPU: scripts/common.sh, server_cpu_us)
run_pgbench() {
    local script=$1 c=$2 threads out t0 t1 tps n
    threads=$(( c < 2 ? c : 2 ))
    t0=$(server_cpu_us "$dir/cluster")
    out=$(as_pg pgbench -h "$dir/cluster" -p "$PORT" -n -M prepared -c "$c" -j "$threads" \
        -T "$DURATION" -D n=0 -D nc="$c" -D to=paid -D ver=0 \
        -f "$scripts/$script.sql" bench 2>&1) || { echo "$out" >&2; die "pgbench failed"; }
    wait_backends_gone "$dir/cluster" "$PORT" bench
    t1=$(server_cpu_us "$dir/cluster")
    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    n=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
    echo "$tps $n $(awk -v d=$((t1 - t0)) -v n="$n" 'BEGIN { printf "%.1f", (n > 0) ? d / n : 0 }')"
}

declare -A tps cpu
record() { tps["$1,$2"]="${tps["$1,$2"]:-} $3"; cpu["$1,$2"]="${cpu["$1,$2"]:-} $4"; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR==0) print 0; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

echo "== $(nproc) CPUs, $(sql -c 'SHOW server_version'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== $REPEAT x $DURATION s per configuration, clients: $CLIENTS, synchronous_commit = $SYNC_COMMIT"
# rotate: the variant that runs first changes from round to round
rotate() { local k=$(( $1 % ($# - 1) )); shift; local a=("$@"); echo "${a[@]:k}" "${a[@]:0:k}"; }
for rep in $(seq 1 "$REPEAT"); do
    for c in $CLIENTS; do
        for v in $([ -n "$MOVES" ] && rotate "$rep" $MOVES); do
            case $v in
                hand) t=t_hand ;; hand_guarded) t=t_hand_guarded ;; idem) t=t_idem ;;
                p_hand) t=p_hand ;; p_idem) t=p_idem ;;
            esac
            reset_moves "$t"
            read -r r n u <<<"$(run_pgbench "$v" "$c")"
            # every transaction must have moved one row of its own
            moved=$(sql -c "SELECT count(*) FROM $t WHERE status = 'paid' AND version = 1")
            if [ "$moved" != "$n" ]; then
                echo "warning: $v with $c clients: $n transactions but $moved rows moved" >&2
            fi
            record "$v" "$c" "$r" "$u"
            printf '  run %d  %-16s %2d clients  %10.1f tps  %7.1f us CPU  (%s rows moved)\n' \
                "$rep" "$v" "$c" "$r" "$u" "$moved"
        done
        for v in $([ -n "$PLAIN" ] && rotate "$rep" $PLAIN); do
            prepare_plain "$v"
            read -r r n u <<<"$(run_pgbench "$v" "$c")"
            record "$v" "$c" "$r" "$u"
            printf '  run %d  %-16s %2d clients  %10.1f tps  %7.1f us CPU\n' "$rep" "$v" "$c" "$r" "$u"
        done
    done
done

med() { echo "${tps["$1,$2"]:-}" | median; }
medcpu() { echo "${cpu["$1,$2"]:-}" | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }'; }
slower() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%+.1f%%", (a / b - 1) * 100; else print "-" }'; }

echo
echo "== load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "== 1. one move per transaction: median tps ($ROWS rows, ${DURATION} s x $REPEAT, synchronous_commit = $SYNC_COMMIT)"
printf '%-8s %14s %14s %14s %12s %12s\n' clients "hand-written" "hand+guard" "idem_trans." "idem/hand" "target"
for c in $CLIENTS; do
    h=$(med hand "$c"); hg=$(med hand_guarded "$c"); i=$(med idem "$c")
    r=$(ratio "$i" "$h")
    ok=$(awk -v r="$r" 'BEGIN { print (r >= 0.9) ? ">= 0.9 met" : ">= 0.9 MISSED" }')
    printf '%-8s %14.1f %14.1f %14.1f %12s %12s\n' "$c" "$h" "$hg" "$i" "$r" "$ok"
done
echo "   server CPU per transaction (us), median; ratio hand/idem (>= 0.9 wanted):"
for c in $CLIENTS; do
    h=$(medcpu hand "$c"); hg=$(medcpu hand_guarded "$c"); i=$(medcpu idem "$c")
    printf '%-8s %14.1f %14.1f %14.1f %12s\n' "$c" "$h" "$hg" "$i" "$(ratio "$h" "$i")"
done
echo "  hand-written: UPDATE t SET status = \$2, version = version + 1 WHERE id = \$1 AND version = \$3"
echo "                on an unguarded table; hand+guard: the same on a guarded table;"
echo "  idem_trans.:  SELECT idem_transition('t', \$1, \$2, \$3) on a guarded table"

echo
echo "== 1b. one move per transaction on a table partitioned in 8 (composite key): median tps"
printf '%-8s %14s %14s %12s %12s\n' clients "hand-written" "idem_trans." "idem/hand" "target"
for c in $CLIENTS; do
    h=$(med p_hand "$c"); i=$(med p_idem "$c")
    r=$(ratio "$i" "$h")
    ok=$(awk -v r="$r" 'BEGIN { print (r >= 0.9) ? ">= 0.9 met" : ">= 0.9 MISSED" }')
    printf '%-8s %14.1f %14.1f %12s %12s\n' "$c" "$h" "$i" "$r" "$ok"
done
echo "   server CPU per transaction (us), median; ratio hand/idem (>= 0.9 wanted):"
for c in $CLIENTS; do
    h=$(medcpu p_hand "$c"); i=$(medcpu p_idem "$c")
    printf '%-8s %14.1f %14.1f %12s\n' "$c" "$h" "$i" "$(ratio "$h" "$i")"
done
echo "  hand-written: UPDATE p SET status = \$3, version = version + 1 WHERE shard = \$1 AND id = \$2 AND version = \$4"
echo "                on the unguarded partitioned table"
echo "  idem_trans.:  SELECT idem_transition('p', ARRAY[\$1, \$2], \$3, \$4) on the guarded one"

[ -z "$PLAIN" ] && exit 0
echo
echo "== 2. plain UPDATE of a random row (SET payload = payload + 1): median tps"
printf '%-8s %12s %14s %13s %13s %14s %14s %14s %12s\n' clients "unguarded" "guard+version" "guard(state)" "empty trig." \
    "slower(+ver)" "slower(state)" "slower(empty)" "target"
for c in $CLIENTS; do
    p=$(med u_plain "$c"); g=$(med u_guarded "$c"); s=$(med u_guarded_state "$c"); e=$(med u_empty_trigger "$c")
    ok=$(awk -v a="$p" -v b="$g" 'BEGIN { print (b > 0 && a / b - 1 <= 0.10) ? "<= 10% met" : "<= 10% MISSED" }')
    printf '%-8s %12.1f %14.1f %13.1f %13.1f %14s %14s %14s %12s\n' "$c" "$p" "$g" "$s" "$e" \
        "$(slower "$p" "$g")" "$(slower "$p" "$s")" "$(slower "$p" "$e")" "$ok"
done
echo "   server CPU per UPDATE (us), median, and how much more than unguarded:"
for c in $CLIENTS; do
    p=$(medcpu u_plain "$c"); g=$(medcpu u_guarded "$c"); s=$(medcpu u_guarded_state "$c"); e=$(medcpu u_empty_trigger "$c")
    printf '%-8s %12.1f %14.1f %13.1f %13.1f %14s %14s %14s\n' "$c" "$p" "$g" "$s" "$e" \
        "$(slower "$g" "$p")" "$(slower "$s" "$p")" "$(slower "$e" "$p")"
done
echo "  slower = how much more time an UPDATE takes than on the unguarded table"
echo "  (guard+version also writes the version it bumps; the target is checked on it;"
echo "  empty trig. is a PL/pgSQL BEFORE ROW trigger that returns NEW: in PostgreSQL 15"
echo "  any BEFORE ROW UPDATE trigger locks the row before the update, which is part"
echo "  of what the guard costs)"
