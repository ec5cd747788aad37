#!/usr/bin/env bash
# bench/receive: filing uploads of ROWS rows (default 100) through sync.receive, as JSON and
# gzip-compressed, against the same rows by a plain multi-row INSERT, ROUNDS rounds (default 300)
# side by side in one run, on a throwaway cluster. Prints the median time per upload for each way
# and the ratios of their rates. Compresses the uploads with python3 (installed when missing).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v python3 >/dev/null || apt-get install -y -qq python3 >/dev/null
# shellcheck source=../../scripts/cluster.sh
. "$root/scripts/cluster.sh"
trap cluster_stop EXIT
cluster_start
rounds=${ROUNDS:-300}
rows=${ROWS:-100}
psql -X -q -d postgres -v rounds="$rounds" -v rows="$rows" -f "$root/bench/receive/setup.sql" >/dev/null
psql -X -q -d postgres -c "COPY (SELECT round, encode(upload_to_gzip, 'hex') FROM bench.input) TO STDOUT" |
    python3 "$root/bench/receive/gzip_uploads.py" |
    psql -X -q -d postgres -c "CREATE TABLE bench.gzipped (round int, upload bytea);
                               COPY bench.gzipped FROM STDIN;"
psql -X -q -d postgres -c "UPDATE bench.input i SET upload_gzip = g.upload FROM bench.gzipped g
                           WHERE g.round = i.round"
psql -X -q -d postgres -v rounds="$rounds" -v rows="$rows" -f "$root/bench/receive/bench.sql" |
    grep -v '^$'
