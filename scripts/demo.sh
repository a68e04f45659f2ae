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
# Then a few calls of the API, and the server is stopped.
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
start_cluster "$dir" "$port" "log_min_messages = warning"

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

echo "== done: every message applied exactly once"
exit 0
