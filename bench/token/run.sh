#!/usr/bin/env bash
# Benchmark of single-use token consumption.
#
#   bash bench/token/run.sh
#
# idem_token_consume(token, scope) against the statement one would write by
# hand on a table of the same layout and size,
#
#   DELETE FROM bench.tokens
#    WHERE scope = $1 AND digest = sha256($2) AND expires_at > now()
#   RETURNING 1
#
# with the tables logged (synchronous_commit on and off) and unlogged, with 1
# and 8 clients (one token per transaction); and Redis GETDEL on the same
# machine, each Redis run right after the PostgreSQL runs it is compared
# with: a server with appendfsync always against idem at synchronous_commit
# = on, a server without persistence against idem at synchronous_commit =
# off and against idem on an unlogged table.  Ends with a table of rates and
# ratios (idem / other; above 1 means idem is faster), also saved in
# bench/results/token.txt.
#
# The tokens are issued by idem_token_issue and kept in bench.issued; the
# hand-written table is then filled with a copy of idem.tokens in its
# physical order (the SHA-256 digests of the tokens' random parts, their
# first 43 characters, which is what a hand-written scheme gives out), so
# that both tables have the same rows in the same places.  Both sides are
# driven by one libpq client (bench/token/consume.c: one connection per
# client, a prepared statement, each consumption in its own transaction),
# which reads its tokens from a file before the clock starts; each run
# consumes tokens of its own, and every consumption must succeed.  Redis
# GETDEL runs through bench/token/getdel.c, a client of the same shape.
#
# Settings (environment): TX_SYNC (transactions of a run at synchronous
# commit, default 20000), TX_ASYNC (the others, default 100000), BACKGROUND
# (tokens in each table that no run consumes, default 200000), ROUNDS (runs
# of each measurement, default 3; medians are reported), KEEP (keep the
# servers' files).  Ports: 5631 for PostgreSQL, 6391 and 6392 (127.0.0.1)
# for Redis.  Run as root on Debian 12.
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/scripts/common.sh"
need_root

PG_PORT=5631
REDIS_VOLATILE_PORT=6391
REDIS_AOF_PORT=6392
TX_SYNC=${TX_SYNC:-20000}
TX_ASYNC=${TX_ASYNC:-100000}
BACKGROUND=${BACKGROUND:-200000}
ROUNDS=${ROUNDS:-3}
CLIENT_COUNTS=(1 8)
[ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 8 ] || die "ROUNDS must be between 1 and 8"
for tx in "$TX_SYNC" "$TX_ASYNC"; do
    [ $((tx / 8)) -ge 1 ] && [ $((tx)) -lt 1000000 ] || die "TX_SYNC and TX_ASYNC must be between 8 and 999999"
done

install_packages redis-server redis-tools libpq-dev
command -v redis-server >/dev/null || die "redis-server is not installed"

