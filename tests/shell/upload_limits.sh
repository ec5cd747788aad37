#!/usr/bin/env bash
# One million tiny rows in one 16 MB upload: refused while parsing (magic_sync.max_upload_rows),
# kept whole and answered with the limit named, no ERROR (which would mean "send it again", for
# ever), and the backend's peak memory stays bounded (it took 2.7 GB before).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/cluster.sh
trap cluster_stop EXIT
cluster_start

bindir=$(pg_config --bindir)
as_pg "$bindir/createdb" -h "$PGHOST" -p "$PGPORT" shop
result=$(psql -X -q -At -v ON_ERROR_STOP=1 -d shop <<'SQL'
CREATE EXTENSION magic_sync;
CREATE TABLE registers (id uuid PRIMARY KEY);
CREATE TABLE sales (id int PRIMARY KEY);
SELECT sync.replicas('registers', 'registers') \g /dev/null
SELECT sync.record('sales') \g /dev/null
CREATE FUNCTION known(uuid) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
SELECT sync.senders(known => 'known(uuid)'::regprocedure) \g /dev/null
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1',
    convert_to('{"v":1,"id":"10000000-0000-0000-0000-000000000001","rows":['
               || repeat('{"t":"","r":{}},', 999999) || '{"t":"","r":{}}]}', 'UTF8'));
SELECT reason FROM sync.set_aside;
SELECT payload->'kept'->0->>'why' FROM sync.answer;
SELECT (regexp_match(pg_read_file('/proc/' || pg_backend_pid() || '/status'),
                     'VmHWM:\s+(\d+) kB'))[1]::bigint / 1024;
SQL
)
status=0
expected="kept
upload: lists of more than 21024 entries (rows: at most 10000)
upload: lists of more than 21024 entries (rows: at most 10000)"
if [ "$(echo "$result" | head -3)" != "$expected" ]; then
    echo "expected:"
    echo "$expected"
    echo "got:"
    echo "$result" | head -3
    status=1
fi
peak_mb=$(echo "$result" | tail -1)
echo "peak memory of the backend that received it: $peak_mb MB"
[ "$peak_mb" -lt 512 ] || { echo "over 512 MB"; status=1; }
[ $status -eq 0 ] && echo "an upload of one million rows is kept whole, answered and bounded in memory"
exit $status
