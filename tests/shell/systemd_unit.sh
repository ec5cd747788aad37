#!/usr/bin/env bash
# The sender's systemd unit (packaging/magic-sync-sender.service) is valid for systemd, and the
# command line it runs, with the example environment file filled in, is one the sender takes: it
# connects as its --db says and delivers a replica's message.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/cluster.sh
trap cluster_stop EXIT
cluster_start

command -v systemd-analyze >/dev/null ||
    { echo "systemd-analyze is missing: install systemd (scripts/setup.sh does)"; exit 1; }
unit=packaging/magic-sync-sender.service
status=0

# systemd's own check, with the paths of this build: any complaint fails.
sed -e "s|^ExecStart=/usr/local/bin/magic-sync-sender|ExecStart=$PWD/build/bin/magic-sync-sender|" \
    -e "s|^EnvironmentFile=.*|EnvironmentFile=$CLUSTER_DIR/sender.env|" "$unit" \
    >"$CLUSTER_DIR/magic-sync-sender.service"
cp packaging/sender.env.example "$CLUSTER_DIR/sender.env"
complaints=$(systemd-analyze verify "$CLUSTER_DIR/magic-sync-sender.service" 2>&1) || true
[ -z "$complaints" ] || { echo "systemd-analyze verify: $complaints"; status=1; }

# A replica with a message waiting.
psql -X -q -v ON_ERROR_STOP=1 -d postgres >/dev/null <<'SQL'
CREATE EXTENSION magic_sync;
CREATE TABLE registers (id uuid PRIMARY KEY);
CREATE TABLE products (id int PRIMARY KEY, name text);
SELECT sync.replicas('registers', 'registers');
SELECT sync.catalog('products');
INSERT INTO registers VALUES ('00000000-0000-0000-0000-0000000000a1');
INSERT INTO products VALUES (1, 'tea');
SQL
for _ in $(seq 100); do
    [ "$(psql -X -At -d postgres -c "SELECT count(*) FROM sync.outbox")" -gt 0 ] && break
    sleep 0.1
done

# The unit's command line as systemd expands it: "${VAR}" one argument, $VAR split on spaces;
# the environment file's example values, the database and transport set for this test.
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
[ "$exec_start" = '/usr/local/bin/magic-sync-sender --db ${MAGIC_SYNC_DB} $MAGIC_SYNC_SENDER_OPTIONS' ] ||
    { echo "ExecStart changed, update this test: $exec_start"; exit 1; }
grep -q '^MAGIC_SYNC_DB=' "$CLUSTER_DIR/sender.env" && grep -q '^MAGIC_SYNC_SENDER_OPTIONS=' "$CLUSTER_DIR/sender.env" ||
    { echo "the example environment file lacks MAGIC_SYNC_DB or MAGIC_SYNC_SENDER_OPTIONS"; exit 1; }
MAGIC_SYNC_DB="host=$PGHOST port=$PGPORT dbname=postgres user=postgres"
MAGIC_SYNC_SENDER_OPTIONS="--transport exec --exec true --once --report 0"
# shellcheck disable=SC2086
out=$(timeout 60 build/bin/magic-sync-sender --db "$MAGIC_SYNC_DB" $MAGIC_SYNC_SENDER_OPTIONS 2>&1) ||
    { echo "the sender as the unit runs it failed:"; echo "$out"; status=1; }
unsent=$(psql -X -At -d postgres -c "SELECT count(*) FROM sync.outbox WHERE sent_at IS NULL")
sent=$(psql -X -At -d postgres -c "SELECT count(*) FROM sync.outbox WHERE sent_at IS NOT NULL")
[ "$unsent" = 0 ] && [ "$sent" -gt 0 ] ||
    { echo "after the sender ran: $sent sent, $unsent unsent:"; echo "$out"; status=1; }

[ $status -eq 0 ] && echo "the sender's systemd unit is valid and its command line delivers"
exit $status
