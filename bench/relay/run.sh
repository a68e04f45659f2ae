#!/usr/bin/env bash
# Throughput of idem-relay to each sink, beside the outbox's own ceiling, in
# one run on one throwaway cluster:
#
#   ceiling   no relay, no broker: a PL/pgSQL loop of idem_outbox_lease +
#             idem_outbox_ack (one transaction per batch), what any relay
#             could reach at most
#   stdout    idem-relay --sink stdout, its output to /dev/null
#   webhook   --sink webhook to a local receiver (Python's http.server,
#             ThreadingHTTPServer, answering 200 to every POST)
#   rabbitmq  --sink rabbitmq to rabbitmq-server on 127.0.0.1 (publisher
#             confirms, persistent messages, a durable queue)
#   nats      --sink nats to nats-server -js (a file-backed stream; each
#             message acknowledged by the stream)
#   kafka     --sink kafka to librdkafka's mock cluster (test/relay/
#             kafka_mock.c, one broker, in a process of its own: acks=all,
#             idempotent producer, delivery reports awaited)
#
# Every configuration is run for batches of 100 and 1,000 and 1 and 2 relays
# (or ceiling loops): N messages on KEYS keys are sent (one statement, before
# the clock starts), then the relays run with --once until the outbox is
# empty; the rate is N over the time from their start to the last one's
# exit.  A relay with --once exits when a lease comes back empty, which with
# 2 relays may happen while the other one still has leased keys: it then
# finishes alone, and the rate of 2 relays is a little under what it would be.
# The rounds alternate the order of the sinks (rotated, and reversed every
# other round); the table gives the median of the rounds, messages per second
# and the server's CPU per message (every backend of the cluster, from
# /proc, counted once they exited).
#
#   bash bench/relay/run.sh                   N=20000 ROUNDS=3
#   N=5000 ROUNDS=3 bash bench/relay/run.sh   a modest run
#
# Settings (environment): N (default 20000), KEYS (default 5000: a batch of
# 1,000 holds one message per key, so two relays need 2,000 keys at least),
# ROUNDS (default 3), SINKS (default "ceiling stdout webhook rabbitmq nats
# kafka"), PORT (the cluster, default 15601), PORTS_BASE (the brokers take
# PORTS_BASE .. PORTS_BASE+4, default 15610), KEEP=1 keeps the directory.
# Writes the table to stdout and bench/results/relay.md.  Runs as root on
# Debian 12.
set -u -o pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/scripts/common.sh"
need_root

N=${N:-20000}
KEYS=${KEYS:-5000}
ROUNDS=${ROUNDS:-3}
SINKS=${SINKS:-"ceiling stdout webhook rabbitmq nats kafka"}
PORT=${PORT:-15601}
PB=${PORTS_BASE:-15610}
AMQP_PORT=$PB; DIST_PORT=$((PB + 1)); EPMD_PORT=$((PB + 2)); NATS_PORT=$((PB + 3))

