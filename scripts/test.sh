#!/usr/bin/env bash
# Runs every test suite of idem: pg_regress (sql/), isolation (specs/), TAP
# (t/), each against servers it starts itself, and the Debian package
# (debian/), and ends with one line "N passed, N failed".  Run as root on
# Debian 12: it installs what it needs.
#
#   scripts/test.sh              every suite
#   scripts/test.sh regress      only some: regress, isolation, tap, citus, package
#   TAP_TESTS=t/090_relay.pl scripts/test.sh tap     only some TAP files (a glob)
#
# The citus suite needs Citus in the system's PostgreSQL; when it is not
# there, it is built from the tarball $CITUS_SOURCE (with the patches beside
# it) and installed before the private copy of PostgreSQL is made.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/common.sh"
need_root

suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(regress isolation tap citus package)

install_packages sqlsmith python3-prometheus-client rabbitmq-server python3-pika python3-psycopg2 nats-server curl python3-confluent-kafka
work=$(copy_tree "$here")

# Citus in the system's PostgreSQL, built from $CITUS_SOURCE when missing
# (3 to 6 minutes on 2 cores).  The build runs in the background, at the
# lowest priority, while the other suites run: start_citus_build begins it,
# citus_ready waits for it, sets citus_missing to why Citus could not be
# had, and adds Citus to the private copy of PostgreSQL, made meanwhile.  A
# lock keeps two runs from building at once.
SYS_PG_CONFIG=/usr/lib/postgresql/$PG_MAJOR/bin/pg_config
# Without CITUS_SOURCE, the tarball kept beside the repository, if any.
if [ -z "${CITUS_SOURCE:-}" ]; then
    CITUS_SOURCE=$(ls "$here"/../shared/vendor/citus/citus-*.tar.gz 2>/dev/null | head -n 1)
