#!/usr/bin/env bash
# Any user identifier works: tables, columns, schemas and the replicas relation named after every
# alias and qualifier the engine's own SQL uses (read from src/ now, not a list typed once), and
# reserved words, quotes, spaces, upper case, unicode and 63-byte names, the partition column
# (partitioned_by takes it as named, unquoted) with quotes and a space too. A catalog's rows travel
# whole to every replica, a record's upload is filed column for column, a both's replica column
# is changed by its replica, and the audit, the oracle and sync.check find nothing wrong.
set -euo pipefail
cd "$(dirname "$0")/../.."

# Every word our SQL writes before a dot (t.id, kp.x, sync.row) or after AS, in the SQL files and
# in the C++ that builds statements; the system columns cannot be a table's.
mapfile -t words < <({
    grep -ohP '(?<![\w:>.$])[a-z_][a-z0-9_]*(?=\.[a-z_"*])' $(git ls-files 'src/*.sql' 'src/*.cpp')
    grep -ohiP '\bAS\s+\K[a-z_][a-z0-9_]*' $(git ls-files 'src/*.sql' 'src/*.cpp')
} | tr 'A-Z' 'a-z' | sort -u | grep -vxE 'tableoid|xmin|xmax|cmin|cmax|ctid|id|order|select')
# (Not `printf | grep -q` under pipefail: grep leaving early fails the printf with SIGPIPE.)
declare -A found=()
for word in "${words[@]}"; do found[$word]=1; done
for must in t r p s o n x e a kp k c; do
    [ -n "${found[$must]:-}" ] || { echo "the engine's alias $must was not found in src/"; exit 1; }
done
columns=""
for word in "${words[@]}"; do columns+=", \"$word\" text"; done
# Reserved words (select, also a word our SQL writes after AS), quotes, spaces, upper case,
# unicode, the longest name PostgreSQL keeps.
long=$(printf 'l%.0s' {1..63})
columns+=", \"select\" text, \"Mixed Case\" text, \"quo\"\"te\" text, \"sp ace\" text"
columns+=", \"prénom\" text, \"$long\" text"
# The partition column too (every table and the replicas relation have it, all in one partition).
columns+=", \"Part \"\"X\"\"\" text"

. scripts/cluster.sh
trap cluster_stop EXIT
cluster_start
bindir=$(pg_config --bindir)
as_pg "$bindir/createdb" -h "$PGHOST" -p "$PGPORT" odd
psql_odd() { psql -X -q -At -v ON_ERROR_STOP=1 -d odd "$@"; }

psql_odd -v columns="$columns" >/dev/null <<'SQL'
CREATE EXTENSION magic_sync;
CREATE SCHEMA "Odd Schema";
CREATE TABLE "Odd Schema"."Replica List" (id uuid PRIMARY KEY, "live?" boolean NOT NULL,
                                          "group" int NOT NULL :columns);
CREATE TABLE "Odd Schema"."select" ("order" int PRIMARY KEY, "group" int :columns);
CREATE TABLE "Odd Schema"."from t" ("order" int PRIMARY KEY :columns);
CREATE TABLE "Odd Schema"."Both" ("order" int PRIMARY KEY, "owner" uuid NOT NULL :columns);
SELECT sync.replicas('"Odd Schema"."Replica List"', 'odd', live => '"live?"',
                     partitioned_by => 'Part "X"');
