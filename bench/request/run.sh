#!/usr/bin/env bash
# Benchmark of request idempotency keys, with pgbench -M prepared: one API
# request per transaction, a new key each time, handled
#
#  - with idem: idem_request_begin (with idem_request_fingerprint of the
#    payload), the business INSERT, idem_request_finish;
#  - by hand, with Stripe's idempotency_keys schema (rocket-rides-atomic):
#    INSERT ... ON CONFLICT DO NOTHING of the key with its request
#    parameters, SELECT ... FOR UPDATE of the key's row (what decides
#    between a new request, a retry and a mismatch), the business INSERT,
#    UPDATE of the key's row with the response.
#
# A second scenario replays: every transaction is a retry of one of the
# ROWS finished requests (a random one), answered with its stored response:
# idem_request_begin against the hand-written SELECT ... FOR UPDATE of the
# key's row (whose parameters the application then compares).
#
# Both tables start with ROWS finished requests.  Every configuration runs
# REPEAT times, the side that goes first alternating; the table shows the
# median TPS and the server's CPU per request, with ratios (target: idem
# >= 1.0 x the hand-written SQL).
#
#   bash bench/request/run.sh
#   DURATION=30 REPEAT=5 CLIENTS="1 8" SYNC_COMMIT=on bash bench/request/run.sh
#
# Runs as root on Debian 12: it builds idem into a private copy of
# PostgreSQL and starts a throwaway server on a Unix socket (PORT, 5651).
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/scripts/common.sh"
need_root

PORT=${PORT:-5651}
ROWS=${ROWS:-200000}
DURATION=${DURATION:-10}
REPEAT=${REPEAT:-3}
CLIENTS=${CLIENTS:-"1 8"}
SYNC_COMMIT=${SYNC_COMMIT:-off}

install_packages
work=$(copy_tree "$here")
dir=$(mktemp -d /tmp/idem-bench-request.XXXXXX)
chmod 755 "$dir"
cleanup() { stop_cluster "$dir/cluster"; rm -rf "$dir" "$work"; }
trap cleanup EXIT

echo "== building in $work"
build_and_install "$work"
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

