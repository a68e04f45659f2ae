#!/usr/bin/env bash
# Fuzzes idem for a bounded time against one throwaway server, with two
# fuzzers side by side, each in its own database set up by
# test/fuzz/setup.sql (claims, tokens, guarded tables: whatever the
# extension has):
#
#  - sqlsmith: random queries over the whole catalog, which call every
#    function of the server (idem's among them, but rarely: see the report)
#    and read and write idem's tables, each in a transaction rolled back;
#  - test/fuzz/idem_fuzz.pl: random calls of idem's own functions with
#    random arguments (huge, empty, multibyte, NULL, stored and toasted
#    values, odd arrays and intervals) from two sessions, inside
#    transactions, savepoints, two-phase commit, exception blocks, cursors,
#    prepared statements, parallel plans, DDL and DML on idem's tables;
#    and chains of calls on the same objects: requests begun, checkpointed
#    and finished, outbox messages leased then acknowledged or failed,
#    transitions of the rows of guarded tables by their keys.
#
# Then it checks the server log (no backend terminated by a signal, no
# PANIC, no failed assertion), the tables and indexes with amcheck, and
# prints the statements run, the errors by SQLSTATE and how often idem's
# functions were called.  Exits non-zero on a crash, corruption, a hang or
# an internal error (SQLSTATE class XX) raised by a call of idem.
# Run as root on Debian 12:
#
#   scripts/fuzz.sh                      5 minutes (FUZZ_SECONDS=300)
#   FUZZ_SECONDS=60 FUZZ_SEED=42 scripts/fuzz.sh
#
# FUZZ_DIR (/tmp/idem-fuzz) keeps the server log and the reports;
# FUZZ_PORT (5651); FUZZ_PRELOAD=0 runs without shared_preload_libraries;
# FUZZ_KEEP=1 leaves the server running.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/common.sh"
need_root

seconds=${FUZZ_SECONDS:-300}
seed=${FUZZ_SEED:-$(( (RANDOM << 15 | RANDOM) % 1000000 ))}
dir=${FUZZ_DIR:-/tmp/idem-fuzz}
port=${FUZZ_PORT:-5651}
preload=${FUZZ_PRELOAD:-1}

install_packages sqlsmith
command -v sqlsmith >/dev/null || die "sqlsmith is not installed"

stop_cluster "$dir"
rm -rf "$dir"
work=$(copy_tree "$here")
echo "== building in $work"
build_and_install "$work"

settings=("track_functions = all"
          "log_line_prefix = '%m [%p] %a %e: '"
          "log_min_error_statement = error" \
          "log_error_verbosity = verbose"
          "max_prepared_transactions = 10"
          "deadlock_timeout = 100ms"
          "autovacuum_naptime = 5s"
          "jit = off")
[ "$preload" = 1 ] && settings+=("shared_preload_libraries = 'idem'")
start_cluster "$dir" "$port" "${settings[@]}"
export PGHOST=$dir PGPORT=$port PGUSER=postgres
trap '[ -n "${FUZZ_KEEP:-}" ] || stop_cluster "$dir"; rm -rf "$work"' EXIT

for db in fuzz_smith fuzz_target; do
    psql -Xq -d postgres -c "CREATE DATABASE $db" || die "cannot create $db"
    psql -Xq -d "$db" -c "CREATE EXTENSION idem" || die "cannot install idem in $db"
    psql -Xq -d "$db" -f "$work/test/fuzz/setup.sql" >"$dir/setup_$db.log" 2>&1 \
        || { cat "$dir/setup_$db.log"; die "setup of $db failed"; }
done

