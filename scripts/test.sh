#!/usr/bin/env bash
# Runs every test suite of idem: pg_regress (sql/), isolation (specs/) and
# TAP (t/), each against servers it starts itself, and ends with one line
# "N passed, N failed".  Run as root on Debian 12: it installs what it needs.
#
#   scripts/test.sh              every suite
#   scripts/test.sh regress      only some: regress, isolation, tap
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/common.sh"
need_root

suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(regress isolation tap)

install_packages sqlsmith
work=$(copy_tree "$here")
echo "== building in $work"
build_and_install "$work"

PGXS_DIR=$(pg_config --pkglibdir)/pgxs
passed=0
failed=0

count_pg_regress() {
    # pg_regress prints one line per test ending in "ok" or "FAILED"
    local out=$1 p f
    p=$(grep -E '\.\.\. ok|^ok ' "$out" | wc -l)
    f=$(grep -E '\.\.\. FAILED|^not ok |\.\.\. failed' "$out" | wc -l)
    passed=$((passed + p)); failed=$((failed + f))
    echo "-- $2: $p passed, $f failed"
}

as_pg() { runuser -u postgres -- env PATH="$PATH" "$@"; }

run_regress() {
    local tests
    tests=$(cd "$work" && ls sql/*.sql 2>/dev/null | xargs -n1 basename 2>/dev/null | sed 's/\.sql$//' | sort)
    [ -n "$tests" ] || return 0
    echo "== regress"
    (cd "$work" && as_pg "$PGXS_DIR/src/test/regress/pg_regress" \
        --inputdir=. --bindir="$PG_BIN" --temp-instance=./tmp_check_regress \
        --temp-config=test/regress.conf --load-extension=idem \
        --dbname=contrib_regression $tests) > "$work/regress.log" 2>&1
    local rc=$?
    cat "$work/regress.log"
    count_pg_regress "$work/regress.log" regress
    if [ $rc != 0 ]; then
        [ -f "$work/regression.diffs" ] && head -c 20000 "$work/regression.diffs"
        grep -qE '\.\.\. (ok|FAILED)' "$work/regress.log" || failed=$((failed + 1))
    fi
}

run_isolation() {
    local tests
    tests=$(cd "$work" && ls specs/*.spec 2>/dev/null | xargs -n1 basename 2>/dev/null | sed 's/\.spec$//' | sort)
    [ -n "$tests" ] || return 0
    echo "== isolation"
    (cd "$work" && as_pg "$PGXS_DIR/src/test/isolation/pg_isolation_regress" \
        --inputdir=. --outputdir=output_iso --bindir="$PG_BIN" \
        --temp-instance=./tmp_check_iso --temp-config=test/regress.conf \
        --load-extension=idem --dbname=isolation_regression $tests) > "$work/isolation.log" 2>&1
    local rc=$?
    cat "$work/isolation.log"
    count_pg_regress "$work/isolation.log" isolation
    if [ $rc != 0 ]; then
        [ -f "$work/output_iso/regression.diffs" ] && head -c 20000 "$work/output_iso/regression.diffs"
        grep -qE '\.\.\. (ok|FAILED)' "$work/isolation.log" || failed=$((failed + 1))
    fi
}

run_tap() {
    local files f p fl rc
    files=$(cd "$work" && ls t/*.pl 2>/dev/null | sort)
    [ -n "$files" ] || return 0
    echo "== tap"
    for f in $files; do
        rm -rf "$work/tmp_check"; as_pg mkdir -p "$work/tmp_check"
        (cd "$work" && as_pg env TESTDIR="$work" PG_REGRESS="$PGXS_DIR/src/test/regress/pg_regress" \
            PGPORT=65432 prove -v -I "$PGXS_DIR/src/test/perl" -I . "$f") > "$work/tap.log" 2>&1
        rc=$?
        p=$(grep -cE '^ok [0-9]+' "$work/tap.log")
        fl=$(grep -cE '^not ok [0-9]+' "$work/tap.log")
        if [ $rc != 0 ] && [ "$fl" = 0 ]; then fl=1; fi
        if [ $rc != 0 ]; then
            tail -n 60 "$work/tap.log"
            for log in "$work"/tmp_check/log/*; do
                [ -f "$log" ] && { echo "--- $log"; tail -n 30 "$log"; }
            done
        fi
        passed=$((passed + p)); failed=$((failed + fl))
        echo "-- $f: $p passed, $fl failed"
    done
}

for s in "${suites[@]}"; do
    case "$s" in
        regress) run_regress ;;
        isolation) run_isolation ;;
        tap) run_tap ;;
        *) die "unknown suite $s" ;;
    esac
done

if [ "$failed" = 0 ] && [ -z "${KEEP:-}" ]; then rm -rf "$work"; else echo "work tree kept in $work"; fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
