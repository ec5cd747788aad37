# Sourced by scripts: a throwaway PostgreSQL cluster with magic_sync preloaded, run as the
# unprivileged postgres user in a temporary directory on a free loopback port.
#   cluster_start [extra postgresql.conf lines...]   sets CLUSTER_DIR, PGPORT, PGHOST
#   cluster_stop                                     stops it and removes the directory

as_pg() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# free_port VAR: sets VAR to a port nothing listens on, below Linux's ephemeral range (32768 and
# up), where the local ends of the tests' own connections would take it. The port stays reserved
# for this shell and its children: a lock on /tmp/magic_sync-ports/PORT, which the C++ tests'
# free_port takes too, so two tests running side by side never pick the same port. cluster_stop
# removes the lock files this shell made.
FREE_PORT_LOCKS=()
free_port() {
    local -n free_port_out=$1
    local free_port_candidate free_port_fd
    mkdir -p -m 1777 /tmp/magic_sync-ports 2>/dev/null || true
    for _ in $(seq 1 200); do
        free_port_candidate=$((20000 + RANDOM % 12000))
        (exec 3<>"/dev/tcp/127.0.0.1/$free_port_candidate") 2>/dev/null && continue
        [ -e "/tmp/magic_sync-ports/$free_port_candidate" ] ||
            : >>"/tmp/magic_sync-ports/$free_port_candidate" 2>/dev/null || true
        exec {free_port_fd}<"/tmp/magic_sync-ports/$free_port_candidate" || continue
        if flock -n "$free_port_fd"; then
            free_port_out=$free_port_candidate
            FREE_PORT_LOCKS+=("/tmp/magic_sync-ports/$free_port_candidate")
            return 0
        fi
        exec {free_port_fd}>&-
    done
    echo "no free port found" >&2
    return 1
}

cluster_start() {
    local bindir
    bindir=$(pg_config --bindir)
    CLUSTER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/magic_sync_cluster.XXXXXX")
    chmod 755 "$CLUSTER_DIR"
    [ "$(id -u)" -eq 0 ] && chown postgres: "$CLUSTER_DIR"
    PGHOST=127.0.0.1
    export PGHOST PGUSER=postgres
    # make test runs initdb once and names the result in MAGIC_SYNC_TEST_PGDATA: a copy of it is
    # the same fresh cluster at a tenth of initdb's cost.
    if [ -n "${MAGIC_SYNC_TEST_PGDATA:-}" ]; then
        as_pg cp -a "$MAGIC_SYNC_TEST_PGDATA" "$CLUSTER_DIR/data"
    else
        as_pg "$bindir/initdb" -D "$CLUSTER_DIR/data" -U postgres -A trust --no-sync >"$CLUSTER_DIR/initdb.log" 2>&1 || {
            cat "$CLUSTER_DIR/initdb.log" >&2
            return 1
        }
    fi
    {
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$CLUSTER_DIR'"
        echo "shared_preload_libraries = 'magic_sync'"
        echo "fsync = off"
        for line in "$@"; do echo "$line"; done
    } >>"$CLUSTER_DIR/data/postgresql.conf"
    # Another process may take the port between free_port's look and the server's bind (the tests
    # run side by side): then the server starts again on another.
    for _ in 1 2 3 4 5; do
        free_port PGPORT
        export PGPORT
        echo "port = $PGPORT" >>"$CLUSTER_DIR/data/postgresql.conf" # the last one counts
        as_pg "$bindir/pg_ctl" -D "$CLUSTER_DIR/data" -l "$CLUSTER_DIR/server.log" -w start >/dev/null &&
            return 0
        grep -q "Address already in use" "$CLUSTER_DIR/server.log" || break
        as_pg rm -f "$CLUSTER_DIR/server.log"
    done
    cat "$CLUSTER_DIR/server.log" >&2
    return 1
}

cluster_stop() {
    [ ${#FREE_PORT_LOCKS[@]} -eq 0 ] || rm -f "${FREE_PORT_LOCKS[@]}"
    FREE_PORT_LOCKS=()
    [ -n "${CLUSTER_DIR:-}" ] || return 0
    as_pg "$(pg_config --bindir)/pg_ctl" -D "$CLUSTER_DIR/data" -m immediate stop >/dev/null 2>&1
    rm -rf "$CLUSTER_DIR"
    CLUSTER_DIR=
}