SELECT sync.catalog('"Odd Schema"."select"', "to" => '"group" = "group"');
SELECT sync.record('"Odd Schema"."from t"');
SELECT sync.both('"Odd Schema"."Both"', "to" => '"owner"', replica_columns => ARRAY['t', 'select']);
-- Every column of every row holds its own name and the row's number.
CREATE FUNCTION fill(relation regclass, first int, last int, extra text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('INSERT INTO %s SELECT * FROM jsonb_populate_recordset(NULL::%s, $1)', relation,
                   relation)
    USING (SELECT jsonb_agg((SELECT jsonb_object_agg(a.attname, a.attname || ' ' || i)
                             FROM pg_attribute a
                             WHERE a.attrelid = relation AND a.attnum > 0 AND NOT a.attisdropped
                               AND format_type(a.atttypid, NULL) = 'text')
                            || jsonb_build_object('order', i, 'Part "X"', 'eu') || extra::jsonb)
           FROM generate_series(first, last) i);
END
$$;
SELECT fill('"Odd Schema"."Replica List"', 1, 1,
            '{"id": "00000000-0000-0000-0000-000000000001", "live?": true, "group": 7}');
SELECT fill('"Odd Schema"."Replica List"', 2, 2,
            '{"id": "00000000-0000-0000-0000-000000000002", "live?": true, "group": 8}');
SELECT fill('"Odd Schema"."select"', 1, 3, '{"group": 7}');
SELECT fill('"Odd Schema"."select"', 4, 5, '{"group": 8}');
SELECT fill('"Odd Schema"."Both"', 1, 2, '{"owner": "00000000-0000-0000-0000-000000000001"}');
SQL

status=0
check() { # what, expected, actual (long rows shown in part)
    if [ "$2" != "$3" ]; then
        echo "$1: expected"
        echo "$2" | cut -c1-300
        echo "got"
        echo "$3" | cut -c1-300
        status=1
    fi
}

check "the first pass (notes > 0, set aside)" "t|0" "$(psql_odd -c 'SELECT notes > 0, set_aside FROM sync.pass()')"
# What each replica was sent, row by row (a table travels under its name quoted as SQL quotes it), against the rows the tables and the rules say it must
# hold, computed here from the tables alone.
carried="SELECT string_agg(line, E'\n' ORDER BY line) FROM (
         SELECT format('%s %s %s', o.replica, x->>'t', x->'r') AS line
         FROM sync.outbox o,
              jsonb_array_elements(convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb->'chunks') c,
              jsonb_array_elements(c->'rows') x) lines"
must_hold="SELECT string_agg(line, E'\n' ORDER BY line) FROM (
           SELECT format('%s %s %s', r.id, w.tbl, w.body) AS line
           FROM \"Odd Schema\".\"Replica List\" r,
                LATERAL (SELECT '\"Odd Schema\".\"select\"', to_jsonb(s.*) FROM \"Odd Schema\".\"select\" s
                         WHERE s.\"group\" = r.\"group\" AND s.\"Part \"\"X\"\"\" = r.\"Part \"\"X\"\"\"
                         UNION ALL
                         SELECT '\"Odd Schema\".\"Both\"', to_jsonb(b.*) FROM \"Odd Schema\".\"Both\" b
                         WHERE b.owner = r.id AND b.\"Part \"\"X\"\"\" = r.\"Part \"\"X\"\"\") w(tbl, body)) lines"
expected=$(psql_odd -c "$must_hold")
check "rows sent to the replicas" "$expected" "$(psql_odd -c "$carried")"
check "rows that must be held (3 + 2 + 2)" 7 "$(echo "$expected" | wc -l)"
check "sync.expected() of replica 1" 5 \
    "$(psql_odd -c "SELECT count(*) FROM sync.expected('00000000-0000-0000-0000-000000000001')")"
check "sync.audit()" "" "$(psql_odd -c 'SELECT * FROM sync.audit()')"
check "sync.check()" "" "$(psql_odd -c 'SELECT * FROM sync.check()')"

# An upload: a record row with every column, and the both rows' replica columns, from replica 1.
upload=$(psql_odd -c "
    SELECT jsonb_build_object('v', 1, 'id', '10000000-0000-0000-0000-000000000001', 'rows',
           jsonb_build_array(
               jsonb_build_object('t', '\"Odd Schema\".\"from t\"', 'r', (SELECT to_jsonb(s.*) - 'group'
                                  FROM \"Odd Schema\".\"select\" s WHERE s.\"order\" = 1)),
               jsonb_build_object('t', '\"Odd Schema\".\"Both\"', 'r',
                                  jsonb_build_object('order', 1, 't', 'changed', 'select', 'too'))))")
check "receive" filed "$(psql_odd -v upload="$upload" <<'SQL'
SELECT sync.receive('00000000-0000-0000-0000-000000000001', convert_to(:'upload', 'UTF8'));
SQL
)"
check "the record row filed as sent" t "$(psql_odd -c "
    SELECT to_jsonb(f.*) = (SELECT to_jsonb(s.*) - 'group' FROM \"Odd Schema\".\"select\" s WHERE s.\"order\" = 1)
    FROM \"Odd Schema\".\"from t\" f")"
check "the both row changed in its replica columns only" "changed|too|a 1" "$(psql_odd -c "
    SELECT b.t, b.\"select\", b.a FROM \"Odd Schema\".\"Both\" b WHERE b.\"order\" = 1")"
check "nothing kept" 0 "$(psql_odd -c "SELECT count(*) FROM sync.set_aside")"
check "the next pass" "0" "$(psql_odd -c 'SELECT set_aside FROM sync.pass()')"
check "sync.audit() after" "" "$(psql_odd -c 'SELECT * FROM sync.audit()')"
exit $status
