#!/usr/bin/env bash
# pg_dump keeps the declarations: dump a database with magic_sync declarations, restore it into a
# new database, and find the declarations and capture triggers back, noting changes again.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/cluster.sh
trap cluster_stop EXIT
cluster_start

bindir=$(pg_config --bindir)
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$1" -c "$2"; }
as_pg "$bindir/createdb" -h "$PGHOST" -p "$PGPORT" original
upload='{"v":1,"id":"10000000-0000-0000-0000-000000000001","rows":[{"t":"shop.visits","r":{"id":1,"n":1}},{"t":"shop.visits","r":{"id":2,"n":-1}}]}'
psql -X -q -v ON_ERROR_STOP=1 -v upload="$upload" -d original >/dev/null <<'SQL'
CREATE EXTENSION magic_sync;
CREATE SCHEMA shop;
CREATE TABLE shop.registers (id uuid PRIMARY KEY, store_id int NOT NULL, active boolean NOT NULL);
CREATE TABLE shop.products (id int PRIMARY KEY, name text);
CREATE TABLE shop.drawers (register_id uuid PRIMARY KEY, counted numeric, closed_at timestamptz);
CREATE TABLE shop.visits (id int PRIMARY KEY, n int NOT NULL CHECK (n > 0));
CREATE FUNCTION shop.known(uuid) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
-- A NOT VALID check: pg_dump makes it before the primary key, on a declared table.
ALTER TABLE shop.visits ADD CONSTRAINT visits_n_small CHECK (n < 1000) NOT VALID;
SELECT sync.replicas('shop.registers', 'registers', live => 'active');
SELECT sync.catalog('shop.products', columns => ARRAY['id', 'name']);
SELECT sync.both('shop.drawers', "to" => 'register_id', replica_columns => ARRAY['counted']);
SELECT sync.record('shop.visits');
SELECT sync.senders(known => 'shop.known(uuid)'::regprocedure);
-- An upload: one visit filed, one kept (it fails its check).
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', convert_to(:'upload', 'UTF8'));
SQL

declarations="SELECT table_name, kind, coalesce(\"to\", '-'), coalesce(columns::text, '-'), replica_columns, key_columns FROM sync.codec ORDER BY table_name;
SELECT relation_name, name, live FROM sync.replica_set;
SELECT known FROM sync.sender_rule;
SELECT tgrelid::regclass, tgname FROM pg_trigger WHERE tgfoid = 'sync.capture()'::regprocedure ORDER BY tgrelid::regclass::text, tgname;"

before=$(psql -X -At -d original -c "$declarations")
as_pg "$bindir/createdb" -h "$PGHOST" -p "$PGPORT" restored
"$bindir/pg_dump" -h "$PGHOST" -p "$PGPORT" -U postgres original >"$CLUSTER_DIR/dump.sql"
psql -X -q -v ON_ERROR_STOP=1 -d restored -f "$CLUSTER_DIR/dump.sql" >/dev/null
after=$(psql -X -At -d restored -c "$declarations")

status=0
if [ "$before" != "$after" ]; then
    echo "declarations differ after restore:"
    diff <(echo "$before") <(echo "$after") || true
    status=1
fi
missing=$(psql -X -At -d restored -c "SELECT string_agg(relation::text, ', ') FROM (SELECT relation FROM sync.codec UNION ALL SELECT relation FROM sync.replica_set) d WHERE NOT sync_internal.capture_installed(relation)")
[ -z "$missing" ] || { echo "the capture triggers are missing after restore on: $missing"; status=1; }
[ "$(echo "$after" | grep -c magic_sync_)" -eq 8 ] || { echo "expected 8 capture triggers (2 per table) after restore"; status=1; }

# The restored triggers note changes, and the codec sequence goes on after the restored ids.
sql restored "TRUNCATE sync.note; INSERT INTO shop.products VALUES (7, 'tea');"
noted=$(sql restored "SELECT c.table_name || ' ' || n.key FROM sync.noted n JOIN sync.codec c ON c.id = n.codec")
[ "$noted" = 'shop.products {"id": 7}' ] || { echo "after restore, noted: '$noted'"; status=1; }
sql restored "CREATE TABLE shop.sales (id int PRIMARY KEY); SELECT sync.record('shop.sales');" >/dev/null
distinct=$(sql restored "SELECT count(DISTINCT id) = count(*) FROM sync.codec")
[ "$distinct" = t ] || { echo "codec ids collide after restore"; status=1; }

# The kept upload and the filed-once record survive: the kept row is still kept with its reason,
# and the upload sent again is answered, not filed twice.
uploads="SELECT s.kind || ' ' || s.replica || ' ' || s.upload || ' ' || s.table_name || ' ' || s.key || ' ' || s.reason FROM sync.set_aside s ORDER BY s.id;
SELECT u.replica || ' ' || u.id || ' ' || u.kept FROM sync.upload u;"
kept_before=$(psql -X -At -d original -c "$uploads")
kept_after=$(psql -X -At -d restored -c "$uploads")
if [ "$kept_before" != "$kept_after" ] || [ "$(echo "$kept_after" | grep -c '^upload ')" -ne 1 ]; then
    echo "kept uploads or the filed-once record differ after restore:"
    diff <(echo "$kept_before") <(echo "$kept_after") || true
    status=1
fi
again=$(psql -X -q -At -v ON_ERROR_STOP=1 -v upload="$upload" -d restored <<'SQL'
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', convert_to(:'upload', 'UTF8'));
SQL
)
[ "$again" = "answered again" ] || { echo "the upload sent again after restore: '$again'"; status=1; }
visits=$(sql restored "SELECT string_agg(id || ':' || n, ',' ORDER BY id) FROM shop.visits")
[ "$visits" = "1:1" ] || { echo "visits after restore and the upload sent again: '$visits'"; status=1; }

[ $status -eq 0 ] && echo "declarations, capture triggers, kept uploads and filed uploads survive pg_dump and restore"
exit $status
