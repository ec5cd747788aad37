#!/usr/bin/env bash
# The database's CPU per message the pull gateway serves: sync.pull_head returning a rows message
# assembled (sync.message, as the gateway asked before issue 38's pull change and any gateway of
# one's own still does) against by reference (by_reference => true) plus one sync.chunks of its
# chunks (what the gateway fetches once, its workers sharing the chunks). A throwaway cluster,
# REPLICAS live replicas each with one rows message naming the same CHUNKS chunks of ~32 kB of
# rows (TOASTed, compressed, as the relay stores them); ROUNDS rounds, the two alternating in one
# session; the CPU is the backend's own (utime + stime, /proc), so nothing else on the machine
# counts. Each mode leases every replica's head in one statement, so a statement's own costs
# (a gateway's one per device) are not in either figure.
# With gateways named (magic-sync-sender binaries, say one built before and one after), each round
# also serves every replica's head through each of them in turn (--transport pull; one curl, one
# kept-alive connection: GET next for every device, then its ack) and counts the CPU of all the
# cluster's processes over it (its workers' backends, the LISTEN one, the rest of the server).
#   bench/pull/pull_head_cost.sh [SENDER...]       (REPLICAS=2000 CHUNKS=1 ROUNDS=5)
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/cluster.sh
. scripts/cluster.sh
REPLICAS=${REPLICAS:-2000}
CHUNKS=${CHUNKS:-1}
ROUNDS=${ROUNDS:-5}

cluster_start
trap cluster_stop EXIT
# Not the relay's database (magic_sync.database): no worker touches what this writes.
psql -qX -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE pull_head_cost" >/dev/null
psql -qX -v ON_ERROR_STOP=1 -d pull_head_cost >/dev/null <<SQL
CREATE EXTENSION magic_sync;
CREATE FUNCTION cpu_ms() RETURNS bigint LANGUAGE sql AS \$\$
    SELECT (f[12]::bigint + f[13]::bigint) * 1000 / 100
    FROM regexp_split_to_array(split_part(pg_read_file('/proc/' || pg_backend_pid() || '/stat'),
                                          ') ', 2), ' ') f
\$\$;
INSERT INTO sync.scope (id, match, value) VALUES (1, 'shop', '1');
INSERT INTO sync.chunk (id, scope, from_seq, to_seq, built_head, rows, bytes, body, withheld)
SELECT c, 1, c - 1, c, c, 200, 0,
       '{"scope":"shop=1","from":' || c - 1 || ',"to":' || c || ',"rows":[' ||
       string_agg(format('{"t":"products","k":{"id":%s},"r":{"id":%s,"name":"product %s","price":%s.00},"h":"%s"}',
                         i, i, i, i, md5(i::text) || md5((-i)::text)), ',' ORDER BY i) || ']}',
       '[]'
FROM generate_series(1, $CHUNKS) c, generate_series((c - 1) * 200 + 1, c * 200) i
GROUP BY c;
INSERT INTO sync.replica (id, gen)
SELECT ('00000000-0000-0000-0000-' || lpad(n::text, 12, '0'))::uuid, 1
FROM generate_series(1, $REPLICAS) n;
INSERT INTO sync.outbox (replica, seq, gen, kind, chunks, reset, drops, table_drops, body)
SELECT id, 1, 1, 'rows', (SELECT array_agg(c ORDER BY c) FROM generate_series(1, $CHUNKS) c),
       '{*}', '{}', '{}', NULL
FROM sync.replica;
ANALYZE;
SQL
echo "$REPLICAS replicas, each message $CHUNKS chunk(s) of" \
    "$(psql -qXAt -d pull_head_cost -c "SELECT round(avg(octet_length(body)) / 1024.0, 1) || ' kB (' || round(avg(pg_column_size(body)) / 1024.0, 1) || ' kB stored)' FROM sync.chunk")"

# The CPU (clock ticks) of the cluster's processes: the postmaster and its children now.
db_ticks() {
    local postmaster total=0 fields
    postmaster=$(head -1 "$CLUSTER_DIR/data/postmaster.pid")
    for pid in $postmaster $(pgrep -P "$postmaster"); do
        read -r -a fields < <(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null) || continue
        total=$((total + fields[11] + fields[12]))
    done
    echo "$total"
}

ids=$(psql -qXAt -d pull_head_cost -c "SELECT id FROM sync.replica ORDER BY id")
requests=$(mktemp)
for id in $ids; do
    printf 'url = "http://127.0.0.1:PORT/replicas/%s/next"\nheader = "Authorization: Bearer %s"\noutput = "/dev/null"\nnext\n' "$id" "$id"
done >"$requests"
for id in $ids; do
    printf 'url = "http://127.0.0.1:PORT/replicas/%s/ack/1.1"\nheader = "Authorization: Bearer %s"\ndata = ""\noutput = "/dev/null"\nnext\n' "$id" "$id"
done | sed '$d' >>"$requests" # no "next" after the last

# Every message unsent and not leased again.
unsend() {
    psql -qX -d pull_head_cost -c "UPDATE sync.outbox SET sent_at = NULL, lease_until = NULL" >/dev/null
}

# Serves every head through gateway $1 and prints the database's CPU per message in µs.
through_gateway() {
    local port log pid before after
    unsend
    free_port port
    log=$(mktemp)
    "$1" --db "host=127.0.0.1 port=$PGPORT dbname=pull_head_cost user=postgres" --transport pull \
        --listen "127.0.0.1:$port" --token-query 'SELECT $1::uuid' --wait 1 >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do
        curl -s -o /dev/null "http://127.0.0.1:$port/" && break
        sleep 0.1
    done
    before=$(db_ticks)
    sed "s/PORT/$port/" "$requests" | curl -s -K - >/dev/null
    after=$(db_ticks)
    kill "$pid"
    wait "$pid" || true
    local unsent
    unsent=$(psql -qXAt -d pull_head_cost -c "SELECT count(*) FROM sync.outbox WHERE sent_at IS NULL")
    [ "$unsent" = 0 ] || { echo "$1: $unsent messages not taken" >&2; cat "$log" >&2; exit 1; }
    rm -f "$log"
    echo $(((after - before) * 1000000 / $(getconf CLK_TCK) / REPLICAS))
}

for round in $(seq 1 "$ROUNDS"); do
    unsend
    psql -qXAt -v ON_ERROR_STOP=1 -d pull_head_cost <<SQL
SELECT cpu_ms() AS t0 \gset
SELECT count(message) AS assembled_n FROM sync.replica r, LATERAL sync.pull_head(r.id, '1 minute') \gset
SELECT cpu_ms() - :t0 AS assembled \gset
SELECT cpu_ms() AS t0 \gset
SELECT count(chunks) AS n FROM sync.replica r, LATERAL sync.pull_head(r.id, '1 minute', true) \gset
SELECT count(*) AS fetched FROM sync.chunks((SELECT array_agg(id) FROM sync.chunk), sync_internal.origin()) \gset
SELECT cpu_ms() - :t0 AS by_reference \gset
SELECT format('round $round: assembled %s µs a message, by reference %s µs (%s; %s and %s messages)',
              round(:assembled * 1000.0 / $REPLICAS), round(:by_reference * 1000.0 / $REPLICAS),
              round(:by_reference::numeric / :assembled, 2), :assembled_n, :n);
SQL
    for gateway in "$@"; do
        echo "round $round: through $gateway: $(through_gateway "$gateway") µs of the database's CPU a message"
    done
done
rm -f "$requests"