dir=$(mktemp -d /tmp/idem-bench-token.XXXXXX)
chown postgres:postgres "$dir"
redis_pids=()
ok=0
cleanup() {
    local pid
    for pid in "${redis_pids[@]}"; do kill "$pid" 2>/dev/null; done
    [ ${#redis_pids[@]} -gt 0 ] && sleep 1
    stop_cluster "$dir/pg"
    [ -n "${work:-}" ] && rm -rf "$work"
    if [ -z "${KEEP:-}" ] && [ "$ok" = 1 ]; then rm -rf "$dir"; else echo "servers' files kept in $dir"; fi
}
trap cleanup EXIT

# The servers run from a private copy of the PostgreSQL installation with
# this tree's build of idem in it (as "make check" does), so that no other
# build of idem installed meanwhile on the machine is measured.
work=$(copy_tree "$here")
echo "== building in $work"
inst=$dir/install
mkdir -p "$inst/usr/lib/postgresql" "$inst/usr/share/postgresql"
cp -a "/usr/lib/postgresql/$PG_MAJOR" "$inst/usr/lib/postgresql/" || die "could not copy the installation"
cp -a "/usr/share/postgresql/$PG_MAJOR" "$inst/usr/share/postgresql/" || die "could not copy the installation"
runuser -u postgres -- make -C "$work" -s clean >/dev/null 2>&1 || true
runuser -u postgres -- make -C "$work" -s with_llvm=no PG_CFLAGS="$BUILD_FLAGS" || die "build failed"
make -C "$work" -s with_llvm=no install DESTDIR="$inst" >/dev/null || die "install failed"
# the client, against the system's libpq
gcc -O2 -pthread -I"$(pg_config --includedir)" -o "$dir/consume" "$here/bench/token/consume.c" \
    -L"$(pg_config --libdir)" -lpq || die "could not build consume"
export PATH="$inst/usr/lib/postgresql/$PG_MAJOR/bin:$PATH"
[ "$(command -v pg_ctl)" = "$inst/usr/lib/postgresql/$PG_MAJOR/bin/pg_ctl" ] || die "private installation not on PATH"
gcc -O2 -pthread -o "$dir/getdel" "$here/bench/token/getdel.c" || die "could not build getdel"

echo "== starting PostgreSQL on port $PG_PORT"
start_cluster "$dir/pg" "$PG_PORT" "shared_buffers = '512MB'" "max_wal_size = '8GB'" \
    "checkpoint_timeout = '1h'" "max_connections = 50"

psql_q() { runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -h "$dir/pg" -p "$PG_PORT" -d postgres "$@"; }
psql_v() { psql_q -At -c "$1"; }

psql_q <<'SQL' || die "setup failed"
CREATE EXTENSION idem;
CREATE SCHEMA bench;
-- the layout of idem.tokens, for the hand-written statement
CREATE TABLE bench.tokens (
    scope       text COLLATE "C" NOT NULL,
    digest      bytea NOT NULL,
    expires_at  timestamptz NOT NULL,
    consumed_at timestamptz,
    CONSTRAINT tokens_pkey PRIMARY KEY (scope, digest)
) WITH (fillfactor = 80);
CREATE INDEX tokens_expires_at_idx ON bench.tokens (expires_at);
-- background(table, n): tokens no run consumes, of the same layout
CREATE FUNCTION bench.background(tab regclass, n int)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format($q$
        INSERT INTO %s (scope, digest, expires_at)
        SELECT 'bench', sha256(convert_to(lpad(g::text, 43, 'A'), 'UTF8')),
               now() + interval '1 day'
          FROM generate_series(1, %s) g$q$, tab, n);
END;
$$;
-- the tokens of every run, as issued
CREATE TABLE bench.issued (run bigint, client int, n int, t text,
                           PRIMARY KEY (run, client, n));
SQL

# The measurements of PostgreSQL: name persistence synchronous_commit tx.
# The measurements of PostgreSQL: name persistence synchronous_commit tx.
configs=("logged_on logged on $TX_SYNC" "logged_off logged off $TX_ASYNC" "unlogged unlogged on $TX_ASYNC")

declare -A rate        # rate[method,config,clients] = list of tx/s, one per round
declare -A cpu         # cpu[method,config,clients] = list of server CPU us per tx
declare -A wal         # wal[method,config,clients] = list of WAL bytes per tx
base_of() {            # base_of round config_index clients
    echo $(( ( ($1 * 3 + $2) * 2 + ($3 == 1 ? 0 : 1) + 1) * 10000000 ))
}

count_done() {          # what each method has done so far in the table
    case $1 in
        idem) psql_v "SELECT count(*) FROM idem.tokens WHERE consumed_at IS NOT NULL" ;;
        delete) psql_v "SELECT count(*) FROM bench.tokens" ;;
    esac
}

# the server's CPU per transaction (scripts/common.sh: server_cpu_us)
backends_gone() { wait_backends_gone "$dir/pg" "$PG_PORT" postgres; }

