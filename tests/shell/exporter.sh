#!/usr/bin/env bash
# The queries file for prometheus-postgres-exporter (packaging/postgres_exporter_queries.yaml),
# scraped by the real exporter (installed here for this test: the product does not need it) as a
# role in sync_monitor only: the replicas by what sync.status says of them, and the relay's health.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/cluster.sh

exporter=$(command -v prometheus-postgres-exporter || true)
if [ -z "$exporter" ]; then
    [ "$(id -u)" -eq 0 ] ||
        { echo "prometheus-postgres-exporter is missing: install it (apt-get install prometheus-postgres-exporter)"; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        prometheus-postgres-exporter >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends prometheus-postgres-exporter >/dev/null; }
    exporter=$(command -v prometheus-postgres-exporter)
fi

exporter_pid=
stop_all() {
    if [ -n "$exporter_pid" ]; then
        kill "$exporter_pid" 2>/dev/null || true
        wait "$exporter_pid" 2>/dev/null || true # its status is SIGTERM's, not the test's
    fi
    cluster_stop
}
trap stop_all EXIT
cluster_start

# One transaction: the relay's first pass sees it whole and plans one message per replica (a pass
# between the statements, which a fast machine runs, would plan two).
psql -X -q -v ON_ERROR_STOP=1 -d postgres >/dev/null <<'SQL'
BEGIN;
CREATE EXTENSION magic_sync;
CREATE TABLE registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
CREATE TABLE products (id int PRIMARY KEY, name text);
SELECT sync.replicas('registers', 'registers', live => 'active');
SELECT sync.catalog('products');
INSERT INTO registers VALUES ('00000000-0000-0000-0000-0000000000a1'),
                             ('00000000-0000-0000-0000-0000000000a2'),
                             ('00000000-0000-0000-0000-0000000000a3');
INSERT INTO products SELECT i, 'product ' || i FROM generate_series(1, 10) i;
CREATE ROLE exporter LOGIN IN ROLE sync_monitor;
COMMIT;
SQL
for _ in $(seq 100); do
    [ "$(psql -X -At -d postgres -c "SELECT count(*) FROM sync.outbox")" = 3 ] && break
    sleep 0.1
done

# Another test may bind the port between free_port's look and the exporter's listen (the tests
# run side by side): then the exporter starts again on another.
scraped=
for _ in 1 2 3 4 5; do
    free_port port
    DATA_SOURCE_NAME="host=$PGHOST port=$PGPORT user=exporter dbname=postgres sslmode=disable" \
        "$exporter" --web.listen-address="127.0.0.1:$port" --disable-default-metrics \
        --disable-settings-metrics --extend.query-path=packaging/postgres_exporter_queries.yaml \
        >"$CLUSTER_DIR/exporter.log" 2>&1 &
    exporter_pid=$!
    for _ in $(seq 100); do
        kill -0 "$exporter_pid" 2>/dev/null || break
        scraped=$(curl -s --max-time 2 "http://127.0.0.1:$port/metrics" || true)
        grep -q '^magic_sync_relay_relay_running' <<<"$scraped" && break 2
        sleep 0.1
    done
    kill -0 "$exporter_pid" 2>/dev/null && break # it runs but never answered: the checks say what
    wait "$exporter_pid" 2>/dev/null || true
    exporter_pid=
    grep -q "address already in use" "$CLUSTER_DIR/exporter.log" || break
done
status=0
# Three live replicas, each with one message planned and unsent: catching up. The
# exporter labels each series with the server it scraped.
server="server=\"$PGHOST:$PGPORT\""
for line in \
    "magic_sync_replicas_replicas{live=\"true\",$server,state=\"catching up\"} 3" \
    "magic_sync_replicas_unsent{live=\"true\",$server,state=\"catching up\"} 3" \
    "magic_sync_replicas_set_aside{live=\"true\",$server,state=\"catching up\"} 0" \
    "magic_sync_relay_relay_running{$server} 1" \
    "magic_sync_relay_notes_backlog{$server} 0" \
    "magic_sync_relay_set_aside_uploads{$server} 0" \
    "pg_exporter_user_queries_load_error{filename=\"packaging/postgres_exporter_queries.yaml\",hashsum=\"$(sha256sum packaging/postgres_exporter_queries.yaml | cut -d' ' -f1)\"} 0"; do
    grep -qxF "$line" <<<"$scraped" || { echo "missing: $line"; status=1; }
done
grep -q "^magic_sync_replicas_oldest_unsent_seconds{live=\"true\",$server,state=\"catching up\"} [0-9]" <<<"$scraped" ||
    { echo "missing: magic_sync_replicas_oldest_unsent_seconds"; status=1; }
if [ $status -ne 0 ]; then
    echo "scraped:"
    grep '^magic_sync\|^pg_up\|error' <<<"$scraped" || echo "$scraped" | head -20
    tail -5 "$CLUSTER_DIR/exporter.log"
fi
[ $status -eq 0 ] && echo "prometheus-postgres-exporter scrapes sync.status and sync.health as sync_monitor"
exit $status