install_packages rabbitmq-server nats-server python3-pika librdkafka-dev
work=$(copy_tree "$here")
echo "== building in $work"
build_and_install "$work"
dir=$work/bench
mkdir -p "$dir"; chown postgres:postgres "$dir"
pids=()
renv=()
cleanup() {
    [ ${#renv[@]} -gt 0 ] && env "${renv[@]}" /usr/lib/rabbitmq/bin/rabbitmqctl stop >/dev/null 2>&1
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    if [ -f "$dir/rabbit/rabbit.pid" ]; then kill "$(cat "$dir/rabbit/rabbit.pid")" 2>/dev/null; fi
    # the epmd that rabbitmq-server started, on its own port
    for p in $(ss -Hltnp "sport = :$EPMD_PORT" 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
        kill "$p" 2>/dev/null
    done
    stop_cluster "$dir"
    if [ -z "${KEEP:-}" ]; then rm -rf "$work"; else echo "kept $work"; fi
}
trap cleanup EXIT

start_cluster "$dir" "$PORT" "shared_preload_libraries = 'idem'" "synchronous_commit = off" \
    "max_connections = 50"
psql_() { runuser -u postgres -- env PATH="$PATH" psql -h "$dir" -p "$PORT" -d postgres -X -q -At "$@"; }
psql_ -c "CREATE EXTENSION idem" || die "CREATE EXTENSION failed"
relay=$PG_BIN/idem-relay
[ -x "$relay" ] || die "no idem-relay in $PG_BIN"
export PGHOST=$dir PGPORT=$PORT PGDATABASE=postgres PGUSER=postgres

# ---- the brokers ----
# webhook: a receiver that answers 200
cat > "$dir/receiver.py" <<'EOF'
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
open(sys.argv[1] + ".tmp", "w").write(str(s.server_address[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
s.serve_forever()
EOF
if [[ " $SINKS " == *" webhook "* ]]; then
    /usr/bin/python3 "$dir/receiver.py" "$dir/hook.port" & pids+=($!)
    for i in $(seq 50); do [ -s "$dir/hook.port" ] && break; sleep 0.1; done
    HOOK_URL=http://127.0.0.1:$(cat "$dir/hook.port")/bench
fi

if [[ " $SINKS " == *" rabbitmq "* ]]; then
    r=$dir/rabbit; mkdir -p "$r"; chown rabbitmq: "$r" 2>/dev/null || true
    printf '' > "$r/rabbitmq-env.conf"; echo '[].' > "$r/enabled_plugins"
    echo "listeners.tcp.default = 127.0.0.1:$AMQP_PORT" > "$r/rabbitmq.conf"
    renv=(HOME="$r" RABBITMQ_NODENAME=rabbit-relay-bench@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
          RABBITMQ_NODE_PORT=$AMQP_PORT RABBITMQ_DIST_PORT=$DIST_PORT ERL_EPMD_PORT=$EPMD_PORT
          ERL_EPMD_ADDRESS=127.0.0.1 RABBITMQ_MNESIA_BASE="$r/mnesia" RABBITMQ_LOG_BASE="$r/log"
          RABBITMQ_PID_FILE="$r/rabbit.pid" RABBITMQ_CONF_ENV_FILE="$r/rabbitmq-env.conf"
          RABBITMQ_CONFIG_FILE="$r/rabbitmq.conf" RABBITMQ_ADVANCED_CONFIG_FILE="$r/advanced.config"
          RABBITMQ_ENABLED_PLUGINS_FILE="$r/enabled_plugins")
    env "${renv[@]}" /usr/lib/rabbitmq/bin/rabbitmq-server > "$r/server.out" 2>&1 & pids+=($!)
    env "${renv[@]}" /usr/lib/rabbitmq/bin/rabbitmqctl wait --timeout 90 "$r/rabbit.pid" >/dev/null 2>&1 ||
        { tail -20 "$r/server.out"; die "rabbitmq-server did not start"; }
    rabbit_purge() {
        /usr/bin/python3 - "$AMQP_PORT" <<'EOF'
import sys, pika
c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", int(sys.argv[1])))
ch = c.channel(); ch.queue_declare("bench", durable=True); ch.queue_purge("bench"); c.close()
EOF
    }
    rabbit_purge || die "could not declare the queue"
fi

if [[ " $SINKS " == *" nats "* ]]; then
    nats-server -js -a 127.0.0.1 -p "$NATS_PORT" -sd "$dir/jetstream" -l "$dir/nats.log" & pids+=($!)
    for i in $(seq 100); do grep -q "Server is ready" "$dir/nats.log" 2>/dev/null && break; sleep 0.1; done
    /usr/bin/python3 "$work/test/relay/nats_js.py" "127.0.0.1:$NATS_PORT" stream-create BENCH bench 120 >/dev/null ||
        die "could not create the stream"
fi

if [[ " $SINKS " == *" kafka "* ]]; then
    cc -O2 -o "$dir/kafka_mock" "$work/test/relay/kafka_mock.c" -lrdkafka || die "could not build kafka_mock"
    mkfifo "$dir/kafka.in"
    "$dir/kafka_mock" 1 bench 4 < "$dir/kafka.in" > "$dir/kafka.out" 2> "$dir/kafka.err" & pids+=($!)
    exec 8>"$dir/kafka.in"
    for i in $(seq 100); do [ -s "$dir/kafka.out" ] && break; sleep 0.1; done
    KAFKA_BROKERS=$(grep -E '^[0-9.]+:[0-9]+' "$dir/kafka.out" | head -n 1)
    [ -n "$KAFKA_BROKERS" ] || die "the mock cluster did not start: $(cat "$dir/kafka.err")"
fi

# ---- one measurement ----
fill() {
    psql_ -c "SELECT count(idem_outbox_send('bench', 'k' || (i % $KEYS), jsonb_build_object('n', i)))
              FROM generate_series(1, $N) i" >/dev/null
}

sink_args() {
    case $1 in
        stdout) echo "--sink stdout" ;;
        webhook) echo "--sink webhook --webhook-url $HOOK_URL" ;;
        rabbitmq) echo "--sink rabbitmq --set rabbitmq.url=amqp://guest:guest@127.0.0.1:$AMQP_PORT" ;;
        nats) echo "--sink nats --nats-url nats://127.0.0.1:$NATS_PORT" ;;
        kafka) echo "--sink kafka --set kafka.brokers=$KAFKA_BROKERS" ;;
    esac
}

# run SINK BATCH RELAYS: prints "rate cpu_us_per_msg"
run() {
    local sink=$1 batch=$2 nrel=$3 i t0 t1 cpu0 cpu1 left rps=()
    fill
    wait_backends_gone "$dir" "$PORT" postgres
    cpu0=$(server_cpu_us "$dir")
    t0=$(date +%s.%N)
    for i in $(seq "$nrel"); do
        if [ "$sink" = ceiling ]; then
            psql_ -c "DO \$\$DECLARE ids uuid[]; BEGIN LOOP
                SELECT array_agg(id) INTO ids FROM idem_outbox_lease('ceiling-$i', $batch, '30 seconds');
                EXIT WHEN ids IS NULL; PERFORM idem_outbox_ack(ids); COMMIT; END LOOP; END\$\$" & rps+=($!)
        else
            # shellcheck disable=SC2046
            "$relay" --name "bench-$i" $(sink_args "$sink") --batch "$batch" --once --log-interval 0 \
                --lease 60s --timeout 10s > /dev/null 2>> "$dir/relay.err" & rps+=($!)
        fi
    done
    for i in "${rps[@]}"; do wait "$i" || die "$sink: a relay failed (see $dir/relay.err)"; done
    t1=$(date +%s.%N)
    left=$(psql_ -c "SELECT count(*) FROM idem.outbox")
    [ "$left" = 0 ] || echo "warning: $sink batch $batch relays $nrel left $left messages" >&2
    wait_backends_gone "$dir" "$PORT" postgres
    cpu1=$(server_cpu_us "$dir")
    awk -v n="$N" -v t0="$t0" -v t1="$t1" -v c0="$cpu0" -v c1="$cpu1" \
        'BEGIN { printf "%.0f %.1f\n", n / (t1 - t0), (c1 - c0) / n }'
}

raw=$dir/raw.txt
: > "$raw"
sinks=($SINKS)
for round in $(seq "$ROUNDS"); do
    # rotate, and reverse every other round
    k=$(( (round - 1) % ${#sinks[@]} ))
    order=("${sinks[@]:$k}" "${sinks[@]:0:$k}")
    if [ $((round % 2)) = 0 ]; then
        rev=(); for ((j = ${#order[@]} - 1; j >= 0; j--)); do rev+=("${order[$j]}"); done; order=("${rev[@]}")
    fi
    for s in "${order[@]}"; do
        for b in 100 1000; do
            for r in 1 2; do
                [ "$s" = rabbitmq ] && rabbit_purge
                res=$(run "$s" "$b" "$r")
                [ -n "$res" ] || die "$s, batch $b, $r relays: no result"
                echo "$round $s $b $r $res" | tee -a "$raw"
            done
        done
    done
done

mkdir -p "$here/bench/results"
/usr/bin/python3 - "$raw" "$N" "$KEYS" "$ROUNDS" <<'EOF' | tee "$here/bench/results/relay.md"
import statistics, sys
raw, n, keys, rounds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
data = {}
for line in open(raw):
    rnd, sink, b, r, rate, cpu = line.split()
    data.setdefault((sink, int(b), int(r)), []).append((float(rate), float(cpu)))
order = [s for s in "ceiling stdout webhook rabbitmq nats kafka".split() if any(k[0] == s for k in data)]
print(f"{n} messages on {keys} keys per measurement, median of {rounds} rounds: messages per second "
      "(server CPU per message, µs)\n")
print("| sink | batch 100, 1 relay | batch 100, 2 relays | batch 1000, 1 relay | batch 1000, 2 relays |")
print("|---|---:|---:|---:|---:|")
for s in order:
    cells = []
    for b in (100, 1000):
        for r in (1, 2):
            v = data.get((s, b, r))
            if not v:
                cells.append("")
                continue
            cells.append("%d (%.0f)" % (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)))
    print("| %s | %s |" % (s, " | ".join(cells)))

# Ratios to the ceiling, round by round (the rounds alternate, so load hits
# both alike), then the median: throughput, and server CPU per message.
rows = {}
for line in open(raw):
    rnd, sink, b, r, rate, cpu = line.split()
    rows[(rnd, sink, int(b), int(r))] = (float(rate), float(cpu))
if "ceiling" in order:
    print("\nRatio to the ceiling, median of the rounds' ratios: throughput x (server CPU per message x)\n")
    print("| sink | batch 100, 1 relay | batch 100, 2 relays | batch 1000, 1 relay | batch 1000, 2 relays |")
    print("|---|---:|---:|---:|---:|")
    for s in order:
        if s == "ceiling":
            continue
        cells = []
        for b in (100, 1000):
            for r in (1, 2):
                tr, cr = [], []
                for (rnd, sink, bb, rr), (rate, cpu) in rows.items():
                    c = rows.get((rnd, "ceiling", bb, rr))
                    if sink == s and bb == b and rr == r and c and c[0] > 0 and c[1] > 0:
                        tr.append(rate / c[0])
                        cr.append(cpu / c[1])
                cells.append("%.2f (%.2f)" % (statistics.median(tr), statistics.median(cr)) if tr else "")
        print("| %s | %s |" % (s, " | ".join(cells)))
EOF
