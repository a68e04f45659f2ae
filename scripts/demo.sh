#!/usr/bin/env bash
# What idem is for, in one command: workers consume messages from a source
# that delivers some of them more than once, and every message still moves
# money exactly once.  Run as root on a fresh Debian 12:
#
#   bash scripts/demo.sh
#
# It installs the packages it needs, builds and installs idem, starts a
# throwaway server (Unix socket in /tmp/idem-demo, port 5621), sends 20,000
# messages through a source that redelivers 30% of them (shuffled, so copies
# also arrive before the original), and lets 4 worker processes consume
# them.  Each worker credits an account and writes a ledger row in the same
# transaction as idem_claim(msg_id), commits, then acks; now and then a
# worker dies in the middle of a message and its message is delivered again.
# The ledger has no unique constraint: a message applied twice would show.
# Then a few calls of the API (claims, tokens, the guard, request keys, the
# transactional outbox delivered by idem-relay, ordered streams, statistics
# and maintenance), and the server is stopped.
#
# Settings (environment): MESSAGES (20000), REDELIVER (0.3), WORKERS (4),
# KILL_EVERY (a worker dies once per this many deliveries, 2000; 0: never).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/common.sh"
need_root

MESSAGES=${MESSAGES:-20000}
REDELIVER=${REDELIVER:-0.3}
WORKERS=${WORKERS:-4}
KILL_EVERY=${KILL_EVERY:-2000}
dir=/tmp/idem-demo
port=5621

install_packages
work=$(copy_tree "$here")
echo "== building idem in $work"
build_and_install "$work"
runuser -u postgres -- make -s -C "$work/test/chaos" >/dev/null || die "test/chaos does not build"
chaos=$work/test/chaos/chaos

stop_cluster "$dir"
rm -rf "$dir"
trap 'stop_cluster "$dir"; rm -rf "$work"' EXIT
echo "== starting a server in $dir, port $port"
start_cluster "$dir" "$port" "log_min_messages = warning" "shared_preload_libraries = 'idem'"

conn="host=$dir port=$port dbname=postgres"
as_pg() { (cd "$dir" && runuser -u postgres -- env PATH="$PATH" "$@"); }
sql() { as_pg psql -X -q -v ON_ERROR_STOP=1 -d "$conn" "$@"; }

sql -c 'CREATE EXTENSION idem' || die "CREATE EXTENSION idem failed"

echo "== $MESSAGES messages, $(awk "BEGIN { print $REDELIVER * 100 }")% of them redelivered, $WORKERS workers"
as_pg "$chaos" setup -q -d "$conn" --ns demo || die "setup failed"
as_pg "$chaos" produce -q -d "$conn" --messages "$MESSAGES" --redeliver "$REDELIVER" \
    --seed 42 || die "produce failed"
as_pg "$chaos" run -q -d "$conn" --seed 42 --consumers "$WORKERS" \
    --kill-every "$KILL_EVERY" --ns demo || die "the workers failed"
report=$(as_pg "$chaos" check -d "$conn" --ns demo)
check_rc=$?

# The figures of the RESULT line, by name.
fig() { sed -n 's/^RESULT .*\b'"$1"'=\([0-9]*\).*/\1/p' <<<"$report"; }
messages=$(fig messages)
deliveries=$(fig deliveries)
redelivered=$(fig redelivered)
absorbed=$(fig absorbed)
lost=$(fig lost)
twice=$(fig twice)
kills=$(fig kills)
applied=$((messages - lost))
echo
echo "   messages produced                    $messages"
echo "   deliveries to the workers            $deliveries" \
     "($redelivered messages delivered more than once)"
echo "   workers killed in mid-message        $kills (their messages came again)"
echo "   duplicates absorbed by idem_claim    $absorbed"
echo "   messages applied                     $applied (lost: $lost, applied twice: $twice)"
grep -E '^sum of amounts' <<<"$report" | sed 's/^/   /'
grep -E '^every message applied exactly once' <<<"$report" | sed 's/^/   /'
echo
if [ "$check_rc" != 0 ]; then
    echo "$report"
    die "the check failed"
fi