run_client() {          # method sync clients tx run -> prints tx/s, CPU us and WAL bytes per tx
    local method=$1 sync=$2 clients=$3 tx=$4 run=$5 per before after done out tps t0 t1 l0 l1
    per=$((tx / clients))
    psql_q -c "COPY (SELECT client, t FROM bench.issued WHERE run = $run ORDER BY client, n) TO STDOUT" \
        > "$dir/tokens" || die "could not read the tokens of run $run"
    chmod 644 "$dir/tokens"
    psql_v "CHECKPOINT" >/dev/null
    before=$(count_done "$method")
    l0=$(psql_v "SELECT pg_current_wal_insert_lsn()")
    backends_gone       # the count's backend too, so that its CPU stays out
    t0=$(server_cpu_us "$dir/pg")
    out=$(runuser -u postgres -- env PGOPTIONS="-c synchronous_commit=$sync" \
        "$dir/consume" "$method" "host=$dir/pg port=$PG_PORT dbname=postgres" "$clients" "$dir/tokens" 2>&1) ||
        { echo "$out" >&2; die "the $method client failed"; }
    backends_gone
    t1=$(server_cpu_us "$dir/pg")
    l1=$(psql_v "SELECT pg_current_wal_insert_lsn()")
    after=$(count_done "$method")
    if [ "$method" = idem ]; then done=$((after - before)); else done=$((before - after)); fi
    echo "$out" | grep -q ' misses=0$' || { echo "$out" >&2; die "$method: consumptions failed"; }
    [ "$done" = $((per * clients)) ] ||
        die "$method: $((per * clients)) transactions but $done tokens consumed"
    tps=$(echo "$out" | sed -n 's/.*ops_per_sec=\([0-9.]*\).*/\1/p')
    [ -n "$tps" ] || { echo "$out" >&2; die "no rate in the output of the client"; }
    echo "$tps $(awk -v d=$((t1 - t0)) -v n="$done" 'BEGIN { printf "%.1f", d / n }')" \
        "$(psql_v "SELECT round(pg_wal_lsn_diff('$l1', '$l0') / $done)")"
}

load_tables() {         # persistence
    local persistence=$1 ci round clients name p sync tx b
    echo "== issuing the tokens ($persistence)"
    psql_q -c "TRUNCATE idem.tokens, bench.tokens, bench.issued" \
           -c "ALTER TABLE idem.tokens SET $(echo "$persistence" | tr a-z A-Z)" \
           -c "ALTER TABLE bench.tokens SET $(echo "$persistence" | tr a-z A-Z)" \
           -c "SELECT bench.background('idem.tokens', $BACKGROUND)" >/dev/null
    for ci in "${!configs[@]}"; do
        read -r name p sync tx <<< "${configs[$ci]}"
        [ "$p" = "$persistence" ] || continue
        for ((round = 0; round < ROUNDS; round++)); do
            for clients in "${CLIENT_COUNTS[@]}"; do
                b=$(base_of "$round" "$ci" "$clients")
                psql_v "INSERT INTO bench.issued
                        SELECT $b, c, n, idem_token_issue('bench', '1 day')
                          FROM (SELECT c, n
                                  FROM generate_series(0, $clients - 1) c,
                                       generate_series(1, $((tx / clients))) n
                                 ORDER BY c, n OFFSET 0) s" >/dev/null
            done
        done
    done
    # the same rows, in the same order, in the hand-written table: the
    # digests of the tokens' random parts, which the DELETE looks up
    psql_q -c "INSERT INTO bench.tokens (scope, digest, expires_at)
               SELECT scope, digest, expires_at FROM idem.tokens ORDER BY ctid" \
           -c "VACUUM (ANALYZE) idem.tokens" -c "VACUUM (ANALYZE) bench.tokens" >/dev/null
    echo "   $(psql_v "SELECT format('idem.tokens: %s rows, %s; bench.tokens: %s rows, %s',
        (SELECT count(*) FROM idem.tokens), pg_size_pretty(pg_total_relation_size('idem.tokens')),
        (SELECT count(*) FROM bench.tokens), pg_size_pretty(pg_total_relation_size('bench.tokens')))")"
}

