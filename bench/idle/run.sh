#!/usr/bin/env bash
# bench/idle: what an idle relay costs (issue 38). One throwaway cluster with REPLICAS live
# replicas (default 100,000) of one catalog table, provisioned, every message delivered and
# confirmed (as a sender and the replicas would), and then nothing changing: the relay worker's
# backend CPU (utime + stime from /proc) over SECONDS (default 20), ROUNDS times (default 3),
# as a share of one core. Goal: <= 1%. Beside it, for scale, the CPU of one pass over the same
# state, asked for by a wake-up with nothing to do.
#
#   make bench-idle                       (or bench/idle/run.sh)
#   REPLICAS=10000 SECONDS_IDLE=20 ROUNDS=3
set -euo pipefail
cd "$(dirname "$0")/../.."
REPLICAS=${REPLICAS:-100000}
SECONDS_IDLE=${SECONDS_IDLE:-20}
ROUNDS=${ROUNDS:-3}

. scripts/cluster.sh
trap cluster_stop EXIT
trap 'exit 130' INT TERM
cluster_start "magic_sync.database = 'shop'" "magic_sync.idle = 200"
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d shop -c "$1"; }
as_pg "$(pg_config --bindir)/createdb" -h "$PGHOST" -p "$PGPORT" shop

started=$(date +%s)
sql "CREATE EXTENSION magic_sync;
     CREATE TABLE registers (id uuid PRIMARY KEY);
     CREATE TABLE products (id int PRIMARY KEY, name text NOT NULL);
     SELECT sync.replicas('registers', 'registers');
     SELECT sync.catalog('products');
     INSERT INTO products SELECT g, 'product ' || g FROM generate_series(1, 10) g;
     INSERT INTO registers SELECT ('00000000-0000-0000-0000-' || lpad(to_hex(g), 12, '0'))::uuid
     FROM generate_series(1, $REPLICAS) g;"
until [ "$(sql "SELECT count(*) FROM sync.replica")" = "$REPLICAS" ] &&
      [ "$(sql "SELECT count(*) FROM sync.note")" = 0 ]; do sleep 1; done
# Delivered and confirmed, as the senders and the replicas would report it (which wakes the relay).
sql "UPDATE sync.outbox SET sent_at = now();
     INSERT INTO sync.confirmation (replica, applied) SELECT replica, max(seq) FROM sync.outbox GROUP BY replica;
     SELECT sync_internal.wake();" >/dev/null
until [ "$(sql "SELECT count(*) FROM sync.confirmation") $(sql "SELECT count(*) FROM sync.outbox")" = "0 0" ]; do sleep 1; done
echo "provisioned and drained $REPLICAS replicas in $(($(date +%s) - started)) s"
sleep 2

relay=$(sql "SELECT sync_internal.relay_lock_holder()")
ticks() { awk '{print $14 + $15}' "/proc/$relay/stat"; }
hz=$(getconf CLK_TCK)
shares=()
for round in $(seq 1 "$ROUNDS"); do
    before=$(ticks)
    sleep "$SECONDS_IDLE"
    after=$(ticks)
    share=$(awk -v t=$((after - before)) -v hz="$hz" -v s="$SECONDS_IDLE" 'BEGIN {printf "%.2f", 100 * t / hz / s}')
    shares+=("$share")
    echo "round $round: the idle relay used $share% of a core over $SECONDS_IDLE s"
done
median=$(printf '%s\n' "${shares[@]}" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
# One pass with nothing to do, for scale: a wake-up brings it.
before=$(ticks)
sql "SELECT sync_internal.wake()" >/dev/null
sleep 2
after=$(ticks)
echo "one pass with nothing to do at $REPLICAS replicas: $(awk -v t=$((after - before)) -v hz="$hz" 'BEGIN {printf "%.0f", 1000 * t / hz}') ms of CPU"
echo "idle relay at $REPLICAS live replicas: median $median% of a core (goal <= 1%)"