echo "== the API, by hand"
sql -e <<'EOF'
-- the first claim of a message id wins, in the transaction of the work
BEGIN;
SELECT idem_claim('order-42') AS first_time, idem_claim('order-42') AS again;
COMMIT;
-- idem_try_claim never waits
SELECT idem_try_claim('order-42') AS known, idem_try_claim('order-43') AS new;
-- one result per element; a repeated id is true once
SELECT idem_claim_batch(ARRAY['order-42', 'order-44', 'order-44', 'order-45']) AS batch;
-- when a message was claimed; NULL if never
SELECT idem_claim_info('order-42') AS claimed_at, idem_claim_info('order-99') AS never;
-- a claim rolled back is released: the message can be processed again
BEGIN;
SELECT idem_claim('order-46') AS claimed;
ROLLBACK;
SELECT idem_claim('order-46') AS claimed_again;
EOF
[ $? = 0 ] || die "psql failed"

# Another worker holds order-47 in an open transaction: a try says so.
sql -c "BEGIN; SELECT idem_claim('order-47'); SELECT pg_sleep(2); COMMIT" >/dev/null &
holder=$!
for _ in $(seq 50); do
    [ "$(sql -Atc "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'")" = 1 ] && break
    sleep 0.1
done
sql -e -c "SELECT idem_try_claim('order-47') AS while_another_worker_holds_it"
wait "$holder"
sql -e -c "SELECT idem_try_claim('order-47') AS after_it_committed"

echo "== single-use tokens: a double-clicked \"pay\""
sql -e <<'EOF'
CREATE TABLE payments (token text PRIMARY KEY, amount numeric NOT NULL);
-- the server issues a token with the form (51 URL-safe characters, valid 30 minutes)
SELECT idem_token_issue('user:42') AS token \gset
-- the first submission consumes it in the transaction of the payment
BEGIN;
SELECT idem_token_consume(:'token', 'user:42') AS first_click;
INSERT INTO payments VALUES (:'token', 19.99);
COMMIT;
-- the second click finds it consumed: answer "already done"
SELECT idem_token_consume(:'token', 'user:42') AS second_click,
       idem_token_status(:'token', 'user:42') AS status;
-- a token is valid in its scope only
SELECT idem_token_status(:'token', 'user:43') AS in_another_scope;
-- a payment that fails gives the token back: the honest retry succeeds
SELECT idem_token_issue('user:42') AS retry_token \gset
BEGIN;
SELECT idem_token_consume(:'retry_token', 'user:42') AS first_try;
ROLLBACK;
SELECT idem_token_consume(:'retry_token', 'user:42') AS retry;
-- what the table keeps: the SHA-256 digest of each token's random part, not the token
SELECT scope, encode(digest, 'hex') AS digest, consumed_at IS NOT NULL AS consumed
  FROM idem.tokens WHERE scope = 'user:42' ORDER BY consumed;
SELECT count(*) AS payments FROM payments;
EOF
[ $? = 0 ] || die "psql failed"

echo "== state-transition guard: an order's states"
sql -e <<'EOF'
SELECT idem_allow('order', 'new', 'paid'), idem_allow('order', 'paid', 'shipped'),
       idem_allow('order', 'new', 'cancelled');
CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, version bigint NOT NULL DEFAULT 0);
INSERT INTO orders VALUES (4711, 'new');
SELECT idem_guard('orders', 'order', 'status', 'version');
-- a move, its retry, a move the machine does not have, and a late request
SELECT idem_transition('orders', '4711', 'paid', 0) AS pay;
SELECT idem_transition('orders', '4711', 'paid', 0) AS pay_again;
SELECT idem_transition('orders', '4711', 'cancelled') AS cancel_after_payment;
SELECT idem_transition('orders', '4711', 'new') AS late_request_for_new;
SELECT * FROM orders;
EOF
[ $? = 0 ] || die "psql failed"
# any UPDATE, from any code path, is checked too
sql -e -c "UPDATE orders SET status = 'new' WHERE id = 4711" 2>&1 | sed 's/^/   /'

echo "== request idempotency keys: an API call retried with its Idempotency-Key"
sql -e <<'EOF'
CREATE TABLE charges (id bigserial PRIMARY KEY, amount numeric NOT NULL);
-- the first attempt: begin, the business write, the response, in one transaction
BEGIN;
SELECT status AS first_attempt FROM idem_request_begin('key-1', idem_request_fingerprint('{"amount": 19.99}'));
INSERT INTO charges (amount) VALUES (19.99);
SELECT idem_request_finish('key-1', 201, '{"charge": 1, "amount": 19.99}');
COMMIT;
-- the client retries (its payload written otherwise): the first response, exactly
SELECT status AS retry, response_code, response_body
  FROM idem_request_begin('key-1', idem_request_fingerprint('{ "amount":19.990 }'));