# ---- Redis
start_redis() {         # port persistence-options...
    local port=$1; shift
    mkdir -p "$dir/redis-$port"
    redis-server --port "$port" --bind 127.0.0.1 --protected-mode yes \
        --dir "$dir/redis-$port" --daemonize yes --pidfile "$dir/redis-$port/redis.pid" \
        --logfile "$dir/redis-$port/redis.log" "$@" || die "redis-server did not start"
    local i
    for i in $(seq 50); do
        [ -s "$dir/redis-$port/redis.pid" ] && redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG && break
        sleep 0.1
    done
    redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG || die "redis on port $port does not answer"
    redis_pids+=("$(cat "$dir/redis-$port/redis.pid")")
}

echo "== starting Redis on 127.0.0.1:$REDIS_VOLATILE_PORT (no persistence) and :$REDIS_AOF_PORT (appendfsync always)"
start_redis "$REDIS_VOLATILE_PORT" --save '' --appendonly no
start_redis "$REDIS_AOF_PORT" --save '' --appendonly yes --appendfsync always

run_redis() {           # port clients tx base -> prints ops/s
    local port=$1 clients=$2 tx=$3 b=$4 per out
    per=$((tx / clients))
    "$dir/getdel" load "$port" "$clients" "$per" "$b" || die "loading redis failed"
    out=$("$dir/getdel" run "$port" "$clients" "$per" "$b") || die "getdel failed: $out"
    echo "$out" | grep -q ' misses=0$' || die "GETDEL missed keys: $out"
    echo "$out" | sed -n 's/.*ops_per_sec=\([0-9.]*\).*/\1/p'
}

for persistence in logged unlogged; do
    load_tables "$persistence"
    for ci in "${!configs[@]}"; do
        read -r name p sync tx <<< "${configs[$ci]}"
        [ "$p" = "$persistence" ] || continue
        for ((round = 0; round < ROUNDS; round++)); do
            for clients in "${CLIENT_COUNTS[@]}"; do
                b=$(base_of "$round" "$ci" "$clients")
                # alternate which method goes first
                if (( (round + ci + clients) % 2 == 0 )); then order="idem delete"; else order="delete idem"; fi
                for method in $order; do
                    out=$(run_client "$method" "$sync" "$clients" "$tx" "$b") || exit 1
                    read -r r u w <<<"$out"
                    rate[$method,$name,$clients]="${rate[$method,$name,$clients]:-} $r"
                    cpu[$method,$name,$clients]="${cpu[$method,$name,$clients]:-} $u"
                    wal[$method,$name,$clients]="${wal[$method,$name,$clients]:-} $w"
                    printf '   %-8s %-9s sync=%-3s clients=%s tx=%-7s %10.0f tx/s %8.1f us CPU %6s B WAL\n' \
                        "$method" "$p" "$sync" "$clients" "$tx" "$r" "$u" "$w"
                done
                # Redis right after, so that it meets the same load
                if [ "$sync" = on ] && [ "$p" = logged ]; then kind=aof port=$REDIS_AOF_PORT
                else kind=volatile port=$REDIS_VOLATILE_PORT; fi
                r=$(run_redis "$port" "$clients" "$tx" "$b") || exit 1
                rate[redis,$name,$clients]="${rate[redis,$name,$clients]:-} $r"
                printf '   %-8s %-9s %-8s clients=%s tx=%-7s %10.0f ops/s\n' \
                    redis "$kind" "" "$clients" "$tx" "$r"
            done
        done
    done
done

# ---- the table
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# ratios of the runs made side by side, one per round
paired() { paste -d' ' <(echo "$1" | tr ' ' '\n' | grep -v '^$') <(echo "$2" | tr ' ' '\n' | grep -v '^$') | awk '{ printf "%s ", $1 / $2 }'; }

