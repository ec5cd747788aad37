#!/usr/bin/env bash
# `make demo`: the shop. A throwaway PostgreSQL cluster with magic_sync preloaded (its relay
# worker running by itself), a shop schema, the sender, and three registers (reference replicas
# on SQLite). It makes changes and sales, shows what each register holds and what the server
# says, cuts one register's line and heals it, and ends by checking that every register holds
# exactly what the server says it should (their fingerprints, scope by scope).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cluster.sh
root=$(pwd)
replica_bin="$root/build/bin/magic-sync-replica"
sender_bin="$root/build/bin/magic-sync-sender"

sender_pid=
work=$(mktemp -d "${TMPDIR:-/tmp}/magic_sync_demo.XXXXXX")
finish() {
    if [ -n "$sender_pid" ]; then kill "$sender_pid" 2>/dev/null || true; fi
    cluster_stop
    rm -rf "$work"
}
trap finish EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
sql() { psql -X -q -v ON_ERROR_STOP=1 -d shop "$@"; }
value() { psql -X -q -At -v ON_ERROR_STOP=1 -d shop -c "$1"; }

declare -A register=(
    [north-1]=00000000-0000-0000-0000-0000000000a1
    [north-2]=00000000-0000-0000-0000-0000000000a2
    [south-1]=00000000-0000-0000-0000-0000000000b1
)
# A register's SQLite file is named by its id, so the sender's exec command finds it.
replica() { "$replica_bin" --id "${register[$1]}" --db "$work/${register[$1]}.db" "${@:2}"; }

say "A throwaway cluster with magic_sync preloaded, relaying database shop"
cluster_start "magic_sync.database = 'shop'" "magic_sync.backoff = 200" "magic_sync.backoff_max = 2000"
as_pg "$(pg_config --bindir)/createdb" -h "$PGHOST" -p "$PGPORT" shop
echo "PostgreSQL on 127.0.0.1:$PGPORT, data in $CLUSTER_DIR (removed at exit)"

