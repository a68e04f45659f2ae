#!/usr/bin/env bash
# Benchmark of ordered streams, with pgbench -M prepared: one message per
# transaction, with a business INSERT beside it, deduplicated
#
#  - offset: idem_offset_advance of the message's offset, over PARTS
#    partitions (each client owns PARTS / clients of them, as a consumer of
#    a group does; the offsets increase per partition);
#  - seq:    idem_seq_accept of the message's number, one producer per client
#            (the numbers increase per producer);
#  - claim:  idem_claim of a new message id, the row-per-message way.
#
# The offsets, numbers and ids all come from one sequence, so that each side
# pays the same for them.  Every configuration runs REPEAT times, the order
# of the sides alternating; the table shows the median TPS and the server's
# CPU per message, with ratios to idem_claim.
#
# Then storage: MESSAGES messages (10,000,000 by default) go through each
# function server-side, one transaction per message for offsets and
# sequences (COMMIT every 1,000 for the claims: their rows are the same
# either way), and the tables' sizes are compared: idem.claims grows by
# bytes per message, idem.offsets and idem.producer_seqs keep one row per
# partition or producer.
#
#   bash bench/stream/run.sh
#   MESSAGES=1000000 DURATION=5 REPEAT=3 bash bench/stream/run.sh    # quick
#
# Runs as root on Debian 12: it builds idem into a private copy of
# PostgreSQL and starts a throwaway server on a Unix socket (PORT, 5671).
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/scripts/common.sh"
need_root

PORT=${PORT:-5671}
DURATION=${DURATION:-10}
REPEAT=${REPEAT:-3}
CLIENTS=${CLIENTS:-"1 8"}
PARTS=${PARTS:-64}
PRODUCERS=${PRODUCERS:-8}
MESSAGES=${MESSAGES:-10000000}
SYNC_COMMIT=${SYNC_COMMIT:-off}

install_packages
work=$(copy_tree "$here")
dir=$(mktemp -d /tmp/idem-bench-stream.XXXXXX)
chmod 755 "$dir"
scripts=$(mktemp -d /tmp/idem-bench-stream-scripts.XXXXXX)
chmod 755 "$scripts"
cleanup() { stop_cluster "$dir/cluster"; rm -rf "$dir" "$work" "$scripts"; }
trap cleanup EXIT

for c in $CLIENTS; do
    [ $((PARTS % c)) = 0 ] || die "PARTS ($PARTS) must be a multiple of every number of clients ($c)"