results=$here/bench/results
mkdir -p "$results"
{
    echo "single-use tokens: consumption rate in transactions (or Redis commands) per second"
    echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; PostgreSQL $(pg_config --version | awk '{ print $2 }'); Redis $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')"
    echo "tokens per run: $TX_SYNC at synchronous_commit=on, $TX_ASYNC otherwise; each table starts with $BACKGROUND tokens more than the runs consume"
    echo "rates: median of $ROUNDS round(s); ratio: idem / other, median of the ratios of runs made side by side"
    echo
    printf '%-52s %7s %10s %10s %7s\n' "idem compared with" clients "idem" "other" ratio
    row() {             # label clients idem-key other-key
        local i o q
        i=$(echo "${rate[$3]}" | median)
        o=$(echo "${rate[$4]}" | median)
        q=$(paired "${rate[$3]}" "${rate[$4]}" | median)
        printf '%-52s %7s %10.0f %10.0f %7.2f\n' "$1" "$2" "$i" "$o" "$q"
    }
    for clients in "${CLIENT_COUNTS[@]}"; do
        row "DELETE ... RETURNING; logged, sync commit on" "$clients" "idem,logged_on,$clients" "delete,logged_on,$clients"
    done
    for clients in "${CLIENT_COUNTS[@]}"; do
        row "DELETE ... RETURNING; logged, sync commit off" "$clients" "idem,logged_off,$clients" "delete,logged_off,$clients"
    done
    for clients in "${CLIENT_COUNTS[@]}"; do
        row "DELETE ... RETURNING; unlogged" "$clients" "idem,unlogged,$clients" "delete,unlogged,$clients"
    done
    for clients in "${CLIENT_COUNTS[@]}"; do
        row "Redis GETDEL, appendfsync always; sync commit on" "$clients" "idem,logged_on,$clients" "redis,logged_on,$clients"
    done
    for clients in "${CLIENT_COUNTS[@]}"; do
        row "Redis GETDEL, no persistence; sync commit off" "$clients" "idem,logged_off,$clients" "redis,logged_off,$clients"
    done
    for clients in "${CLIENT_COUNTS[@]}"; do
        row "Redis GETDEL, no persistence; idem unlogged" "$clients" "idem,unlogged,$clients" "redis,unlogged,$clients"
    done
    echo
    echo "server CPU time per consumption (microseconds, every backend of the run together), median;"
    echo "ratio: DELETE / idem, above 1 when idem uses less"
    printf '%-52s %7s %10s %10s %7s\n' "" clients "idem" "DELETE" ratio
    cpu_row() {         # label clients config
        local i o
        i=$(echo "${cpu[idem,$3,$2]}" | median)
        o=$(echo "${cpu[delete,$3,$2]}" | median)
        printf '%-52s %7s %10.1f %10.1f %7.2f\n' "$1" "$2" "$i" "$o" "$(awk -v a="$i" -v b="$o" 'BEGIN { print (a > 0) ? b / a : 0 }')"
    }
    for clients in "${CLIENT_COUNTS[@]}"; do cpu_row "logged, sync commit on" "$clients" logged_on; done
    for clients in "${CLIENT_COUNTS[@]}"; do cpu_row "logged, sync commit off" "$clients" logged_off; done
    for clients in "${CLIENT_COUNTS[@]}"; do cpu_row "unlogged" "$clients" unlogged; done
    echo
    echo "WAL per consumption (bytes, with the full-page images after each run's checkpoint), median"
    printf '%-52s %7s %10s %10s\n' "" clients "idem" "DELETE"
    for name in logged_on logged_off unlogged; do
        for clients in "${CLIENT_COUNTS[@]}"; do
            printf '%-52s %7s %10.0f %10.0f\n' "$name" "$clients" \
                "$(echo "${wal[idem,$name,$clients]}" | median)" "$(echo "${wal[delete,$name,$clients]}" | median)"
        done
    done
    echo
    echo "every run, in tx/s (one value per round):"
    for k in $(printf '%s\n' "${!rate[@]}" | sort); do
        printf '  %-26s%s\n' "$k" "${rate[$k]}"
    done
} | tee "$results/token.txt"
echo "(saved in bench/results/token.txt)"
ok=1