say "The shop: stores, registers, products, prices per store, sales and drawers at registers"
sql <<'SQL'
CREATE EXTENSION magic_sync;
CREATE SCHEMA shop;
CREATE TABLE shop.stores (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE shop.registers (id uuid PRIMARY KEY, name text NOT NULL,
                             store_id int NOT NULL REFERENCES shop.stores, active boolean NOT NULL DEFAULT true);
CREATE TABLE shop.products (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE shop.prices (store_id int REFERENCES shop.stores, product_id int REFERENCES shop.products,
                          price numeric(10, 2) NOT NULL, PRIMARY KEY (store_id, product_id));
CREATE TABLE shop.sales (id uuid PRIMARY KEY, register_id uuid NOT NULL, product_id int NOT NULL,
                         qty int NOT NULL, at timestamptz NOT NULL DEFAULT now());
CREATE TABLE shop.drawers (register_id uuid PRIMARY KEY, float numeric(10, 2) NOT NULL DEFAULT 100,
                           counted numeric(10, 2), closed_at timestamptz);
SQL
declarations="SELECT sync.replicas('shop.registers', 'registers', live => 'active');
SELECT sync.catalog('shop.products');
SELECT sync.catalog('shop.prices', \"to\" => 'store_id = store_id');
SELECT sync.record('shop.sales');
SELECT sync.both('shop.drawers', \"to\" => 'register_id', replica_columns => ARRAY['counted', 'closed_at']);"
echo "$declarations"
echo "$declarations" | sql >/dev/null
sql <<SQL
INSERT INTO shop.stores VALUES (1, 'North'), (2, 'South');
INSERT INTO shop.registers VALUES ('${register[north-1]}', 'north-1', 1), ('${register[north-2]}', 'north-2', 1),
                                  ('${register[south-1]}', 'south-1', 2);
INSERT INTO shop.products VALUES (1, 'tea'), (2, 'coffee'), (3, 'cake');
INSERT INTO shop.prices VALUES (1, 1, 2.50), (1, 2, 3.00), (1, 3, 4.20), (2, 1, 2.40), (2, 2, 3.10), (2, 3, 3.90);
INSERT INTO shop.drawers (register_id) SELECT id FROM shop.registers;
SQL

say "The sender: one message at a time per register, here over the exec transport"
# Each delivery runs the register's apply; a register whose line is cut answers 75 (try again).
cat >"$work/deliver.sh" <<EOF
#!/bin/sh
[ -e "$work/cut-\$REPLICA" ] && { echo "the line to \$REPLICA is cut" >&2; exit 75; }
exec "$replica_bin" --id "\$REPLICA" --db "$work/\$REPLICA.db" apply - >/dev/null
EOF
chmod +x "$work/deliver.sh"
"$sender_bin" --db "host=$PGHOST port=$PGPORT user=postgres dbname=shop" --transport exec \
    --exec "$work/deliver.sh" --report 0 >"$work/sender.log" 2>&1 &
sender_pid=$!
echo "magic-sync-sender --transport exec --exec deliver.sh   (pid $sender_pid)"

# Every register's fingerprint of every scope it holds equals the server's, and nothing waits.
converged() {
    local name id expected held
    [ "$(value "SELECT count(*) FROM sync.note")" = 0 ] || return 1
    for name in "${!register[@]}"; do
        id=${register[$name]}
        [ "$(value "SELECT count(*) FROM sync.member m JOIN sync.scope s ON s.id = m.scope
                    WHERE m.replica = '$id' AND m.sent < s.head")" = 0 ] || return 1
        [ "$(value "SELECT count(*) FROM sync.outbox WHERE replica = '$id' AND sent_at IS NULL")" = 0 ] ||
            return 1
        expected=$(value "SELECT sync_internal.scope_name(s.match, s.value, s.partition) || ' n=' || s.n
                                 || ' fp=' || encode(s.fp, 'hex')
                          FROM sync.member m JOIN sync.scope s ON s.id = m.scope
                          WHERE m.replica = '$id' AND s.n > 0" | sort)
        held=$(replica "$name" holds 2>/dev/null | sed -E 's/ through=[0-9]+//' | grep -v ' n=0 ' | sort)
        [ "$expected" = "$held" ] || return 1
    done
}
wait_converged() {
    for _ in $(seq 1 300); do
        if converged; then return 0; fi
        sleep 0.2
    done
    echo "did not converge; the sender's log:"
    cat "$work/sender.log"
    return 1
}
# A register sends what it wrote up (an app's route calls sync.receive the same way).
upload() { replica "$1" upload --up "host=$PGHOST port=$PGPORT user=postgres dbname=shop" >/dev/null; }
show_registers() {
    local name
    for name in north-1 north-2 south-1; do
        echo "--- register $name holds:"
        replica "$name" show | sed -n '/^shop\./,/^scopes/p' | sed '/^scopes/d;/^$/d'
    done
}
show_status() {
    sql -c "SELECT g.name AS register, s.live, s.gen, s.outbox, round(s.backoff_seconds::numeric, 1) AS backoff_s,
                   s.last_error
            FROM sync.status s JOIN shop.registers g ON g.id = s.replica ORDER BY g.name;"
}

say "Provisioning: each register gets the catalog, its store's prices and its own drawer"
wait_converged
show_registers
show_status

say "The head office changes a price and adds a product"
sql -c "UPDATE shop.prices SET price = 2.75 WHERE store_id = 1 AND product_id = 1;" \
    -c "INSERT INTO shop.products VALUES (4, 'bun'); INSERT INTO shop.prices VALUES (1, 4, 1.50), (2, 4, 1.60);"
wait_converged
show_registers

say "Sales at the registers, and north-2 counts its drawer; they send them up"
replica north-1 write shop.sales "{\"id\":\"$(cat /proc/sys/kernel/random/uuid)\",\"register_id\":\"${register[north-1]}\",\"product_id\":1,\"qty\":2}" >/dev/null
replica south-1 write shop.sales "{\"id\":\"$(cat /proc/sys/kernel/random/uuid)\",\"register_id\":\"${register[south-1]}\",\"product_id\":3,\"qty\":1}" >/dev/null
replica north-2 write shop.drawers "{\"register_id\":\"${register[north-2]}\",\"counted\":97.50}" --key register_id >/dev/null
for name in north-1 north-2 south-1; do upload "$name"; done
sql -c "SELECT g.name AS register, s.product_id, s.qty FROM shop.sales s JOIN shop.registers g ON g.id = s.register_id ORDER BY 1;" \
    -c "SELECT g.name AS register, d.float, d.counted FROM shop.drawers d JOIN shop.registers g ON g.id = d.register_id ORDER BY 1;"
wait_converged

say "The line to south-1 is cut; the head office changes the south prices meanwhile"
touch "$work/cut-${register[south-1]}"
sql -c "UPDATE shop.prices SET price = price + 0.10 WHERE store_id = 2;"
sleep 2
show_status
echo "(north-1 and north-2 carry on; south-1 backs off, its messages wait in order)"

say "The line is healed"
rm "$work/cut-${register[south-1]}"
wait_converged
show_registers
show_status

say "Check: every register holds exactly what the server says, scope by scope"
for name in north-1 north-2 south-1; do
    echo "$name:"
    replica "$name" holds | sed 's/^/  /'
done
if converged; then echo "all three registers converged"; else echo "NOT converged"; exit 1; fi
