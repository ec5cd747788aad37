#!/usr/bin/env bash
# A host that cannot preload libraries (many managed ones): magic_sync installs and works without
# shared_preload_libraries, the relay running as CALL sync.relay() in a session. End to end: the
# sender (exec transport) delivers to a reference replica, which holds what sync.expected says,
# and its upload is filed.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/cluster.sh
relay_pid=
finish() {
    [ -n "$relay_pid" ] && kill "$relay_pid" 2>/dev/null
    cluster_stop
}
trap finish EXIT
cluster_start "shared_preload_libraries = ''"

bindir=$(pg_config --bindir)
work=$CLUSTER_DIR/work
mkdir -p "$work"
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d shop -c "$1"; }
fail() {
    echo "FAILED: $*"
    tail -n 30 "$CLUSTER_DIR/server.log"
    exit 1
}

[ "$(psql -X -At -d postgres -c 'SHOW shared_preload_libraries')" = "" ] || fail "the cluster preloads"
as_pg "$bindir/createdb" -h "$PGHOST" -p "$PGPORT" shop
# Loading the library in a session defines its settings, except the postmaster's own.
psql -X -q -v ON_ERROR_STOP=1 -d shop -c "LOAD 'magic_sync'" || fail "LOAD 'magic_sync'"
psql -X -q -v ON_ERROR_STOP=1 -d shop >/dev/null <<'SQL' || fail "CREATE EXTENSION"
CREATE EXTENSION magic_sync;
CREATE SCHEMA shop;
CREATE TABLE shop.registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
CREATE TABLE shop.products (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE shop.sales (id int PRIMARY KEY, product_id int NOT NULL);
SELECT sync.replicas('shop.registers', 'registers', live => 'active');
SELECT sync.catalog('shop.products');
SELECT sync.record('shop.sales');
INSERT INTO shop.registers VALUES ('00000000-0000-0000-0000-000000000001');
INSERT INTO shop.products VALUES (1, 'tea'), (2, 'coffee');
SQL
# A session that has not loaded the library reads the settings through it.
[ "$(sql "SELECT sync.setting('idle')")" = "200ms" ] || fail "magic_sync.idle"
[ "$(sql "SELECT sync.setting('idle'), current_setting('magic_sync.database', true) IS NULL")" = "200ms|t" ] ||
    fail "magic_sync.database exists without the postmaster"

# The relay in a session, as the README says for such hosts.
psql -X -q -d shop -c "CALL sync.relay()" >"$work/relay.log" 2>&1 &
relay_pid=$!

replica=00000000-0000-0000-0000-000000000001
replica_cli="build/bin/magic-sync-replica --id $replica --db $work/register.db"
deliver() {
    build/bin/magic-sync-sender --db "host=$PGHOST port=$PGPORT user=postgres dbname=shop" \
        --transport exec --exec "$PWD/build/bin/magic-sync-replica --id \$REPLICA --db $work/register.db apply -" \
        --once --report 0 >>"$work/sender.log" 2>&1 || fail "the sender: $(tail -n 5 "$work/sender.log")"
}
# The replica holds what the oracle says it must: table, key and version of every row.
converged() {
    local expected held
    expected=$(sql "SELECT string_agg(table_name || ' ' || key || ' ' || h, E'\n' ORDER BY table_name, key)
                    FROM sync.expected('$replica')")
    held=$(psql -X -q -At -v ON_ERROR_STOP=1 -d shop -v shown="$($replica_cli show --json)" <<'SQL'
SELECT string_agg(t.key || ' ' || sync_internal.canonical(r->'k') || ' ' || (r->>'h'), E'\n'
                  ORDER BY t.key, sync_internal.canonical(r->'k'))
FROM jsonb_each(:'shown'::jsonb->'held') t, jsonb_array_elements(t.value) r
SQL
)
    [ "$expected" = "$held" ]
}
wait_converged() {
    for _ in $(seq 1 100); do
        deliver
        converged && return 0
        sleep 0.2
    done
    fail "$1: the replica does not hold what sync.expected says"
}

wait_converged "provisioning"
sql "UPDATE shop.products SET name = 'green tea' WHERE id = 1; INSERT INTO shop.products VALUES (3, 'cocoa')"
wait_converged "a change"

# An upload through sync.receive, filed by the table's rule.
$replica_cli write shop.sales '{"id":10,"product_id":1}' >/dev/null
$replica_cli upload --up "host=$PGHOST port=$PGPORT user=postgres dbname=shop" >/dev/null ||
    fail "the upload"
[ "$(sql "SELECT product_id FROM shop.sales WHERE id = 10")" = "1" ] || fail "the sale was not filed"

kill "$relay_pid"
wait "$relay_pid" 2>/dev/null || true
relay_pid=
grep -q "FATAL" "$CLUSTER_DIR/server.log" && fail "a FATAL in the server log"
echo "without shared_preload_libraries: installed, relayed by CALL sync.relay(), delivered and filed"
