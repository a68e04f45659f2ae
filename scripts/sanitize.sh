#!/usr/bin/env bash
# Memory-safety run: starts a throwaway server that checks idem's memory
# accesses, runs the regression and isolation suites against it and then
# random calls of idem's functions (test/fuzz/idem_fuzz.pl), and counts the
# reports, which must be none.  Run as root on Debian 12:
#
#   scripts/sanitize.sh                      AddressSanitizer + UBSan
#   SANITIZER=valgrind scripts/sanitize.sh   memcheck (slow: about 10 min)
#   SANITIZE_FUZZ_SECONDS=0 scripts/sanitize.sh     without the random calls
#   SANITIZE_RELAY=0 scripts/sanitize.sh     without idem-relay's TAP tests
#
# SANITIZE_DIR (/tmp/idem-sanitize) keeps the logs; SANITIZE_PORT (5651);
# SANITIZE_FUZZ_SECONDS (60); SANITIZE_RELAY (1 with asan, 0 with valgrind).
#
# Then (asan) idem-relay: scripts/test.sh runs the relay's TAP tests
# (t/090 to t/093: every sink, against real brokers, Kafka's being
# librdkafka's mock cluster; t/095: lost connections and reloads) with
# idem-relay built with ASan, LeakSanitizer and UBSan
# (RELAY_SANITIZE_DIR): the ASan and LeakSanitizer reports, which
# must be none, are files of SANITIZE_DIR/relay; undefined behaviour stops
# the relay with exit code 86, which fails its test.
#
# asan: idem is built with -fsanitize=address,undefined and the server
#   (Debian's, not instrumented) runs with the ASan runtime preloaded.  Finds
#   out-of-bounds accesses to idem's stack frames and globals and to memory
#   from malloc, and undefined behaviour in idem's code (overflows, bad
#   shifts, misaligned or null pointers).  Reports go to the server log.
# valgrind: the server runs under memcheck; finds uses of uninitialised
#   values and bad accesses to malloc'd memory.  Only reports whose stack
#   passes through idem's library are counted (Debian's server is not built
#   with USE_VALGRIND, so its own padding bytes written to files and sockets
#   are reported too); the others are listed apart.
# Neither sees inside palloc'd chunks: the server's allocator is not
# instrumented.  A positive control (a function built the same way with a
# stack overflow, a bad shift and a read of an uninitialised variable) must
# be reported, or the run fails.
#
# The server runs from a private copy of the installation under
# SANITIZE_DIR: the system's $libdir keeps its ordinary idem.so, which other
# servers of the machine load.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/common.sh"
need_root

mode=${SANITIZER:-asan}
dir=${SANITIZE_DIR:-/tmp/idem-sanitize}
port=${SANITIZE_PORT:-5651}
fuzz_seconds=${SANITIZE_FUZZ_SECONDS:-60}
relay_tests=${SANITIZE_RELAY:-1}
[ "$mode" = asan ] || relay_tests=${SANITIZE_RELAY:-0}
case "$relay_tests" in 0|1) ;; *) die "SANITIZE_RELAY must be 0 or 1" ;; esac
[ "$mode" = asan ] || [ "$relay_tests" = 0 ] || die "SANITIZE_RELAY needs SANITIZER=asan"

case "$mode" in
    asan)
        install_packages
        asan=$(gcc -print-file-name=libasan.so)
        [ -e "$asan" ] || die "the ASan runtime of gcc is missing (libasan)"
        asan=$(readlink -f "$asan")
        cflags='-fsanitize=address,undefined -fsanitize-recover=address -fno-omit-frame-pointer -g -O1'
        ldflags='-fsanitize=address,undefined'
        report_re='ERROR: AddressSanitizer|runtime error:'
        ;;
    valgrind)
        install_packages valgrind
        cflags='-g -O1 -fno-omit-frame-pointer'
        ldflags=
        ;;
    *) die "SANITIZER must be asan or valgrind" ;;
esac

# The private installation: the server finds its $libdir and share
# directory relative to its binary.
root=$dir/install
pgbin=$root$PG_BIN
libdir=$root$(pg_config --pkglibdir)
sharedir=$root$(pg_config --sharedir)
pg_private() { runuser -u postgres -- "$pgbin/pg_ctl" -D "$dir/data" "$@"; }
[ -x "$pgbin/pg_ctl" ] && pg_private -m immediate -w stop >/dev/null 2>&1
rm -rf "$dir"
mkdir -p "$(dirname "$pgbin")" "$(dirname "$sharedir")"
cp -a "$(dirname "$PG_BIN")"/. "$(dirname "$pgbin")"/ || die "cannot copy the server"
cp -a "$(pg_config --sharedir)" "$(dirname "$sharedir")"/ || die "cannot copy the share directory"
work=$(copy_tree "$here")
trap 'rm -rf "$work"' EXIT
echo "== building for $mode ($cflags) in $work"
runuser -u postgres -- make -C "$work" -s clean >/dev/null 2>&1 || true
runuser -u postgres -- make -C "$work" -s with_llvm=no \
    PG_CFLAGS="-Wall -Wextra -Wno-unused-parameter $cflags" \
    PG_LDFLAGS="$ldflags" || die "build failed"
