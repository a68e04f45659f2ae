#!/usr/bin/env bash
# The outbox's steady load alone: for each peer, 4 producers send
# STEADY_RATE messages per second (default 1000), one per transaction, for
# STEADY seconds (default 600) while 4 relays (PgQ 1) deliver them, with
# autovacuum on as shipped; the size of each of the peer's tables and of its
# indexes is sampled every SAMPLE_EVERY seconds (default 60).  run.sh with
# ROUNDS=0: every setting of run.sh applies (PEERS defaults here to
# "idem sl"; sl is not required here; about 10 minutes per peer, plus the
# drain).
#
#   bash bench/outbox/steady.sh
#   PEERS="idem sl ord pgq" bash bench/outbox/steady.sh
set -u
export ROUNDS=0 STEADY=${STEADY:-600} PEERS=${PEERS:-"idem sl"} PGBOSS=${PGBOSS:-0}
exec bash "$(dirname "$0")/run.sh" "$@"
