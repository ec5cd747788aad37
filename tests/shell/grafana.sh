#!/usr/bin/env bash
# The Grafana dashboard (packaging/grafana/magic_sync.json) is JSON Grafana can load (panels with
# PromQL over the Prometheus datasource), and every expression of it names only metrics we
# publish: the sender's and the pull gateway's, as sender/metrics.cpp writes them (# TYPE lines;
# a histogram's _bucket, _sum and _count), and the exporter's, as
# packaging/postgres_exporter_queries.yaml names them (<query>_<column> for each GAUGE or COUNTER
# column). A panel naming an unknown metric fails it: checked once on a copy with one.
set -euo pipefail
cd "$(dirname "$0")/../.."
dashboard=packaging/grafana/magic_sync.json
command -v jq >/dev/null || { echo "jq is missing: install jq (scripts/setup.sh does)"; exit 1; }

published=$(
    sed -nE 's/.*# TYPE (magic_sync_[a-z0-9_]+) (counter|gauge|histogram).*/\1 \2/p' sender/metrics.cpp |
        while read -r name type; do
            if [ "$type" = histogram ]; then
                printf '%s\n' "${name}_bucket" "${name}_sum" "${name}_count"
            else
                echo "$name"
            fi
        done
    awk '/^[a-z_]+:$/ { query = substr($1, 1, length($1) - 1) }
         /^    - [a-z_]+:$/ { column = substr($2, 1, length($2) - 1) }
         /usage: "(GAUGE|COUNTER)"/ { print query "_" column }' packaging/postgres_exporter_queries.yaml
)
[ "$(wc -l <<<"$published")" -gt 20 ] || { echo "too few published metrics found: $published"; exit 1; }

# Per expression of `file`, the metric names it uses ("<expression>\t<name>", or "\t" after
# an expression naming none): its identifiers, once strings, label matchers, ranges and the label
# lists of by/without/on/ignoring/group_* are gone, that are neither a function (followed by "(")
# nor a keyword. One awk for them all.
metric_names() {
    jq -r '.. | objects | select(has("expr")) | .expr' "$1" | awk '{
        expr = $0; text = $0; named = 0
        gsub(/"[^"]*"/, "", text); gsub(/\{[^}]*\}/, "", text); gsub(/\[[^]]*\]/, "", text)
        gsub(/(by|without|on|ignoring|group_left|group_right) *\([^)]*\)/, "", text)
        while (match(text, /[A-Za-z_:][A-Za-z0-9_:]*[ \t]*\(?/)) {
            token = substr(text, RSTART, RLENGTH); text = substr(text, RSTART + RLENGTH)
            if (token ~ /\($/) continue
            sub(/[ \t]+$/, "", token)
            if (token ~ /^(and|or|unless|bool|offset|inf|nan)$/) continue
            print expr "\t" token; named = 1
        }
        if (!named) print expr "\t"
    }'
}

# Every expression of `file` names at least one metric, and only published ones.
check() {
    jq -e '.panels | length > 0' "$1" >/dev/null || { echo "$1: no panels"; return 1; }
    metric_names "$1" | awk -F '\t' -v published="$published" '
        BEGIN { n = split(published, names, "\n"); for (i = 1; i <= n; ++i) known[names[i]] = 1 }
        $2 == "" { print "names no metric: " $1; bad = 1; next }
        !($2 in known) { print "not a metric we publish: " $2 " (in " $1 ")"; bad = 1 }
        END { exit bad }'
}

status=0
jq -e '.title and .uid and (.panels | all(.type and .gridPos and .title))' "$dashboard" >/dev/null ||
    { echo "$dashboard: not a dashboard (title, uid, panels with type, gridPos and title)"; status=1; }
check "$dashboard" || status=1
count=$(jq '[.. | objects | select(has("expr"))] | length' "$dashboard")

# The check bites: the same dashboard with a panel naming a metric nobody publishes fails.
wrong=$(mktemp)
trap 'rm -f "$wrong"' EXIT
jq '.panels[1].targets[0].expr = "sum(magic_sync_replicas_replica{state=\"failing\"})"' "$dashboard" >"$wrong"
if said=$(check "$wrong"); then
    echo "a panel naming magic_sync_replicas_replica was not caught"
    status=1
elif [ "$said" != 'not a metric we publish: magic_sync_replicas_replica (in sum(magic_sync_replicas_replica{state="failing"}))' ]; then
    echo "the wrong metric was caught as: $said"
    status=1
fi
[ $status -eq 0 ] && echo "the Grafana dashboard's $count expressions name only metrics we publish"
exit $status