echo "== fuzzing for $seconds s, seed $seed (server log: $dir/server.log)"
# sqlsmith prints every query it generates; only the ones that mention an
# idem function are counted.
count_idem_queries() {
    perl -ne '
        $q .= $_;
        next unless /;\s*$/;
        $n++;
        if ($q =~ /\bidem_\w+\s*\(/) {
            $i++;
            $f{$1}++ while $q =~ /\b(idem_\w+)\s*\(/g;
        }
        $q = "";
        END {
            printf "sqlsmith queries generated: %d, of which %d call idem functions (%.2f%%)\n",
                $n, $i, $n ? 100 * $i / $n : 0;
            print "  calls written per function: ",
                join(", ", map { "$_ $f{$_}" } sort keys %f), "\n" if %f;
        }'
}
timeout -s INT "$seconds" sqlsmith --verbose --dump-all-queries --seed="$seed" \
    ${FUZZ_MAX_QUERIES:+--max-queries="$FUZZ_MAX_QUERIES"} \
    --target="host=$dir port=$port dbname=fuzz_smith user=postgres" \
    2>"$dir/sqlsmith.err" | count_idem_queries >"$dir/sqlsmith.count" &
smith=$!
PGDATABASE=fuzz_target perl "$work/test/fuzz/idem_fuzz.pl" --seconds "$seconds" \
    --seed "$seed" --sessions 2 >"$dir/idem_fuzz.out" 2>&1
target_rc=$?
wait $smith

failed=0
echo
echo "== sqlsmith"
grep -q '^queries: ' "$dir/sqlsmith.err" || { echo "sqlsmith did not run:"; tail -5 "$dir/sqlsmith.err"; failed=1; }
echo "sqlsmith queries run: $(grep '^queries: ' "$dir/sqlsmith.err" | tail -1 | cut -d' ' -f2)," \
     "$(grep '^error rate: ' "$dir/sqlsmith.err" | tail -1)"
cat "$dir/sqlsmith.count"

echo
echo "== targeted random calls (test/fuzz/idem_fuzz.pl)"
cat "$dir/idem_fuzz.out"
[ $target_rc = 0 ] || failed=1

# Calls that returned (a call that raised an error is not counted by the
# statistics), per database.
function_calls() {
    psql -XAtq -d "$1" -c "
        SELECT coalesce(string_agg(s.funcname || ' ' || s.calls, ', ' ORDER BY s.funcname), 'none'),
               coalesce(sum(s.calls), 0)
          FROM pg_stat_user_functions s
          JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = s.funcid
                          AND d.deptype = 'e'
          JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem'
         WHERE s.calls > 0"
}
echo
echo "== calls of idem's functions that returned (pg_stat_user_functions)"
sleep 1
for db in fuzz_smith fuzz_target; do
    r=$(function_calls "$db")
    echo "$db: total ${r##*|}: ${r%|*}"
done
smith_calls=$(function_calls fuzz_smith); smith_calls=${smith_calls##*|}
if [ "${smith_calls:-0}" -lt 100 ]; then
    echo "note: sqlsmith picks among the server's ~3000 functions, so it calls idem's"
    echo "      rarely and mostly with NULL arguments; the targeted calls above are"
    echo "      what exercises idem."
fi

echo
echo "== consistency of the tables and indexes (amcheck)"
for db in fuzz_smith fuzz_target; do
    # prepared transactions left by a fuzzer that stopped in between
    for gid in $(psql -XAtq -d "$db" -c "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"); do
        psql -Xq -d "$db" -c "ROLLBACK PREPARED '$gid'" >/dev/null 2>&1
    done
    out=$(psql -XAtq -v ON_ERROR_STOP=1 -d "$db" 2>&1 <<'SQL'
CREATE EXTENSION IF NOT EXISTS amcheck;
SELECT count(*) FILTER (WHERE bt_index_check(i.indexrelid, true) IS NOT NULL) || ' btree indexes checked'
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_am am ON am.oid = c.relam AND am.amname = 'btree'
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname IN ('idem', 'fuzz')
 WHERE i.indisvalid AND c.relkind = 'i';
SELECT count(*) || ' corrupt tuples in ' || count(DISTINCT c.oid) || ' of ' ||
       (SELECT count(*) FROM pg_class c2 JOIN pg_namespace n2 ON n2.oid = c2.relnamespace
         WHERE n2.nspname IN ('idem', 'fuzz') AND c2.relkind = 'r') || ' tables'
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname IN ('idem', 'fuzz')
  CROSS JOIN LATERAL verify_heapam(c.oid) v
 WHERE c.relkind = 'r';
SQL
)
    rc=$?
    echo "$db: $(echo "$out" | paste -sd';' -)"
    if [ $rc != 0 ] || ! echo "$out" | grep -q '^0 corrupt tuples'; then
        echo "corruption found in $db"
        failed=1
    fi
done

echo
echo "== server log"
psql -XAtq -d postgres -c "SELECT 1" >/dev/null 2>&1 || { echo "the server does not answer"; failed=1; }
perl "$work/test/fuzz/check_log.pl" "$dir/server.log" | cut -c1-2000
[ "${PIPESTATUS[0]}" = 0 ] || failed=1

echo
if [ $failed = 0 ]; then
    echo "fuzz verdict: PASS (seed $seed, $seconds s)"
else
    echo "fuzz verdict: FAIL (seed $seed, $seconds s; see $dir)"
fi
[ $failed = 0 ]
