#!/usr/bin/env bash
# Exactly once under faults, for as long as you like: rounds of the harness
# of test/chaos (the same as t/010_exactly_once.pl, bigger and longer).
# Each round produces MESSAGES messages into a source that redelivers,
# consumes them with CONSUMERS processes that are killed at every point of
# their path, terminates their backends, crashes and restarts the server
# CRASHES times, then checks that every message was applied exactly once.
# Run as root on Debian 12.
#
#   bash scripts/chaos.sh                           one round of 1,000,000
#   MESSAGES=100000 DURATION=3600 bash scripts/chaos.sh   rounds for an hour
#
# Settings (environment): MESSAGES (1000000), DURATION (0: one round;
# otherwise seconds, rounds start until it has passed), CONSUMERS (4),
# CRASHES (per round, 3 per 100,000 messages, at least 3), KILL_EVERY (a
# consumer dies once per this many deliveries, 1000), TERMINATE_MS (a
# backend terminated every this many ms, 500), SIGKILL_MS (a consumer
# SIGKILLed from outside every this many ms, 2000), REDELIVER (share of
# messages with extra copies, 0.35), SEED (of the first round; random),
# FSYNC (off: the faults are process crashes, which lose nothing the kernel
# was given; "on" for a slower, fully durable server).
#
# The server listens on a Unix socket in DIR (/tmp/idem-chaos), port PORT
# (5611).  Its log and the output of failed rounds are kept there.  A second
# run with the same DIR waits for the first to end rather than stop its
# server.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/common.sh"
need_root

MESSAGES=${MESSAGES:-1000000}
DURATION=${DURATION:-0}
CONSUMERS=${CONSUMERS:-4}
CRASHES=${CRASHES:-$(( MESSAGES * 3 / 100000 > 3 ? MESSAGES * 3 / 100000 : 3 ))}
KILL_EVERY=${KILL_EVERY:-1000}
TERMINATE_MS=${TERMINATE_MS:-500}
SIGKILL_MS=${SIGKILL_MS:-2000}
REDELIVER=${REDELIVER:-0.35}
SEED=${SEED:-$(( (RANDOM << 15) | RANDOM ))}
FSYNC=${FSYNC:-off}
dir=${DIR:-/tmp/idem-chaos}
port=${PORT:-5611}
case $dir in /*) ;; *) die "DIR must be an absolute path" ;; esac
exec 9>"$dir.lock"
flock 9

install_packages
work=$(copy_tree "$here")
echo "== building in $work"
build_and_install "$work"
runuser -u postgres -- make -s -C "$work/test/chaos" || die "test/chaos does not build"
chaos=$work/test/chaos/chaos

stop_cluster "$dir"
rm -rf "$dir"
start_cluster "$dir" "$port" "fsync = $FSYNC" "log_min_messages = warning" \
    "max_connections = $(( CONSUMERS * 2 + 20 ))"
cleanup() {
    stop_cluster "$dir"
    rm -rf "$work"
}
trap cleanup EXIT

conn="host=$dir port=$port dbname=postgres"
data=$dir/data
as_pg() { (cd "$dir" && runuser -u postgres -- env PATH="$PATH" "$@"); }

echo "== $MESSAGES messages a round, $CONSUMERS consumers, $CRASHES crashes a round," \
     "a kill per $KILL_EVERY deliveries, a termination every ${TERMINATE_MS}ms"
start=$(date +%s)
round=0
failed=0
while :; do
    round=$((round + 1))
    seed=$((SEED + round - 1))
    out=$dir/round-$round.out
    echo "== round $round (seed $seed)"
    as_pg "$chaos" setup -d "$conn" || die "setup failed"
    as_pg "$chaos" produce -d "$conn" --messages "$MESSAGES" --redeliver "$REDELIVER" \
        --seed "$seed" || die "produce failed"
    as_pg "$chaos" run -d "$conn" --seed "$seed" --consumers "$CONSUMERS" \
        --kill-every "$KILL_EVERY" --terminate-ms "$TERMINATE_MS" --sigkill-ms "$SIGKILL_MS" \
        --crashes "$CRASHES" --timeout-s $(( MESSAGES / 100 + 600 )) \
        --crash-cmd "pg_ctl -D '$data' -m immediate stop >/dev/null 2>&1" \
        --crash-cmd "kill -KILL \$(head -n 1 '$data/postmaster.pid')" \
        --start-cmd "pg_ctl -w -D '$data' -l '$dir/server.log' start >/dev/null 2>&1" \
        || die "round $round: the run failed (seed $seed)"
    as_pg "$chaos" check -d "$conn" > "$out"
    rc=$?
    grep -v '^RESULT' "$out"
    # an error other than a lost connection does not break exactly-once
    # (the message is redelivered) but is a bug all the same
    unexpected=$(sed -n 's/^RESULT .* unexpected=\([0-9]*\).*/\1/p' "$out")
    if [ "$rc" = 0 ] && [ "${unexpected:-0}" = 0 ]; then
        rm -f "$out"
    else
        echo "round $round FAILED (seed $seed); output kept in $out"
        failed=$((failed + 1))
    fi
    [ "$DURATION" -gt 0 ] && [ $(( $(date +%s) - start )) -lt "$DURATION" ] || break
done

echo "== $round round(s) in $(( $(date +%s) - start ))s, $failed failed"
[ "$failed" = 0 ]