done

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
CREATE SEQUENCE bench.msg;
-- the business table, one per side
CREATE TABLE bench.events_offset (id bigserial PRIMARY KEY, amount int NOT NULL,
                                  created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE bench.events_seq (LIKE bench.events_offset INCLUDING ALL);
CREATE TABLE bench.events_claim (LIKE bench.events_offset INCLUDING ALL);
-- storage: every message in a transaction of its own
CREATE PROCEDURE bench.fill_offsets(m bigint, parts int) LANGUAGE plpgsql AS $$
BEGIN
    FOR g IN 1..m LOOP
        PERFORM idem_offset_advance('store', 'events', (g % parts)::int, g);
        COMMIT;
    END LOOP;
END $$;
CREATE PROCEDURE bench.fill_seqs(m bigint, producers int) LANGUAGE plpgsql AS $$
BEGIN
    FOR g IN 1..m LOOP
        PERFORM idem_seq_accept('store-' || (g % producers), g);
        COMMIT;
    END LOOP;
END $$;
CREATE PROCEDURE bench.fill_claims(m bigint) LANGUAGE plpgsql AS $$
BEGIN
    FOR b IN 0..(m - 1) / 1000 LOOP
        PERFORM idem_claim('m' || g, 'store')
           FROM generate_series(b * 1000 + 1, least(m, b * 1000 + 1000)) g;
        COMMIT;
    END LOOP;
END $$;
SQL

cat > "$scripts/offset.sql" <<'EOF2'
\set part :client_id + :clients * random(0, :perclient - 1)
\set amount random(1, 100000)
BEGIN;
SELECT idem_offset_advance('bench', 'events', :part, nextval('bench.msg'));
INSERT INTO bench.events_offset (amount) VALUES (:amount);
END;
EOF2
cat > "$scripts/seq.sql" <<'EOF2'
\set amount random(1, 100000)
BEGIN;
SELECT idem_seq_accept('p' || :client_id, nextval('bench.msg'));
INSERT INTO bench.events_seq (amount) VALUES (:amount);
END;
EOF2
cat > "$scripts/claim.sql" <<'EOF2'
\set amount random(1, 100000)
BEGIN;
SELECT idem_claim('m' || nextval('bench.msg'), 'bench');
INSERT INTO bench.events_claim (amount) VALUES (:amount);
END;
EOF2
chmod 644 "$scripts"/*.sql

reset_side() {
    sql <<SQL >/dev/null || die "reset of $1 failed"
TRUNCATE idem.offsets, idem.producer_seqs, idem.claims, bench.events_offset, bench.events_seq,
         bench.events_claim;
VACUUM (FREEZE, ANALYZE) idem.offsets, idem.producer_seqs, idem.claims;
CHECKPOINT;
SQL
}

# run_pgbench SIDE CLIENTS: prints "tps transactions cpu-us-per-transaction"
run_pgbench() {
    local side=$1 c=$2 threads out t0 t1 tps n
    threads=$(( c < 2 ? c : 2 ))
    t0=$(server_cpu_us "$dir/cluster")
    out=$(as_pg pgbench -h "$dir/cluster" -p "$PORT" -n -M prepared -c "$c" -j "$threads" \
        -D clients="$c" -D perclient=$((PARTS / c)) \
        -T "$DURATION" -f "$scripts/$side.sql" bench 2>&1) || { echo "$out" >&2; die "pgbench failed"; }
    wait_backends_gone "$dir/cluster" "$PORT" bench
    t1=$(server_cpu_us "$dir/cluster")
    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    n=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
    echo "$tps $n $(awk -v d=$((t1 - t0)) -v n="$n" 'BEGIN { printf "%.1f", (n > 0) ? d / n : 0 }')"
}

# after a run: one business row per transaction, and idem's rows as promised
check_side() {
    local side=$1 c=$2 n=$3 got want
    got=$(sql -c "SELECT count(*) FROM bench.events_$side")
    [ "$got" = "$n" ] || echo "warning: $side: $n transactions, $got business rows" >&2
    case $side in
        offset) got=$(sql -c "SELECT count(*) FROM idem.offsets"); want=$PARTS
                [ "$n" -lt "$PARTS" ] && want=$got ;;
        seq) got=$(sql -c "SELECT count(*) FROM idem.producer_seqs"); want=$c ;;
        claim) got=$(sql -c "SELECT count(*) FROM idem.claims WHERE ns = 'bench'"); want=$n ;;
    esac
    [ "$got" = "$want" ] || echo "warning: $side: $n transactions, $got rows of idem, $want expected" >&2
}

declare -A tps cpu
record() { tps["$1,$2"]="${tps["$1,$2"]:-} $3"; cpu["$1,$2"]="${cpu["$1,$2"]:-} $4"; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR==0) print 0; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

echo "== $(nproc) CPUs, $(sql -c 'SHOW server_version'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== $REPEAT x $DURATION s per configuration, clients: $CLIENTS, $PARTS partitions, synchronous_commit = $SYNC_COMMIT"
for rep in $(seq 1 "$REPEAT"); do
    for c in $CLIENTS; do
        case $((rep % 3)) in
            1) order="offset seq claim" ;;
            2) order="claim offset seq" ;;
            0) order="seq claim offset" ;;
        esac
        for v in $order; do
            reset_side "$v"
            read -r r n u <<<"$(run_pgbench "$v" "$c")"
            [ -n "${n:-}" ] || die "pgbench of $v failed"
            check_side "$v" "$c" "$n"
            record "$v" "$c" "$r" "$u"
            printf '  run %d  %-7s %2d clients  %10.1f tps  %7.1f us CPU\n' "$rep" "$v" "$c" "$r" "$u"
        done
    done
done

med() { echo "${tps["$1,$2"]}" | median; }
medcpu() { echo "${cpu["$1,$2"]}" | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }

echo
echo "== load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "== one message per transaction (dedup call + business INSERT): medians of $REPEAT rounds"
printf '%-8s %12s %12s %12s %10s %10s %12s %12s %12s %10s %10s\n' clients "offset tps" "seq tps" \
    "claim tps" "offset/cl" "seq/cl" "offset us" "seq us" "claim us" "cl/offset" "cl/seq"
for c in $CLIENTS; do
    o=$(med offset "$c"); s=$(med seq "$c"); k=$(med claim "$c")
    oc=$(medcpu offset "$c"); sc=$(medcpu seq "$c"); kc=$(medcpu claim "$c")
    printf '%-8s %12.1f %12.1f %12.1f %10s %10s %12.1f %12.1f %12.1f %10s %10s\n' "$c" "$o" "$s" "$k" \
        "$(ratio "$o" "$k")" "$(ratio "$s" "$k")" "$oc" "$sc" "$kc" "$(ratio "$kc" "$oc")" "$(ratio "$kc" "$sc")"
done
echo "  tps ratios: offset or seq / claim; us: server CPU per message (every backend of the run);"
echo "  CPU ratios: claim / offset or seq, above 1 when the stream function costs less"

echo
echo "== storage after $MESSAGES messages ($PARTS partitions, $PRODUCERS producers)"
reset_side storage
size() { sql -c "SELECT pg_total_relation_size('$1')"; }
t0=$(date +%s)
sql -c "CALL bench.fill_claims($MESSAGES)" >/dev/null || die "fill_claims failed"
t1=$(date +%s)
sql -c "CALL bench.fill_offsets($MESSAGES, $PARTS)" >/dev/null || die "fill_offsets failed"
t2=$(date +%s)
sql -c "CALL bench.fill_seqs($MESSAGES, $PRODUCERS)" >/dev/null || die "fill_seqs failed"
t3=$(date +%s)
[ "$(sql -c "SELECT count(*) FROM idem.claims WHERE ns = 'store'")" = "$MESSAGES" ] ||
    echo "warning: idem.claims does not hold $MESSAGES claims" >&2
[ "$(sql -c "SELECT count(*), min(\"offset\") = $MESSAGES - $PARTS + 1 OR $MESSAGES < $PARTS FROM idem.offsets")" = "$PARTS|t" ] ||
    echo "warning: idem.offsets does not hold $PARTS partitions at their last offsets" >&2
[ "$(sql -c "SELECT count(*) FROM idem.producer_seqs")" = "$PRODUCERS" ] ||
    echo "warning: idem.producer_seqs does not hold $PRODUCERS producers" >&2
cs=$(size idem.claims); os=$(size idem.offsets); ss=$(size idem.producer_seqs)
sql -c "VACUUM idem.offsets, idem.producer_seqs" >/dev/null
osv=$(size idem.offsets); ssv=$(size idem.producer_seqs)
printf '%-20s %8s %14s %16s %18s %12s\n' table rows "total bytes" "bytes/message" "bytes/row" "fill s"
printf '%-20s %8s %14s %16s %18s %12s\n' idem.claims "$MESSAGES" "$cs" \
    "$(awk -v a="$cs" -v m="$MESSAGES" 'BEGIN { printf "%.1f", a / m }')" \
    "$(awk -v a="$cs" -v m="$MESSAGES" 'BEGIN { printf "%.1f", a / m }')" $((t1 - t0))
printf '%-20s %8s %14s %16s %18s %12s\n' idem.offsets "$PARTS" "$os" \
    "$(awk -v a="$os" -v m="$MESSAGES" 'BEGIN { printf "%.6f", a / m }')" \
    "$(awk -v a="$os" -v m="$PARTS" 'BEGIN { printf "%.1f", a / m }')" $((t2 - t1))
printf '%-20s %8s %14s %16s %18s %12s\n' idem.producer_seqs "$PRODUCERS" "$ss" \
    "$(awk -v a="$ss" -v m="$MESSAGES" 'BEGIN { printf "%.6f", a / m }')" \
    "$(awk -v a="$ss" -v m="$PRODUCERS" 'BEGIN { printf "%.1f", a / m }')" $((t3 - t2))
echo "  sizes with indexes (pg_total_relation_size), autovacuum off, measured at once;"
echo "  after a VACUUM: idem.offsets $osv bytes, idem.producer_seqs $ssv bytes"
echo "  claims: $(awk -v c="$cs" -v o="$os" 'BEGIN { printf "%.0f", c / o }') x the bytes of the offsets after $MESSAGES messages"
