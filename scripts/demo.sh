#!/usr/bin/env bash
# `make demo`: a throwaway cluster with magic_sync preloaded, the extension created, and what
# the engine shows an operator. Everything is removed when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cluster.sh
trap cluster_stop EXIT

echo "Starting a throwaway PostgreSQL cluster with magic_sync preloaded..."
cluster_start
echo "  running on 127.0.0.1:$PGPORT (data in $CLUSTER_DIR, removed at exit)"
sql() { psql -X -q -v ON_ERROR_STOP=1 -d postgres "$@"; }

sql -c "CREATE EXTENSION magic_sync;"
echo
echo "The extension and its settings:"
sql -c "SELECT extname, extversion, extnamespace::regnamespace AS schema FROM pg_extension WHERE extname = 'magic_sync';"
sql -c "SELECT name, setting, unit FROM pg_settings WHERE name LIKE 'magic_sync.%' ORDER BY name;"
echo "The relay lock (taken by this session) and the replicas' status (none declared yet):"
sql -c "SELECT sync.relay_lock() = pg_backend_pid() AS this_session_holds_the_relay_lock;" \
    -c "TABLE sync.status;"
echo "Done: the cluster is stopped and removed."