sql >/dev/null <<'SQL' || die "setup failed"
CREATE EXTENSION idem;
CREATE SCHEMA bench;
-- the business table, one per side
CREATE TABLE bench.payments_idem (id bigserial PRIMARY KEY, amount int NOT NULL,
                                  currency text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE bench.payments_hand (LIKE bench.payments_idem INCLUDING ALL);
-- Stripe's idempotency_keys table, as in rocket-rides-atomic
CREATE TABLE bench.idempotency_keys (
    id              BIGSERIAL   PRIMARY KEY,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    idempotency_key TEXT        NOT NULL CHECK (char_length(idempotency_key) <= 100),
    last_run_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    locked_at       TIMESTAMPTZ DEFAULT now(),
    request_method  TEXT        NOT NULL CHECK (char_length(request_method) <= 10),
    request_params  JSONB       NOT NULL,
    request_path    TEXT        NOT NULL CHECK (char_length(request_path) <= 100),
    response_code   INT         NULL,
    response_body   JSONB       NULL,
    recovery_point  TEXT        NOT NULL CHECK (char_length(recovery_point) <= 50),
    user_id         BIGINT      NOT NULL
);
CREATE UNIQUE INDEX idempotency_keys_user_id_idempotency_key
    ON bench.idempotency_keys (user_id, idempotency_key);
SQL

scripts=$(mktemp -d /tmp/idem-bench-request-scripts.XXXXXX)
chmod 755 "$scripts"
trap 'cleanup; rm -rf "$scripts"' EXIT
cat > "$scripts/idem.sql" <<'EOF2'
\set r random(1000000000000000000, 9200000000000000000)
\set amount random(1, 100000)
BEGIN;
SELECT status FROM idem_request_begin('r' || :r, idem_request_fingerprint(('{"amount": ' || :amount || ', "currency": "EUR"}')::jsonb));
INSERT INTO bench.payments_idem (amount, currency) VALUES (:amount, 'EUR');
SELECT idem_request_finish('r' || :r, 201, ('{"amount": ' || :amount || ', "status": "succeeded"}')::jsonb);
END;
EOF2
cat > "$scripts/hand.sql" <<'EOF2'
\set r random(1000000000000000000, 9200000000000000000)
\set amount random(1, 100000)
BEGIN;
INSERT INTO bench.idempotency_keys (idempotency_key, user_id, request_method, request_params, request_path, recovery_point)
    VALUES ('r' || :r, 1, 'POST', ('{"amount": ' || :amount || ', "currency": "EUR"}')::jsonb, '/charges', 'started')
    ON CONFLICT (user_id, idempotency_key) DO NOTHING;
SELECT id, request_params, response_code, response_body, recovery_point, locked_at
  FROM bench.idempotency_keys WHERE user_id = 1 AND idempotency_key = 'r' || :r FOR UPDATE;
INSERT INTO bench.payments_hand (amount, currency) VALUES (:amount, 'EUR');
UPDATE bench.idempotency_keys
   SET response_code = 201, response_body = ('{"amount": ' || :amount || ', "status": "succeeded"}')::jsonb,
       recovery_point = 'finished', locked_at = NULL
 WHERE user_id = 1 AND idempotency_key = 'r' || :r;
END;
EOF2
cat > "$scripts/idem_replay.sql" <<EOF2
\\set k random(1, $ROWS)
BEGIN;
SELECT status, response_code, response_body FROM idem_request_begin('p' || :k, idem_request_fingerprint(('{"amount": ' || :k || ', "currency": "EUR"}')::jsonb));
END;
EOF2
cat > "$scripts/hand_replay.sql" <<EOF2
\\set k random(1, $ROWS)
BEGIN;
SELECT id, request_params, response_code, response_body, recovery_point, locked_at
  FROM bench.idempotency_keys WHERE user_id = 1 AND idempotency_key = 'p' || :k FOR UPDATE;
END;
EOF2
chmod 644 "$scripts"/*.sql

# Both sides start from ROWS finished requests (and their payments).
reset_side() {
    if [ "$1" = idem ]; then
        sql <<SQL >/dev/null || die "reset of idem failed"
TRUNCATE idem.requests, bench.payments_idem;
INSERT INTO idem.requests (ns, key, fingerprint, attempts, created_at, response_code, response_body, finished_at, expires_at)
    SELECT 'default', 'p' || g,
           idem_request_fingerprint(('{"amount": ' || g || ', "currency": "EUR"}')::jsonb), 1, now(), 201,
           ('{"amount": ' || g || ', "status": "succeeded"}')::jsonb, now(), now() + interval '1 day'
      FROM generate_series(1, $ROWS) g;
INSERT INTO bench.payments_idem (amount, currency) SELECT g, 'EUR' FROM generate_series(1, $ROWS) g;
VACUUM (FREEZE, ANALYZE) idem.requests, bench.payments_idem;
CHECKPOINT;
SQL
    else
        sql <<SQL >/dev/null || die "reset of hand failed"
TRUNCATE bench.idempotency_keys, bench.payments_hand;
INSERT INTO bench.idempotency_keys (idempotency_key, user_id, request_method, request_params, request_path,
                                    recovery_point, response_code, response_body, locked_at)
    SELECT 'p' || g, 1, 'POST', ('{"amount": ' || g || ', "currency": "EUR"}')::jsonb, '/charges',
           'finished', 201, ('{"amount": ' || g || ', "status": "succeeded"}')::jsonb, NULL
      FROM generate_series(1, $ROWS) g;
INSERT INTO bench.payments_hand (amount, currency) SELECT g, 'EUR' FROM generate_series(1, $ROWS) g;
VACUUM (FREEZE, ANALYZE) bench.idempotency_keys, bench.payments_hand;
CHECKPOINT;
SQL
    fi
}

# run_pgbench SCRIPT CLIENTS: prints "tps transactions cpu-us-per-transaction"
run_pgbench() {
    local script=$1 c=$2 threads out t0 t1 tps n
    threads=$(( c < 2 ? c : 2 ))
    t0=$(server_cpu_us "$dir/cluster")
    out=$(as_pg pgbench -h "$dir/cluster" -p "$PORT" -n -M prepared -c "$c" -j "$threads" \
        -T "$DURATION" -f "$scripts/$script.sql" bench 2>&1) || { echo "$out" >&2; die "pgbench failed"; }
    wait_backends_gone "$dir/cluster" "$PORT" bench
    t1=$(server_cpu_us "$dir/cluster")
    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    n=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
    echo "$tps $n $(awk -v d=$((t1 - t0)) -v n="$n" 'BEGIN { printf "%.1f", (n > 0) ? d / n : 0 }')"
}

# after a run, every transaction left one finished request and one payment
check_side() {
    local side=$1 n=$2 got
    if [ "$side" = idem ]; then
        got=$(sql -c "SELECT count(*) FILTER (WHERE response_code = 201 AND owner_pid IS NULL), count(*) FROM idem.requests")
        [ "$got" = "$((ROWS + n))|$((ROWS + n))" ] || echo "warning: idem: $n transactions, requests $got" >&2
        got=$(sql -c "SELECT count(*) FROM bench.payments_idem")
    else
        got=$(sql -c "SELECT count(*) FILTER (WHERE response_code = 201), count(*) FROM bench.idempotency_keys")
        [ "$got" = "$((ROWS + n))|$((ROWS + n))" ] || echo "warning: hand: $n transactions, keys $got" >&2
        got=$(sql -c "SELECT count(*) FROM bench.payments_hand")
    fi
    [ "$got" = "$((ROWS + n))" ] || echo "warning: $side: $n transactions, payments $got" >&2
}

# what the replay scenario relies on: a pre-filled request is replayed
reset_side idem
[ "$(sql -c "SELECT status FROM idem_request_begin('p1', idem_request_fingerprint('{\"amount\": 1, \"currency\": \"EUR\"}'))")" = replay ] ||
    die "a pre-filled request is not replayed"

declare -A tps cpu
record() { tps["$1,$2"]="${tps["$1,$2"]:-} $3"; cpu["$1,$2"]="${cpu["$1,$2"]:-} $4"; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR==0) print 0; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

echo "== $(nproc) CPUs, $(sql -c 'SHOW server_version'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== $REPEAT x $DURATION s per configuration, clients: $CLIENTS, synchronous_commit = $SYNC_COMMIT, $ROWS requests in each table"
for rep in $(seq 1 "$REPEAT"); do
    for c in $CLIENTS; do
        if ((rep % 2)); then order="idem hand idem_replay hand_replay"
        else order="hand idem hand_replay idem_replay"; fi
        for v in $order; do
            reset_side "${v%_replay}"
            read -r r n u <<<"$(run_pgbench "$v" "$c")"
            [ "$v" = "${v%_replay}" ] && check_side "$v" "$n"
            record "$v" "$c" "$r" "$u"
            printf '  run %d  %-11s %2d clients  %10.1f tps  %7.1f us CPU\n' "$rep" "$v" "$c" "$r" "$u"
        done
    done
done

med() { echo "${tps["$1,$2"]}" | median; }
medcpu() { echo "${cpu["$1,$2"]}" | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }

echo
echo "== load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "== one request per transaction (begin, business INSERT, finish): medians of $REPEAT rounds"
printf '%-8s %12s %12s %10s %10s %14s %14s %12s\n' clients "idem tps" "hand tps" "tps ratio" target \
    "idem us CPU" "hand us CPU" "CPU ratio"
for c in $CLIENTS; do
    i=$(med idem "$c"); h=$(med hand "$c"); ic=$(medcpu idem "$c"); hc=$(medcpu hand "$c")
    r=$(ratio "$i" "$h")
    ok=$(awk -v r="$r" 'BEGIN { print (r >= 1.0) ? ">= 1.0 met" : ">= 1.0 MISSED" }')
    printf '%-8s %12.1f %12.1f %10s %10s %14.1f %14.1f %12s\n' "$c" "$i" "$h" "$r" "$ok" "$ic" "$hc" "$(ratio "$hc" "$ic")"
done
echo
echo "== a retry of a finished request, answered with its stored response: medians of $REPEAT rounds"
printf '%-8s %12s %12s %10s %14s %14s %12s\n' clients "idem tps" "hand tps" "tps ratio" \
    "idem us CPU" "hand us CPU" "CPU ratio"
for c in $CLIENTS; do
    i=$(med idem_replay "$c"); h=$(med hand_replay "$c"); ic=$(medcpu idem_replay "$c"); hc=$(medcpu hand_replay "$c")
    printf '%-8s %12.1f %12.1f %10s %14.1f %14.1f %12s\n' "$c" "$i" "$h" "$(ratio "$i" "$h")" "$ic" "$hc" "$(ratio "$hc" "$ic")"
done
echo "  idem: idem_request_begin (replay); hand-written: SELECT ... FOR UPDATE of the key's row"
echo
echo "  tps ratio = idem / hand-written; CPU ratio = hand-written / idem (server CPU per request,"
echo "  every backend of the run together): above 1 when idem does the request for less"