-- the same key with another payload: 422
SELECT status AS other_payload FROM idem_request_begin('key-1', idem_request_fingerprint('{"amount": 500}'));
-- a 5xx is not kept: the next attempt runs anew
SELECT status AS attempt FROM idem_request_begin('key-2', idem_request_fingerprint('{"amount": 5}'));
SELECT idem_request_finish('key-2', 503, '{"error": "upstream"}', cache => false);
SELECT status AS next_attempt, attempts FROM idem_request_begin('key-2', idem_request_fingerprint('{"amount": 5}'));
SELECT count(*) AS charges FROM charges;
EOF
[ $? = 0 ] || die "psql failed"

# An attempt that checkpointed and whose worker then left is resumed at
# once, without waiting for its lease; while its worker runs it is in flight.
sql -c "SELECT idem_request_begin('key-3', 'fp', lease => '1 hour')" \
    -c "SELECT idem_request_checkpoint('key-3', 'charged', '{\"charge\": 3}')" \
    -c "SELECT pg_sleep(2)" >/dev/null &
holder=$!
for _ in $(seq 50); do
    [ "$(sql -Atc "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'")" = 1 ] && break
    sleep 0.1
done
sql -e -c "SELECT status AS while_its_worker_runs FROM idem_request_begin('key-3', 'fp')"
wait "$holder"
sql -e -c "SELECT status AS after_its_worker_left, recovery_point, recovery_data FROM idem_request_begin('key-3', 'fp')"

echo "== transactional outbox: messages written with the business change, delivered by idem-relay"
sql -e <<'EOF'
CREATE TABLE shipments (id bigint PRIMARY KEY, order_id bigint NOT NULL);
-- the message commits or rolls back with the business write
BEGIN;
INSERT INTO shipments VALUES (1, 4711);
SELECT idem_outbox_send('shipments', 'order-4711', '{"event": "packed", "shipment": 1}') IS NOT NULL AS sent;
SELECT idem_outbox_send('shipments', 'order-4711', '{"event": "shipped", "shipment": 1}') IS NOT NULL AS sent;
COMMIT;
BEGIN;
INSERT INTO shipments VALUES (2, 4712);
SELECT idem_outbox_send('shipments', 'order-4712', '{"event": "packed", "shipment": 2}') IS NOT NULL AS sent;
ROLLBACK;
SELECT idem_outbox_send('shipments', 'order-4713', '{"event": "packed", "shipment": 3}') IS NOT NULL AS sent;
SELECT topic, pending, leased, dead FROM idem_outbox_stats();
EOF
[ $? = 0 ] || die "psql failed"
# idem-relay leases (in order per key, one message of a key at a time),
# delivers (here to its standard output; RabbitMQ, Kafka, NATS or a webhook
# in production) and acknowledges; --once stops when the outbox is empty
echo "   idem-relay --once --sink stdout (the rolled-back message is not there):"
relay_out=$(as_pg idem-relay --dbname "$conn" --once --log-interval 0 2>/dev/null) || die "idem-relay failed"
sed 's/"id": "[^"]*", //; s/, "headers".*//; s/^/   /' <<<"$relay_out"
sql -e -c "SELECT count(*) AS left_in_outbox FROM idem.outbox"

echo "== ordered streams: a consumer's offsets and a producer's sequence numbers"
sql -e <<'EOF'
-- the offset moves forward only, in the transaction of the work
SELECT idem_offset_advance('billing', 'orders', 0, 41) AS to_41;
SELECT idem_offset_advance('billing', 'orders', 0, 40) AS back_to_40;
SELECT idem_offset_get('billing', 'orders', 0) AS "offset";
-- a producer's sequence numbers: a retry is a duplicate
SELECT idem_seq_accept('checkout', 1) AS first, idem_seq_accept('checkout', 2) AS second,
       idem_seq_accept('checkout', 2) AS retry;
EOF
[ $? = 0 ] || die "psql failed"

echo "== observability: what the calls above did, per namespace (also as Prometheus metrics)"
sql -e <<'EOF'
SELECT ns, kind, operations, duplicates, round(duplicate_rate::numeric, 3) AS duplicate_rate
  FROM idem_stats ORDER BY kind, ns;
SELECT line AS prometheus FROM regexp_split_to_table(idem_metrics(), E'\n') AS line
 WHERE line LIKE 'idem_%_total{%' AND line NOT LIKE '% 0' LIMIT 8;
EOF
[ $? = 0 ] || die "psql failed"

echo "== maintenance: one round of every purge (a background worker also runs them)"
sql -e -c "SELECT * FROM idem_maintenance(10000)"

echo "== done: every message applied exactly once; tokens, transitions, request keys, the outbox, streams and statistics shown above"
exit 0