make -C "$work" -s with_llvm=no install DESTDIR="$root" >/dev/null || die "install failed"
if [ "$mode" = asan ]; then
    ldd "$libdir/idem.so" | grep -q libasan || die "idem.so is not linked with ASan"
fi

# The positive control, built like idem.
cat > "$dir/control.c" <<'EOF'
#include "postgres.h"
#include "fmgr.h"
PG_MODULE_MAGIC;
PG_FUNCTION_INFO_V1(sanitizer_control);
Datum
sanitizer_control(PG_FUNCTION_ARGS)
{
	volatile char buf[8];
	int32		i = PG_GETARG_INT32(0);
	int32		r;

	buf[i] = 1;							/* overflow when i >= 8 */
	r = buf[i] + (i << PG_GETARG_INT32(1));	/* bad shift when >= 32 */
	if (buf[3] == 42)					/* never initialised */
		r++;
	PG_RETURN_INT32(r);
}
EOF
gcc -shared -fPIC $cflags -I"$(pg_config --includedir-server)" \
    -o "$dir/control.so" "$dir/control.c" $ldflags || die "cannot build the control"
chown -R postgres:postgres "$dir"

mapfile -t conf < <(grep -vE '^\s*(#|$|listen_addresses)' "$work/test/regress.conf")
runuser -u postgres -- "$pgbin/initdb" -D "$dir/data" --locale=C.UTF-8 -E UTF8 -A trust >/dev/null \
    || die "initdb failed"
{
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$dir'"
    echo "port = $port"
    printf '%s\n' "${conf[@]}"
    echo "log_line_prefix = '%m [%p] %a %e: '"
    echo "jit = off"
} >> "$dir/data/postgresql.conf"

if [ "$mode" = asan ]; then
    # The runtime initialises at the first malloc, which in Debian's
    # postgres happens inside bindtextdomain() in libgpg-error's
    # constructor, with gettext's lock held; the initialisation looks up
    # swift_demangle, and the failed lookup's dlerror() takes the same lock,
    # which wedges the process before main().  A stub swift_demangle makes
    # the lookup succeed.
    printf '#include <stddef.h>\n#include <stdint.h>\nchar *swift_demangle(const char *n, size_t l, char *o, size_t *ol, uint32_t f) { return NULL; }\n' \
        > "$dir/swift_demangle_stub.c"
    gcc -shared -fPIC -o "$dir/swift_demangle_stub.so" "$dir/swift_demangle_stub.c" \
        || die "cannot build the swift_demangle stub"
    # ASan and UBSan write their reports to the server's stderr: the log
    runuser -u postgres -- env LD_PRELOAD="$asan $dir/swift_demangle_stub.so" \
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=0:quarantine_size_mb=32:malloc_context_size=20" \
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=0" \
        "$pgbin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null \
        || { cat "$dir/server.log"; die "server did not start"; }
    pid=$(head -1 "$dir/data/postmaster.pid")
    grep -q libasan "/proc/$pid/maps" || die "the postmaster has not loaded the ASan runtime"
else
    # one log per process; each error between markers
    mkdir -p "$dir/valgrind"; chown postgres:postgres "$dir/valgrind"
    cat > "$dir/postgres-valgrind" <<EOF
#!/bin/sh
exec valgrind --quiet --tool=memcheck --trace-children=yes --track-origins=yes \\
    --read-var-info=no --num-callers=40 --error-limit=no --leak-check=no \\
    --error-markers=VALGRINDERROR-BEGIN,VALGRINDERROR-END \\
    --log-file=$dir/valgrind/%p.log "$pgbin/postgres" "\$@"
EOF
    chmod a+rx "$dir/postgres-valgrind"
    runuser -u postgres -- "$pgbin/pg_ctl" -D "$dir/data" -l "$dir/server.log" \
        -p "$dir/postgres-valgrind" -t 600 -w start >/dev/null \
        || { cat "$dir/server.log"; die "server did not start"; }
