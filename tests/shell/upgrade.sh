#!/usr/bin/env bash
# ALTER EXTENSION magic_sync UPDATE from each release: 0.1.0 as it was released (built from the
# repository's history by scripts/build-release.sh) is installed into a copy of this machine's
# PostgreSQL, filled with declarations, rows, planned messages, a filed upload and a kept one;
# then this build is installed over it, the server restarts, and the extension is updated. After it:
# the schema is the one a fresh install makes, object by object; every replica converges on what
# the oracle (sync.expected) says it must hold; the kept row is still kept with its reason, and
# the filed upload sent again is answered, not filed twice.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

# Release 0.1.0's extension, built from the history (scripts/build-release.sh, which `make test`
# runs beside the other builds; here it only finds the tree built). A clone without that history
# (shallow, or an export) cannot build it: skipped, saying so.
release_tree=$(scripts/build-release.sh 0.1.0) || exit $?

work=$(mktemp -d "${TMPDIR:-/tmp}/magic_sync_upgrade.XXXXXX")
chmod 755 "$work" # the server runs as postgres from the copy of PostgreSQL in it
cleanup() {
    cluster_stop 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# A PostgreSQL of our own (the install is relocatable), so that 0.1.0 and this build are
# installed without touching the machine's.
system_bindir=$(pg_config --bindir)
system_root=${system_bindir%/lib/postgresql/*}
mkdir -p "$work/pg/usr/lib" "$work/pg/usr/share" "$work/pg/usr/include"
cp -a "$system_root/lib/postgresql" "$work/pg/usr/lib/"
cp -a "$system_root/share/postgresql" "$work/pg/usr/share/"
cp -a "$system_root/include/postgresql" "$work/pg/usr/include/"
export PATH="$work/pg/usr/lib/postgresql/15/bin:$PATH"
[ "$(pg_config --bindir)" = "$work/pg/usr/lib/postgresql/15/bin" ] ||
    { echo "the copy of PostgreSQL is not the one found: $(pg_config --bindir)"; exit 1; }
rm -f "$(pg_config --sharedir)"/extension/magic_sync* "$(pg_config --pkglibdir)"/magic_sync.so

make -C "$release_tree" -s install >"$work/release-install.log" 2>&1 ||
    { tail -30 "$work/release-install.log"; exit 1; }

. scripts/cluster.sh
cluster_start
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d "${2:-postgres}" -c "$1"; }

# Release 0.1.0, filled: replicas grouped by store, every kind of declaration, rows, the relay's
# passes, an upload filed (one visit) and one kept (a visit that fails its check).
psql -X -q -v ON_ERROR_STOP=1 -d postgres >/dev/null <<'SQL'
CREATE EXTENSION magic_sync;
CREATE SCHEMA shop;
CREATE TABLE shop.registers (id uuid PRIMARY KEY, store_id int NOT NULL, active boolean NOT NULL);
CREATE TABLE shop.products (id int PRIMARY KEY, name text, price numeric(10, 2));
CREATE TABLE shop.prices (store_id int, product_id int, price numeric(10, 2),
                          PRIMARY KEY (store_id, product_id));
CREATE TABLE shop.drawers (register_id uuid PRIMARY KEY, counted numeric, closed_at timestamptz);
CREATE TABLE shop.visits (id int PRIMARY KEY, n int NOT NULL CHECK (n > 0));
SELECT sync.replicas('shop.registers', 'registers', live => 'active');
SELECT sync.catalog('shop.products', columns => ARRAY['id', 'name']);
SELECT sync.catalog('shop.prices', "to" => 'store_id = store_id');
SELECT sync.both('shop.drawers', "to" => 'register_id', replica_columns => ARRAY['counted']);
SELECT sync.record('shop.visits');
INSERT INTO shop.registers VALUES ('00000000-0000-0000-0000-0000000000a1', 1, true),
                                  ('00000000-0000-0000-0000-0000000000a2', 1, true),
                                  ('00000000-0000-0000-0000-0000000000b1', 2, true);
INSERT INTO shop.products SELECT i, 'product ' || i, i FROM generate_series(1, 500) i;
INSERT INTO shop.prices SELECT s, p, p + s FROM generate_series(1, 2) s, generate_series(1, 50) p;
INSERT INTO shop.drawers VALUES ('00000000-0000-0000-0000-0000000000a1', 10, NULL);
-- A synced table dropped under 0.1.0, which did not notice (its declaration stays behind).
CREATE TABLE shop.flyers (id int PRIMARY KEY, title text);
SELECT sync.catalog('shop.flyers');
INSERT INTO shop.flyers VALUES (1, 'spring sale');
SQL
for _ in $(seq 300); do
    [ "$(sql "SELECT count(*) FROM sync.note")" = 0 ] && break
    sleep 0.1
done
sql "DROP TABLE shop.flyers" >/dev/null
for _ in $(seq 300); do
    [ "$(sql "SELECT count(*) FROM sync.note")" = 0 ] && [ "$(sql "SELECT count(*) FROM sync.outbox")" -gt 0 ] && break
    sleep 0.1
done
upload='{"v":1,"id":"10000000-0000-0000-0000-000000000001","rows":[{"t":"shop.visits","r":{"id":1,"n":1}},{"t":"shop.visits","r":{"id":2,"n":-1}}]}'
filed=$(psql -X -q -At -v ON_ERROR_STOP=1 -v upload="$upload" -d postgres <<'SQL'
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', convert_to(:'upload', 'UTF8'));
SQL
)
[ "$filed" = filed ] && [ "$(sql "SELECT count(*) FROM sync.set_aside WHERE kind = 'upload'")" = 1 ] ||
    { echo "release 0.1.0 filed the upload as '$filed', keeping: $(sql "TABLE sync.set_aside")"; exit 1; }
kept_before=$(sql "SELECT kind || ' ' || replica || ' ' || key || ' ' || reason FROM sync.set_aside ORDER BY id")
messages_before=$(sql "SELECT count(*) FROM sync.outbox")
[ "$messages_before" -gt 0 ] || { echo "release 0.1.0 planned no message"; exit 1; }
echo "release 0.1.0: $messages_before messages planned, set aside: $kept_before"

# This build over it, as an operator upgrades: install, restart, update.
make -C "$repo" -s install >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
as_pg "$(pg_config --bindir)/pg_ctl" -D "$CLUSTER_DIR/data" -l "$CLUSTER_DIR/server.log" -w -m fast restart >/dev/null

# Between the restart and the update: the relay waits and says for what; an application's write
# to a synced table still works, and notes its whole table in 0.1.0's sync.note.
waiting="magic_sync relay: the magic_sync extension in database \"postgres\" is version 0.1.0 and this library is 0.2.0; waiting for ALTER EXTENSION magic_sync UPDATE"
for _ in $(seq 100); do
    grep -qF "$waiting" "$CLUSTER_DIR/server.log" && break
    sleep 0.1
done
grep -qF "$waiting" "$CLUSTER_DIR/server.log" ||
    { echo "the relay did not say it waits for the update:"; tail -20 "$CLUSTER_DIR/server.log"; exit 1; }
sql "CREATE ROLE clerk LOGIN; GRANT USAGE ON SCHEMA shop TO clerk; GRANT INSERT ON shop.products TO clerk"
psql -X -q -v ON_ERROR_STOP=1 -U clerk -d postgres -c "INSERT INTO shop.products VALUES (501, 'written before the update', 1)" ||
    { echo "a write to a synced table failed between the restart and the update"; exit 1; }
noted=$(sql "SELECT string_agg(c.table_name || ' ' || coalesce(n.key::text, 'every row'), ', ')
             FROM sync.note n JOIN sync.codec c ON c.id = n.codec")
[ "$noted" = "shop.products every row" ] || { echo "noted before the update: '$noted'"; exit 1; }
# An upload meanwhile is refused, saying what to run (the route answers it "send again later").
refused=$(sql "SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', convert_to('{}', 'UTF8'))" 2>&1 || true)
[ "$refused" = "ERROR:  magic_sync's library is version 0.2.0 but the extension in this database is version 0.1.0; nothing was filed
HINT:  Run ALTER EXTENSION magic_sync UPDATE, then send the upload again." ] ||
    { echo "an upload between the restart and the update: '$refused'"; exit 1; }

# The update and what it did to the table dropped under 0.1.0, read in its own transaction: the
# relay's next pass takes sync.dropped_codec as soon as the update commits.
updated=$(psql -X -q -At -v ON_ERROR_STOP=1 -d postgres 2>&1 <<'SQL'
BEGIN;
ALTER EXTENSION magic_sync UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'magic_sync';
SELECT (SELECT string_agg(table_name, ',') FROM sync.dropped_codec) || ' '
       || (SELECT count(*) FROM sync.codec WHERE table_name = 'shop.flyers');
COMMIT;
SQL
) || { echo "ALTER EXTENSION magic_sync UPDATE failed:"; echo "$updated"; exit 1; }
ended=$(sed -n 2p <<<"$updated")
updated=$(sed -n 1p <<<"$updated")
[ "$updated" = 0.2.0 ] || { echo "after the update: '$updated'"; exit 1; }
echo "updated to 0.2.0"
[ "$ended" = "shop.flyers 0" ] || { echo "the table dropped under 0.1.0, after the update: '$ended'"; exit 1; }

status=0
# The same schema as a fresh install: every object of the extension with its definition.
as_pg "$(pg_config --bindir)/createdb" -h "$PGHOST" -p "$PGPORT" fresh
sql "CREATE EXTENSION magic_sync" fresh
schema='
WITH members AS (
    SELECT d.classid, d.objid FROM pg_depend d
    WHERE d.refclassid = $$pg_extension$$::regclass AND d.deptype = $$e$$
      AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = $$magic_sync$$))
SELECT pg_describe_object(m.classid, m.objid, 0) || $$: $$ || coalesce(CASE
    WHEN m.classid = $$pg_proc$$::regclass THEN coalesce((
        SELECT a.aggtransfn::text || $$ $$ || a.aggfinalfn::text || $$ $$ || a.aggtranstype::regtype::text
               || $$ $$ || coalesce(a.agginitval, $$$$)
        FROM pg_aggregate a WHERE a.aggfnoid = m.objid), pg_get_functiondef(m.objid)) || coalesce(
        (SELECT p.proacl::text FROM pg_proc p WHERE p.oid = m.objid), $$$$)
    WHEN m.classid = $$pg_class$$::regclass THEN (
        SELECT c.relkind::text || coalesce(c.relacl::text, $$$$) || coalesce($$ $$ || pg_get_viewdef(c.oid), $$$$)
            || coalesce((SELECT string_agg(a.attname || $$ $$ || format_type(a.atttypid, a.atttypmod)
                          || CASE WHEN a.attnotnull THEN $$ not null$$ ELSE $$$$ END
                          || coalesce($$ default $$ || pg_get_expr(ad.adbin, ad.adrelid), $$$$)
                          || coalesce($$ storage $$ || a.attstorage::text, $$$$)
                          || coalesce($$ compression $$ || nullif(a.attcompression::text, $$$$), $$$$), $$, $$ ORDER BY a.attnum)
                         FROM pg_attribute a LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), $$$$)
            || coalesce((SELECT string_agg(co.conname || $$ $$ || pg_get_constraintdef(co.oid), $$; $$ ORDER BY co.conname)
                         FROM pg_constraint co WHERE co.conrelid = c.oid), $$$$)
            || coalesce((SELECT string_agg(pg_get_indexdef(i.indexrelid), $$; $$ ORDER BY 1)
                         FROM pg_index i WHERE i.indrelid = c.oid), $$$$)
            || coalesce((SELECT string_agg(pg_get_triggerdef(t.oid), $$; $$ ORDER BY t.tgname)
                         FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal), $$$$)
        FROM pg_class c WHERE c.oid = m.objid)
    WHEN m.classid = $$pg_event_trigger$$::regclass THEN (
        SELECT e.evtevent || $$ $$ || e.evtfoid::regproc::text || coalesce($$ $$ || e.evttags::text, $$$$)
        FROM pg_event_trigger e WHERE e.oid = m.objid)
    END, $$$$)
FROM members m
UNION ALL
SELECT $$config: $$ || coalesce((SELECT string_agg(c::regclass::text || $$ $$ || coalesce(w, $$$$), $$, $$ ORDER BY c::regclass::text)
                               FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS x(c, w)
                               WHERE e.extname = $$magic_sync$$), $$$$)
ORDER BY 1'
sql "$schema" postgres >"$work/upgraded.schema"
sql "$schema" fresh >"$work/fresh.schema"
if ! diff "$work/fresh.schema" "$work/upgraded.schema" >"$work/schema.diff"; then
    echo "the updated schema differs from a fresh install's (< fresh, > updated):"
    head -60 "$work/schema.diff"
    status=1
fi
[ "$(wc -l <"$work/fresh.schema")" -gt 100 ] || { echo "the schema comparison saw too little"; status=1; }

# The kept row is still kept, with its reason, and tried again under 0.2.0 (it fails again).
kept_after=$(sql "SELECT kind || ' ' || replica || ' ' || key || ' ' || reason FROM sync.set_aside ORDER BY id")
[ "$kept_after" = "$kept_before" ] || { echo "set aside before the update: '$kept_before'; after: '$kept_after'"; status=1; }

# Every replica converges: the new sender delivers through the reference replica (the exec
# transport), until nothing is noted, no cursor is behind and nothing is unsent.
sender_options=(--db "host=$PGHOST port=$PGPORT dbname=postgres user=postgres" --transport exec
    --exec "$repo/build/bin/magic-sync-replica --id \"\$REPLICA\" --db \"$work/\$REPLICA.db\" apply -"
    --once --report 0)
drained() {
    [ "$(sql "SELECT (SELECT count(*) FROM sync.note)
                   + (SELECT count(*) FROM sync.member m JOIN sync.scope s ON s.id = m.scope
                      WHERE m.sent < s.head)
                   + (SELECT count(*) FROM sync.outbox WHERE sent_at IS NULL)")" = 0 ]
}
converge() {
    for _ in $(seq 120); do
        "$repo/build/bin/magic-sync-sender" "${sender_options[@]}" >>"$work/sender.log" 2>&1 || true
        drained && break
        sleep 0.5
    done
    drained || { echo "$1: not drained:"; tail -20 "$work/sender.log"; status=1; }
    # Every live replica (one that is no longer live keeps what it held: it is told nothing more).
    for replica in $(sql "SELECT id FROM shop.registers WHERE active ORDER BY id"); do
        expected=$(sql "SELECT e.table_name || ' ' || e.key || ' ' || e.h
                        FROM sync.expected('$replica'::uuid) e WHERE NOT e.withheld" | LC_ALL=C sort)
        held=$("$repo/build/bin/magic-sync-replica" --id "$replica" --db "$work/$replica.db" show --json |
            jq -r '.held | to_entries[] | .key as $t | .value[] | "\($t) \(.k | tojson) \(.h)"' |
            LC_ALL=C sort)
        if [ "$held" != "$expected" ]; then
            echo "$1: replica $replica does not hold what the oracle says (< oracle, > replica):"
            diff <(echo "$expected") <(echo "$held") | head -10
            status=1
        fi
        echo "$1: replica $replica holds $(echo "$held" | grep -c .) rows, as the oracle says"
    done
}
converge "after the update"
# The capture in 0.2.0's form: changes made after the update reach the replicas too.
sql "UPDATE shop.products SET name = 'tea' WHERE id = 1;
     INSERT INTO shop.prices VALUES (2, 51, 9.99);
     UPDATE shop.drawers SET counted = 12;
     UPDATE shop.registers SET active = false WHERE id = '00000000-0000-0000-0000-0000000000a2'" >/dev/null
converge "after changes"

# The filed upload sent again is answered, not filed twice; the kept visit is not filed.
again=$(psql -X -q -At -v ON_ERROR_STOP=1 -v upload="$upload" -d postgres <<'SQL'
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', convert_to(:'upload', 'UTF8'));
SQL
)
[ "$again" = "answered again" ] || { echo "the upload sent again after the update: '$again'"; status=1; }
visits=$(sql "SELECT string_agg(id || ':' || n, ',' ORDER BY id) FROM shop.visits")
[ "$visits" = "1:1" ] || { echo "visits after the update and the upload sent again: '$visits'"; status=1; }

[ $status -eq 0 ] && echo "0.1.0 updated to 0.2.0: the schema of a fresh install, every replica as the oracle says, kept and filed uploads as they were"
exit $status
