# Shared by the scripts in this folder: packages, build and install, run as
# root on Debian 12.  Sourced, not run.

PG_MAJOR=15
PG_BIN=/usr/lib/postgresql/$PG_MAJOR/bin
export PATH="$PG_BIN:$PATH"
# Every server the scripts start and every client they run speaks UTF-8,
# whatever the caller's environment (a fresh machine may have no locale).
export LANG=C.UTF-8 LC_ALL=C.UTF-8 PGCLIENTENCODING=UTF8
unset LANGUAGE
BUILD_FLAGS='-Wall -Wextra -Wno-unused-parameter -Werror'

die() { echo "error: $*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" = 0 ] || die "run this as root: it installs packages and the extension"
}

# install_packages PKG...: the server, its headers and the test tools.
install_packages() {
    local pkgs=(postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR postgresql-client-$PG_MAJOR
                libipc-run-perl libpq-dev libcurl4-openssl-dev librabbitmq-dev librdkafka-dev python3 make gcc "$@")
    local missing=()
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "== installing packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq || die "apt-get update failed"
        # Debian's server package would start a cluster of its own; the
        # scripts start the servers they need.
        local policy=
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
            chmod +x /usr/sbin/policy-rc.d
            policy=1
        fi
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        local rc=$?
        [ -n "$policy" ] && rm -f /usr/sbin/policy-rc.d
        [ $rc = 0 ] || die "apt-get install failed"
    fi
}

# copy_tree SRC: a copy of the source tree that the postgres user can
# write, since the clone may sit where postgres cannot read.  Prints its path.
copy_tree() {
    local src=$1 dst
    dst=$(mktemp -d /tmp/idem.XXXXXX)
    if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
        (cd "$src" && git ls-files -z --cached --others --exclude-standard |
            xargs -0 cp --parents -t "$dst" 2>/dev/null) || true
    else
        cp -a "$src"/. "$dst"/
    fi
    chown -R postgres:postgres "$dst"
    echo "$dst"
}

# build_and_install DIR: compile warning-free as postgres, then install into
# a private copy of the PostgreSQL installation in DIR/pg, whose binaries
# come first in PATH from then on.  "make install" into the shared
# directories would rewrite idem.so under every other server that has it
# loaded (another test run, a benchmark), and crash their backends.
build_and_install() {
    local dir=$1 pg=$1/pg
    runuser -u postgres -- make -C "$dir" -s clean >/dev/null 2>&1 || true
    runuser -u postgres -- make -C "$dir" -s with_llvm=no PG_CFLAGS="$BUILD_FLAGS" \
        || die "build failed"
    rm -rf "$pg"
    mkdir -p "$pg/lib/postgresql" "$pg/share/postgresql"
    cp -a "/usr/lib/postgresql/$PG_MAJOR" "$pg/lib/postgresql/" &&
        cp -a "/usr/share/postgresql/$PG_MAJOR" "$pg/share/postgresql/" ||
        die "could not copy the PostgreSQL installation"
    # headers and libpq stay the system's, where the copy's pg_config says
    ln -s /usr/include "$pg/include" &&
        ln -s "$(/usr/lib/postgresql/$PG_MAJOR/bin/pg_config --libdir)" "$pg/lib/$(basename \
            "$(/usr/lib/postgresql/$PG_MAJOR/bin/pg_config --libdir)")" ||
        die "could not link the headers and libraries"
    PG_BIN="$pg/lib/postgresql/$PG_MAJOR/bin"
    export PATH="$PG_BIN:$PATH"
    [ "$("$PG_BIN/pg_config" --pkglibdir)" = "$pg/lib/postgresql/$PG_MAJOR/lib" ] ||
        die "the copy of PostgreSQL does not find its own files"
    make -C "$dir" -s with_llvm=no PG_CONFIG="$PG_BIN/pg_config" install >/dev/null ||
        die "install failed"
    chown -R postgres:postgres "$pg"
}

# start_cluster DIR PORT [SETTINGS...]: a throwaway cluster owned by
# postgres, on a Unix socket in DIR only.
start_cluster() {
    local dir=$1 port=$2; shift 2
    mkdir -p "$dir"; chown postgres:postgres "$dir"
    runuser -u postgres -- initdb -D "$dir/data" --locale=C.UTF-8 -E UTF8 -A trust >/dev/null \
        || die "initdb failed"
    {
        echo "listen_addresses = ''"
        echo "unix_socket_directories = '$dir'"
        echo "port = $port"
        for s in "$@"; do echo "$s"; done
    } >> "$dir/data/postgresql.conf"
    runuser -u postgres -- pg_ctl -D "$dir/data" -l "$dir/server.log" -w start >/dev/null \
        || { cat "$dir/server.log"; die "server did not start"; }
}

# server_cpu_us DIR: the CPU time, in microseconds, of the exited backends of
# the cluster started in DIR: the postmaster's cutime + cstime (fields 16 and
# 17 of /proc/PID/stat).  Read before and after a benchmark run, it gives the
# CPU the run's connections used, which a busy machine disturbs far less than
# their throughput.
server_cpu_us() {
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%.0f\n", ($16 + $17) / hz * 1e6 }' \
        "/proc/$(head -n 1 "$1/data/postmaster.pid")/stat"
}

# wait_backends_gone DIR PORT DB: waits until no client backend but the one
# asking is left, so that the CPU of those that exited has been counted.
wait_backends_gone() {
    local i
    for i in $(seq 1 100); do
        [ "$(runuser -u postgres -- env PATH="$PATH" psql -h "$1" -p "$2" -d "$3" -X -At -c \
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")" = 1 ] && break
        sleep 0.1
    done
    sleep 0.2
}

stop_cluster() {
    local dir=$1
    [ -d "$dir/data" ] && runuser -u postgres -- pg_ctl -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
}