fi
trap 'pg_private -m fast -w -t 600 stop >/dev/null 2>&1; rm -rf "$work"' EXIT
echo "== $mode server: socket $dir, port $port, libdir $libdir"
export PGHOST=$dir PGPORT=$port PGUSER=postgres

# Reports: ASan and UBSan reports in the server log; valgrind errors that
# are a library's, told by a regular expression matching its file or its
# source files: its frame is in the error's stack, or in the stack of the
# allocation the uninitialised value came from, before any frame of a
# standard_* function of the server.  idem's hooks (ProcessUtility,
# ExecutorRun, ...) are in the stack of most of the server's work, which
# they hand to standard_ProcessUtility and the like: an error there (such as
# the uninitialised padding the server, built without USE_VALGRIND, writes
# to its WAL at COMMIT PREPARED) is the server's own.
# valgrind_errors REGEX DIR PRINT: how many; with PRINT 1, each one first.
valgrind_errors() {
    perl -e '
        my ($lib, $dir, $print) = @ARGV; my $n = 0;
        sub owned {
            for my $l (split /\n/, $_[0]) {
                next unless $l =~ /^==\d+==\s+(?:at|by) 0x[0-9A-Fa-f]+: (\S+)/;
                my $fn = $1;
                return 1 if $l =~ /$lib/;
                return 0 if $fn =~ /^standard_\w+$/;
            }
            return 0;
        }
        for my $f (glob "$dir/*.log") {
            open my $fh, "<", $f or next; local $/; my $t = <$fh>;
            for my $e ($t =~ /VALGRINDERROR-BEGIN(.*?)VALGRINDERROR-END/gs) {
                my ($stack, $origin) = split /created by/, $e, 2;
                next unless owned($stack) || owned($origin // "");
                $n++;
                print "--- $f$e\n" if $print;
            }
        }
        print "$n\n" unless $print;' "$1" "$2" "$3"
}
count_reports() {   # REGEX FILE_OR_DIR
    if [ "$mode" = asan ]; then
        grep -cE "$report_re" "$2"
    else
        valgrind_errors "$1" "$2" 0
    fi
}
where() { if [ "$mode" = asan ]; then echo "$dir/server.log"; else echo "$dir/valgrind"; fi; }

# memcheck does not see stack overflows: there the control only reads the
# uninitialised byte, as overflowing would crash the backend
before=$(count_reports 'control\.(so|c:)' "$(where)")
control_args='8, 40'; [ "$mode" = valgrind ] && control_args='0, 1'
psql -Xq -d postgres -c "CREATE DATABASE sanitizer_control" &&
    psql -Xq -d sanitizer_control \
        -c "CREATE FUNCTION sanitizer_control(int, int) RETURNS int AS '$dir/control.so' LANGUAGE c STRICT" \
        -c "SELECT sanitizer_control($control_args)" >/dev/null
sleep 2
control=$(( $(count_reports 'control\.(so|c:)' "$(where)") - before ))
echo "== positive control: $control reports for an overflow, a bad shift and an uninitialised read"
[ "$control" -ge 1 ] || die "the $mode run does not report errors: see $(where)"
psql -Xq -d postgres -c "DROP DATABASE sanitizer_control"
log_offset=$(wc -l < "$dir/server.log")
if [ "$mode" = valgrind ]; then
    mkdir -p "$dir/valgrind-control"
    mv "$dir"/valgrind/*.log "$dir/valgrind-control/" 2>/dev/null
    # the postmaster's own log stays where it is
    mv "$dir/valgrind-control/$(head -1 "$dir/data/postmaster.pid").log" "$dir/valgrind/" 2>/dev/null
fi

# idem's frames: its library, or one of its source files
idem_re="idem\\.so|\\(($(cd "$work/src" && ls *.c | sed 's/\.c$//' | paste -sd'|' -))\\.c:[0-9]+\\)"

PGXS_DIR=$(pg_config --pkglibdir)/pgxs
as_pg() { runuser -u postgres -- env PATH="$PATH" PGHOST="$dir" PGPORT="$port" "$@"; }
declare -A result

run_suite() {
    local name=$1 prog=$2 ext=$3 subdir=$4 db=$5 outdir=$6 tests
    tests=$(cd "$work" && ls "$subdir"/*."$ext" 2>/dev/null | xargs -n1 basename 2>/dev/null | sed "s/\.$ext\$//" | sort)
    [ -n "$tests" ] || { result[$name]="no tests"; return; }
    echo "== $name"
    (cd "$work" && as_pg "$PGXS_DIR/src/test/$prog" --inputdir=. --outputdir="$outdir" \
        --bindir="$pgbin" --host="$dir" --port="$port" \
        --load-extension=idem --dbname="$db" $tests) >"$dir/$name.log" 2>&1
    local rc=$? p f
    cat "$dir/$name.log"
    p=$(grep -cE '\.\.\. ok|^ok ' "$dir/$name.log")
    f=$(grep -cE '\.\.\. FAILED|^not ok |\.\.\. failed' "$dir/$name.log")
    result[$name]="$p passed, $f failed (exit $rc)"
    if [ $rc != 0 ] && [ -f "$work/$outdir/regression.diffs" ]; then
        cp "$work/$outdir/regression.diffs" "$dir/$name.diffs"
        head -c 5000 "$dir/$name.diffs"
    fi
}
run_suite regress regress/pg_regress sql sql contrib_regression output_regress
run_suite isolation isolation/pg_isolation_regress spec specs isolation_regression output_iso

if [ "$fuzz_seconds" -gt 0 ]; then
    echo "== random calls for $fuzz_seconds s"
    psql -Xq -d postgres -c "CREATE DATABASE fuzz_target" &&
        psql -Xq -d fuzz_target -c "CREATE EXTENSION idem" &&
        psql -Xq -d fuzz_target -f "$work/test/fuzz/setup.sql" >/dev/null
    # slower statements under valgrind: a longer statement_timeout
    timeout_ms=5000; [ "$mode" = valgrind ] && timeout_ms=60000
    PGDATABASE=fuzz_target perl "$work/test/fuzz/idem_fuzz.pl" --seconds "$fuzz_seconds" \
        --sessions 2 --statement-timeout "$timeout_ms" >"$dir/idem_fuzz.out" 2>&1
    rc=$?
    cat "$dir/idem_fuzz.out"
    result[fuzz]="$(grep -E '^statements: ' "$dir/idem_fuzz.out"), $(grep '^verdict' "$dir/idem_fuzz.out") (exit $rc)"
fi

pg_private -m fast -w -t 600 stop >/dev/null
trap 'rm -rf "$work"' EXIT

relay_reports=0
if [ "$relay_tests" = 1 ]; then
    echo "== idem-relay with ASan and UBSan: its TAP tests (scripts/test.sh tap)"
    RELAY_SANITIZE_DIR="$dir/relay" TAP_TESTS='t/09[0-35]_*.pl' bash "$here/scripts/test.sh" tap \
        > "$dir/relay.log" 2>&1
    rc=$?
    grep -E '^(-- |== |!!)|passed, [0-9]+ failed$' "$dir/relay.log"
    result[relay]="$(tail -n 1 "$dir/relay.log") (exit $rc)"
    relay_re='ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:'
    relay_reports=$(cat "$dir"/relay/asan.* 2>/dev/null | grep -cE "$relay_re")
    for f in "$dir"/relay/asan.*; do
        [ -f "$f" ] && { echo "--- $f"; head -n 60 "$f"; }
    done | head -n 400
fi

echo
echo "== $mode reports"
tail -n +"$((log_offset + 1))" "$dir/server.log" > "$dir/server_after_control.log"
if [ "$mode" = asan ]; then
    reports=$(count_reports idem "$dir/server_after_control.log")
    grep -E -A30 "$report_re" "$dir/server_after_control.log" | head -n 400
    others=0
else
    reports=$(count_reports "$idem_re" "$dir/valgrind")
    all=$(count_reports '==' "$dir/valgrind")
    others=$((all - reports))
    valgrind_errors "$idem_re" "$dir/valgrind" 1 | head -n 400
fi
crash=$(grep -cE 'terminated by signal|exited with exit code [2-9]|PANIC|^TRAP:' "$dir/server_after_control.log")

echo
echo "regress:   ${result[regress]}"
echo "isolation: ${result[isolation]}"
[ -n "${result[fuzz]:-}" ] && echo "fuzz:      ${result[fuzz]}"
[ -n "${result[relay]:-}" ] && echo "relay:     ${result[relay]}"
echo "$mode reports in idem: $reports"
[ "$relay_tests" = 1 ] && echo "asan reports in idem-relay: $relay_reports"
[ "$mode" = valgrind ] && echo "valgrind reports outside idem (the server's own, not counted): $others"
echo "crashes in the server log: $crash"
ok=1
[ "$reports" = 0 ] && [ "$crash" = 0 ] && [ "$relay_reports" = 0 ] || ok=0
for k in "${!result[@]}"; do
    case "${result[$k]}" in *"(exit 0)"*|"no tests") ;; *) ok=0 ;; esac
done
if [ $ok = 1 ]; then echo "sanitize verdict: PASS"; else echo "sanitize verdict: FAIL"; fi
[ $ok = 1 ]
