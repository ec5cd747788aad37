#!/usr/bin/env bash
# bench/receive: filing uploads of ROWS rows (default 100) through sync.receive against the same
# rows by a plain multi-row INSERT, ROUNDS rounds (default 300) side by side in one run, on a
# throwaway cluster. Prints the median time per upload for each way and the ratio of their rates.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=../../scripts/cluster.sh
. "$root/scripts/cluster.sh"
trap cluster_stop EXIT
cluster_start
psql -X -q -d postgres -v rounds="${ROUNDS:-300}" -v rows="${ROWS:-100}" -f "$root/bench/receive/bench.sql" |
    grep -v '^$'