fi
citus_missing=
citus_pid=
citus_waited=
citus_installed() {
    [ -f "$($SYS_PG_CONFIG --pkglibdir)/citus.so" ] &&
        [ -f "$($SYS_PG_CONFIG --sharedir)/extension/citus.control" ]
}
# build_citus SRC DIR: the build; the last line it prints says why it
# failed, if it did.
build_citus() {
    local src=$1 dir=$2 log=$2/build.log start=$SECONDS p f
    exec 8>/run/lock/idem-citus-build.lock
    flock -w 1200 8 || { echo "another run holds /run/lock/idem-citus-build.lock"; return 1; }
    if citus_installed; then return 0; fi
    tar -xzf "$src" -C "$dir" || { echo "$src could not be unpacked"; return 1; }
    p=$(ls -d "$dir"/citus-*/ | head -n 1)
    for f in "$(dirname "$src")"/*.patch; do
        [ -f "$f" ] || continue
        patch -d "$p" -p1 -s < "$f" >>"$log" 2>&1 || { echo "patch $f did not apply"; return 1; }
    done
    # the extension only: no regression test tools, no libcurl
    (cd "$p" && ./configure --without-libcurl PG_CONFIG="$SYS_PG_CONFIG" &&
        make -s -j2 with_llvm=no extension && make -s with_llvm=no install-extension) >>"$log" 2>&1 ||
        { tail -n 30 "$log"; echo "the build of Citus failed"; return 1; }
    citus_installed || { echo "Citus built but not installed"; return 1; }
    echo "-- Citus built and installed in $((SECONDS - start)) s, in the background"
}
start_citus_build() {
    local src=${CITUS_SOURCE:-} dir=$work/citus-build
    citus_installed && return
    if [ -z "$src" ] || [ ! -f "$src" ]; then
        citus_missing="Citus is not installed and CITUS_SOURCE (${src:-unset}) is not a Citus tarball"
        return
    fi
    echo "== building Citus from $src, in the background"
    install_packages liblz4-dev libzstd-dev libkrb5-dev libselinux1-dev libpam0g-dev zlib1g-dev \
        libssl-dev libreadline-dev libxslt1-dev libxml2-dev autoconf
    mkdir -p "$dir"
    (renice -n 19 -p "$BASHPID" >/dev/null; build_citus "$src" "$dir") > "$dir/result" 2>&1 &
    citus_pid=$!
}
# citus_ready: waits for the build, once, and copies into the private copy
# of PostgreSQL, if it was made, the files of the system's it lacks.
citus_ready() {
    local pg=$work/pg
    [ -z "$citus_waited" ] || return 0
    citus_waited=1
    [ -n "$citus_pid" ] || return 0
    echo "== waiting for the build of Citus"
    if ! wait "$citus_pid"; then
        cat "$work/citus-build/result"
        citus_missing=$(tail -n 1 "$work/citus-build/result")
        return
    fi
    cat "$work/citus-build/result"
    if [ -d "$pg" ]; then
        cp -an "$($SYS_PG_CONFIG --pkglibdir)"/. "$pg/lib/postgresql/$PG_MAJOR/lib"/ &&
            cp -an "$($SYS_PG_CONFIG --sharedir)"/. "$pg/share/postgresql/$PG_MAJOR"/ &&
            chown -R postgres:postgres "$pg" ||
            citus_missing="Citus could not be copied into $pg"
    fi
}
if printf '%s\n' "${suites[@]}" | grep -qx citus; then
    start_citus_build
fi

# sanitize_relay DIR (RELAY_SANITIZE_DIR, set by scripts/sanitize.sh): the
# installed idem-relay is built again with ASan, LeakSanitizer and UBSan.
# ASan and LeakSanitizer write their reports to files DIR/asan.PID and
# change no exit status, so that the TAP tests of the relay run as usual;
# UBSan (whose reports, with ASan, go to standard error only) stops the
# relay at the first undefined behaviour with exit code 86, which no test
# expects.
sanitize_relay() {
    local dir=$1 flags='-fsanitize=address,undefined -fsanitize-recover=address -fno-sanitize-recover=undefined'
    local asan_opts=halt_on_error=0:detect_leaks=1:malloc_context_size=20 out
    install -d -o postgres -m 0755 "$dir"
    rm -f "$dir"/asan.* "$dir"/control.* "$work"/relay/*.o "$work/relay/idem-relay"
    runuser -u postgres -- make -C "$work" -s with_llvm=no PG_CONFIG="$PG_BIN/pg_config" \
        PG_CFLAGS="$BUILD_FLAGS $flags -fno-omit-frame-pointer -g -O1" \
        PG_LDFLAGS="-fsanitize=address,undefined" relay/idem-relay || die "sanitized build of idem-relay failed"
    install -m 0755 "$work/relay/idem-relay" "$PG_BIN/idem-relay" || die "cannot install idem-relay"
    ldd "$PG_BIN/idem-relay" | grep -q libasan || die "idem-relay is not linked with ASan"
    export ASAN_OPTIONS="log_path=$dir/asan:$asan_opts" LSAN_OPTIONS=exitcode=0
    export UBSAN_OPTIONS=print_stacktrace=1:exitcode=86
    # positive controls, built and run the same way: a heap overflow and a
    # leak reported in DIR/control.*, a bad shift that stops the program
    printf '%s\n' '#include <stdlib.h>' '#include <string.h>' \
        'int main(int argc, char **argv) { char *p = malloc(9);' \
        '  if (argc > 1 && strcmp(argv[1], "ubsan") == 0) return 1 << (argc + 40);' \
        '  p[argc + 8] = 1; p = NULL; return 0; }' > "$dir/sanitizer-control.c"
    gcc $flags -g -O0 -o "$dir/control" "$dir/sanitizer-control.c" || die "cannot build the sanitizers' control"
    chown postgres "$dir/control"
    runuser -u postgres -- env ASAN_OPTIONS="log_path=$dir/control:$asan_opts" "$dir/control" >/dev/null 2>&1
    grep -qs 'heap-buffer-overflow' "$dir"/control.* && grep -qs 'LeakSanitizer' "$dir"/control.* ||
        die "the ASan control was not reported in $dir"
    out=$(runuser -u postgres -- env UBSAN_OPTIONS="$UBSAN_OPTIONS" "$dir/control" ubsan 2>&1)
    [ $? = 86 ] || die "the UBSan control did not stop with exit code 86"
    echo "$out" | grep -q 'runtime error: shift' || die "the UBSan control was not reported: $out"
    echo "-- idem-relay built with ASan and UBSan; reports go to $dir (the controls were reported)"
}
# The package suite builds and installs on its own: the private copy of
# PostgreSQL is for the others.
if printf '%s\n' "${suites[@]}" | grep -qvx package; then
    echo "== building in $work"
    build_and_install "$work"
    [ -z "${RELAY_SANITIZE_DIR:-}" ] || sanitize_relay "$RELAY_SANITIZE_DIR"
fi

PGXS_DIR=$(pg_config --pkglibdir)/pgxs
passed=0
failed=0

count_pg_regress() {
    # pg_regress prints one line per test ending in "ok" or "FAILED"; a
    # test it never got to (it stops at a missing expected file) failed
    local out=$1 p f expected=$3
    p=$(grep -E '\.\.\. ok|^ok ' "$out" | wc -l)
    f=$(grep -E '\.\.\. FAILED|^not ok |\.\.\. failed' "$out" | wc -l)
    if [ -n "$expected" ] && [ $((p + f)) -lt "$expected" ]; then
        echo "-- $2: $((expected - p - f)) of $expected tests did not run"
        f=$((expected - p))
    fi
    passed=$((passed + p)); failed=$((failed + f))
    echo "-- $2: $p passed, $f failed"
}

as_pg() { runuser -u postgres -- env PATH="$PATH" "$@"; }

run_regress() {
    local tests
    tests=$(cd "$work" && ls sql/*.sql 2>/dev/null | xargs -n1 basename 2>/dev/null | sed 's/\.sql$//' | sort)
    [ -n "$tests" ] || return 0
    echo "== regress"
    local start=$SECONDS
    (cd "$work" && as_pg "$PGXS_DIR/src/test/regress/pg_regress" \
        --inputdir=. --bindir="$PG_BIN" --temp-instance=./tmp_check_regress \
        --temp-config=test/regress.conf --load-extension=idem \
        --dbname=contrib_regression $tests) > "$work/regress.log" 2>&1
    local rc=$?
    cat "$work/regress.log"
    count_pg_regress "$work/regress.log" "regress ($((SECONDS - start)) s)" "$(echo "$tests" | wc -w)"
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
    local start=$SECONDS
    (cd "$work" && as_pg "$PGXS_DIR/src/test/isolation/pg_isolation_regress" \
        --inputdir=. --outputdir=output_iso --bindir="$PG_BIN" \
        --temp-instance=./tmp_check_iso --temp-config=test/regress.conf \
        --load-extension=idem --dbname=isolation_regression $tests) > "$work/isolation.log" 2>&1
    local rc=$?
    cat "$work/isolation.log"
    count_pg_regress "$work/isolation.log" "isolation ($((SECONDS - start)) s)" "$(echo "$tests" | wc -w)"
    if [ $rc != 0 ]; then
        [ -f "$work/output_iso/regression.diffs" ] && head -c 20000 "$work/output_iso/regression.diffs"
        grep -qE '\.\.\. (ok|FAILED)' "$work/isolation.log" || failed=$((failed + 1))
    fi
}

# build_releases: each release of test/upgrade/releases built from the
# repository's history, with the compiler of today, into a private copy of
# PostgreSQL of its own, $work/pg-VERSION (its idem.so and scripts only),
# which the TAP tests find in IDEM_PG_<VERSION with underscores>.  A clone
# without that history gets a line saying so, and the tests that need the
# release skip.
release_env=()
build_releases() {
    local ver commit dst src
    while read -r ver commit; do
        case "$ver" in ''|'#'*) continue ;; esac
        dst=$work/pg-$ver src=$work/release-$ver
        if ! git -C "$here" cat-file -e "$commit^{commit}" 2>/dev/null; then
            echo "-- release $ver: commit $commit is not in this clone; its upgrade test skips"
            continue
        fi
        rm -rf "$dst" "$src"
        mkdir -p "$src"
        git -C "$here" archive "$commit" | tar -x -C "$src" &&
            cp -a "$work/pg" "$dst" &&
            rm -rf "$dst/lib/postgresql/$PG_MAJOR/lib/idem.so" "$dst/lib/postgresql/$PG_MAJOR/lib/bitcode/idem" \
                "$dst/lib/postgresql/$PG_MAJOR/lib/bitcode/idem.index.bc" \
                "$dst/share/postgresql/$PG_MAJOR/extension"/idem[.-]* &&
            chown -R postgres:postgres "$src" "$dst" ||
            die "could not prepare the build of release $ver"
        runuser -u postgres -- make -C "$src" -s with_llvm=no \
            PG_CONFIG="$dst/lib/postgresql/$PG_MAJOR/bin/pg_config" install > "$src/build.log" 2>&1 ||
            { tail -n 30 "$src/build.log"; die "the build of release $ver failed"; }
        release_env+=("IDEM_PG_${ver//./_}=$dst/lib/postgresql/$PG_MAJOR")
        echo "-- release $ver built from $commit"
    done < "$work/test/upgrade/releases"
}

# Seconds a TAP file took alone on 2 cores, to share the files between the
# lanes (a file not listed counts 10).
tap_weight() {
    case "$(basename "$1" .pl)" in
        010_*) echo 113 ;; 093_*) echo 82 ;; 095_*) echo 64 ;; 091_*) echo 63 ;; 090_*) echo 60 ;;
        085_*) echo 49 ;; 005_*) echo 32 ;; 030_*) echo 23 ;; 092_*) echo 22 ;; 080_*) echo 19 ;;
        002_*) echo 18 ;; 070_*) echo 17 ;; *) echo 10 ;;
    esac
}

# tap_file F PORTLOCK: one TAP file, in a directory of its own (its
# tmp_check, its log, and a line "PASSED FAILED RC SECONDS").
tap_file() {
    local f=$1 portlock=$2 dir start=$SECONDS rc p fl
    dir=$work/tap/$(echo "$f" | tr / _)
    rm -rf "$dir"; install -d -o postgres "$dir" "$dir/tmp_check"
    (cd "$work" && as_pg env TESTDIR="$dir" PG_REGRESS="$PGXS_DIR/src/test/regress/pg_regress" \
        "${release_env[@]}" PGPORT="$3" PG_TEST_PORT_DIR="$portlock" prove -v -I "$PGXS_DIR/src/test/perl" -I . "$f") > "$dir/tap.log" 2>&1
    rc=$?
    p=$(grep -cE '^ok [0-9]+' "$dir/tap.log")
    fl=$(grep -cE '^not ok [0-9]+' "$dir/tap.log")
    echo "$p $fl $rc $((SECONDS - start))" > "$dir/result"
}

# run_tap PATTERN PORT: the TAP files, in TAP_LANES lanes (2 by default)
# that run at once, each file after the other within its lane: most of a
# file's time is spent waiting (for servers to start, stop and recover, for
# brokers, for leases to run out), so two lanes take little more than half
# the time of one.  The files are shared out by their weights, the heaviest
# first, each to the lane with the least so far; every file has servers,
# ports (taken under locks) and directories of its own.  The results are
# printed in the files' order once every lane is done.
run_tap() {
    local files f p fl rc secs portlock start=$SECONDS pattern=${1:-t/*.pl} port=${2:-65432}
    local nlanes=${TAP_LANES:-2} i best w dir
    files=$(cd "$work" && ls $pattern 2>/dev/null | sort)
    [ -n "$files" ] || return 0
    echo "== tap ($pattern, $nlanes lanes)"
    # Ports are taken under locks in one directory for every run on the
    # machine: a test that frees a port for a while (a broker it restarts)
    # keeps it from another run's tests.  In postgres's home, not /tmp,
    # where another user could make it first.
    portlock="$(getent passwd postgres | cut -d: -f6)/idem-portlock"
    install -d -o postgres -m 0755 "$portlock"
    install -d -o postgres "$work/tap"
    local -a load lane pids
    for ((i = 0; i < nlanes; i++)); do load[i]=0; lane[i]=; done
    for f in $(for f in $files; do echo "$(tap_weight "$f") $f"; done | sort -k1,1nr -k2 | cut -d' ' -f2); do
        best=0
        for ((i = 1; i < nlanes; i++)); do [ "${load[i]}" -lt "${load[best]}" ] && best=$i; done
        w=$(tap_weight "$f")
        load[best]=$((load[best] + w))
        lane[best]="${lane[best]} $f"
    done
    for ((i = 0; i < nlanes; i++)); do
        (for f in $(printf '%s\n' ${lane[i]} | sort); do tap_file "$f" "$portlock" $((port + 100 * i)); done) &
        pids[i]=$!
    done
    for ((i = 0; i < nlanes; i++)); do wait "${pids[i]}"; done
    for f in $files; do
        dir=$work/tap/$(echo "$f" | tr / _)
        read -r p fl rc secs < "$dir/result" 2>/dev/null || { p=0; fl=0; rc=1; secs=0; }
        if [ "$rc" != 0 ] && [ "$fl" = 0 ]; then fl=1; fi
        if [ "$rc" != 0 ]; then
            tail -n 60 "$dir/tap.log"
            for log in "$dir"/tmp_check/log/*; do
                [ -f "$log" ] && { echo "--- $log"; tail -n 30 "$log"; }
            done
        fi
        passed=$((passed + p)); failed=$((failed + fl))
        echo "-- $f: $p passed, $fl failed ($secs s)"
    done
    echo "-- tap ($pattern): $((SECONDS - start)) s"
}

# The citus suite: the TAP tests of t/citus/, each with a coordinator and
# workers that load Citus.  Without Citus it fails, loudly.
run_citus() {
    citus_ready
    if [ -n "$citus_missing" ] || ! citus_installed; then
        echo "== citus"
        echo "!!!!!!!! THE CITUS SUITE CANNOT RUN: ${citus_missing:-Citus is not installed} !!!!!!!!"
        failed=$((failed + 1))
        return
    fi
    run_tap 't/citus/*.pl' 65400
}

# The package suite: META.json checked against the PGXN spec; the Debian
# package built from a fresh copy of the tree with pg_buildext (as
# postgres, the project's -Werror flags) and checked by lintian; installed
# into the system's PostgreSQL 15 with apt; the pg_regress suite run against
# that installation; the package purged.  One test each, plus one per
# pg_regress test.  It uses the system's PostgreSQL only: PATH loses the
# private copy that build_and_install put first.  Files of idem that were in
# the system's directories without a package (a "make install") are moved
# aside while the package is installed and put back after the purge, so the
# machine is left as it was; a lock keeps two runs from sharing the window.
PKG=postgresql-$PG_MAJOR-idem
SYS_BIN=/usr/lib/postgresql/$PG_MAJOR/bin
SYS_LIB=/usr/lib/postgresql/$PG_MAJOR/lib
SYS_SHARE=/usr/share/postgresql/$PG_MAJOR
pkg_installed=
pkg_saved=

pkg_step=0
pkg_result() {
    local took=$((SECONDS - pkg_step))
    pkg_step=$SECONDS
    if [ "$2" = 0 ]; then passed=$((passed + 1)); echo "-- package $1: ok ($took s)"
    else failed=$((failed + 1)); echo "-- package $1: FAILED ($took s)"; fi
}

# The files of idem in the system's directories, whoever put them there.
sys_idem_files() {
    ls -d "$SYS_LIB"/idem.so "$SYS_LIB"/bitcode/idem "$SYS_LIB"/bitcode/idem.index.bc \
        "$SYS_SHARE"/extension/idem.control "$SYS_SHARE"/extension/idem--*.sql "$SYS_BIN"/idem-relay 2>/dev/null
}

# Purges the package if this run installed it and puts back what was moved
# aside; also run on exit, should the suite be interrupted.
package_cleanup() {
    local rc=0
    if [ -n "$pkg_installed" ]; then
        DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq -o DPkg::Lock::Timeout=300 "$PKG" \
            >"$pkg_saved/purge.log" 2>&1 || { cat "$pkg_saved/purge.log"; rc=1; }
        if dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep -q 'installed'; then
            echo "$PKG is still installed"; rc=1
        fi
        if [ -n "$(sys_idem_files)" ]; then
            echo "files of idem left after the purge:"; sys_idem_files; rc=1
        fi
        pkg_installed=
    fi
    if [ -n "$pkg_saved" ] && [ -d "$pkg_saved/root" ]; then
        for f in $(cd "$pkg_saved/root" && find . -type f | sed 's,^\.,,'); do
            mkdir -p "$(dirname "$f")" && cp -a "$pkg_saved/root$f" "$f" && cmp -s "$pkg_saved/root$f" "$f" &&
                echo "put back: $f" || { echo "could not put back $f"; rc=1; }
        done
    fi
    pkg_saved=
    flock -u 9 2>/dev/null
    trap - EXIT
    return $rc
}

run_package() {
    local start=$SECONDS sys_path dir ver debver deb src rc tests f
    citus_ready
    echo "== package"
    pkg_step=$SECONDS
    sys_path=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v "^$work/" | paste -sd:)
    [ "$(PATH=$sys_path command -v pg_config)" = "$SYS_BIN/pg_config" ] ||
        die "the package suite would not use the system's PostgreSQL: PATH=$sys_path"

    perl "$work/test/package/meta.pl" "$work"
    pkg_result meta $?

    install_packages build-essential debhelper dpkg-dev postgresql-server-dev-all lintian
    ver=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$work/idem.control")
    debver=$(dpkg-parsechangelog -l "$work/debian/changelog" -S Version)
    dir=$work/package
    mkdir -p "$dir"
    src=$(copy_tree "$here")
    mv "$src" "$dir/idem-$ver"
    tar -C "$dir" --exclude="idem-$ver/debian" -czf "$dir/idem_$ver.orig.tar.gz" "idem-$ver"
    chown -R postgres:postgres "$dir"
    (cd "$dir/idem-$ver" && runuser -u postgres -- env PATH="$sys_path" HOME="$dir" \
        dpkg-buildpackage -us -uc) > "$dir/build.log" 2>&1
    rc=$?
    deb=$dir/${PKG}_${debver}_$(dpkg --print-architecture).deb
    grep -E '^gcc .* -c -o src/idem\.o' "$dir/build.log" | grep -q -- ' -Werror ' || rc=1
    [ -f "$deb" ] || rc=1
    [ $rc = 0 ] && echo "built $(basename "$deb")" || tail -n 40 "$dir/build.log"
    pkg_result build $rc
    [ $rc = 0 ] || return

    # every tag lintian knows, down to pedantic: each must be fixed or
    # explained in an override (debian/source/lintian-overrides,
    # debian/$PKG.lintian-overrides)
    (cd "$dir" && runuser -u postgres -- env PATH="$sys_path" HOME="$dir" \
        lintian --display-info --pedantic "idem_${debver}_$(dpkg --print-architecture).changes") \
        > "$dir/lintian.log" 2>&1
    rc=$?
    cat "$dir/lintian.log"
    grep -qE '^[EWIPX]: ' "$dir/lintian.log" && rc=1
    [ -s "$dir/lintian.log" ] || echo "lintian: no tag"
    pkg_result lintian $rc

    exec 9>/run/lock/idem-package.lock
    flock -w 1200 9 || die "another run holds /run/lock/idem-package.lock"
    trap package_cleanup EXIT
    pkg_saved=$dir/saved
    mkdir -p "$pkg_saved/root"
    rc=0
    if dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep -q 'installed'; then
        echo "$PKG is installed on this machine: the suite would replace and purge it; remove it first"
        rc=1
    else
        for f in $(sys_idem_files); do
            echo "moved aside while the package is installed: $f"
            mkdir -p "$pkg_saved/root$(dirname "$f")" && cp -a "$f" "$pkg_saved/root$f" && rm -rf "$f" || rc=1
        done
    fi
    if [ $rc = 0 ]; then
        pkg_installed=1
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            -o DPkg::Lock::Timeout=300 "$deb" > "$dir/install.log" 2>&1 || { cat "$dir/install.log"; rc=1; }
        # the package's files, and only those, are what the server loads
        [ "$(dpkg-query -W -f='${Status} ${Version}' "$PKG" 2>/dev/null)" = "install ok installed $debver" ] ||
            { echo "$PKG $debver is not installed"; rc=1; }
        for f in "$SYS_LIB/idem.so" "$SYS_SHARE/extension/idem.control" \
                 $(cd "$work" && ls idem--*.sql | sed "s,^,$SYS_SHARE/extension/,"); do
            [ "$(dpkg-query -S "$f" 2>/dev/null | cut -d: -f1)" = "$PKG" ] || { echo "$f is not from $PKG"; rc=1; }
        done
        [ "$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$SYS_SHARE/extension/idem.control")" = "$ver" ] ||
            { echo "the installed idem.control is not version $ver"; rc=1; }
        # the relay ships in the package, beside the server's programs
        [ "$(dpkg-query -S "$SYS_BIN/idem-relay" 2>/dev/null | cut -d: -f1)" = "$PKG" ] ||
            { echo "$SYS_BIN/idem-relay is not from $PKG"; rc=1; }
        [ "$("$SYS_BIN/idem-relay" --version 2>&1)" = "idem-relay $ver" ] ||
            { echo "$SYS_BIN/idem-relay --version does not say $ver"; rc=1; }
        # README's systemd unit starts the packaged relay
        unit_bin=$(sed -n 's/^ExecStart=\([^ ]*\) .*/\1/p' "$work/README.md" | head -n 1)
        [ "$unit_bin" = "$SYS_BIN/idem-relay" ] ||
            { echo "README's systemd unit starts ${unit_bin:-nothing}, not $SYS_BIN/idem-relay"; rc=1; }
        dpkg-query -L "$PKG" | grep -E '\.(so|sql|control)$|/idem-relay$'
    fi
    pkg_result install $rc

    if [ $rc = 0 ]; then
        tests=$(cd "$work" && ls sql/*.sql | xargs -n1 basename | sed 's/\.sql$//' | sort)
        mkdir -p "$dir/regress"; chown postgres:postgres "$dir/regress"
        (cd "$dir/regress" && runuser -u postgres -- env PATH="$sys_path" \
            "$SYS_LIB/pgxs/src/test/regress/pg_regress" \
            --inputdir="$work" --outputdir="$dir/regress" --bindir="$SYS_BIN" \
            --temp-instance="$dir/regress/tmp_check" --temp-config="$work/test/regress.conf" \
            --load-extension=idem --dbname=contrib_regression $tests) > "$dir/regress.log" 2>&1
        rc=$?
        cat "$dir/regress.log"
        count_pg_regress "$dir/regress.log" "package regress ($((SECONDS - pkg_step)) s)" "$(echo "$tests" | wc -w)"
        pkg_step=$SECONDS
        if [ $rc != 0 ]; then
            [ -f "$dir/regress/regression.diffs" ] && head -c 20000 "$dir/regress/regression.diffs"
            grep -qE '\.\.\. (ok|FAILED)' "$dir/regress.log" || failed=$((failed + 1))
        fi
    fi

    package_cleanup
    pkg_result purge $?
    echo "-- package: $((SECONDS - start)) s"
}

for s in "${suites[@]}"; do
    case "$s" in
        regress) run_regress ;;
        isolation) run_isolation ;;
        tap) build_releases; run_tap "${TAP_TESTS:-t/*.pl}" ;;
        citus) run_citus ;;
        package) run_package ;;
        *) die "unknown suite $s" ;;
    esac
done

if [ "$failed" = 0 ] && [ -z "${KEEP:-}" ]; then rm -rf "$work"; else echo "work tree kept in $work"; fi
echo "-- $SECONDS s in all"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
