#!/usr/bin/env bash
# The sender never logs the password of its connection string (README: "The connection string is
# never logged"): not when nothing listens at the address, not when libpq cannot parse the string
# (its reason then quotes the string's own text), not while it retries, not once it connects.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/cluster.sh
trap cluster_stop EXIT

sender=build/bin/magic-sync-sender
secret=hunter2
status=0
free_port closed # nothing listens there

# name, expected exit status, a line the output must hold, then the sender's arguments.
expect() {
    local name=$1 want=$2 line=$3 out got
    shift 3
    out=$(timeout 60 "$sender" "$@" --transport exec --exec true 2>&1)
    got=$?
    if grep -qF "$secret" <<<"$out"; then
        echo "$name: the password is in the output:"
        echo "$out"
        status=1
    fi
    [ "$got" -eq "$want" ] || { echo "$name: exit status $got, expected $want:"; echo "$out"; status=1; }
    grep -qF -- "$line" <<<"$out" || { echo "$name: expected \"$line\" in:"; echo "$out"; status=1; }
}

expect "keywords, nothing listening" 1 \
    "cannot connect: connection to server at \"127.0.0.1\", port $closed failed: Connection refused" \
    --once --db "host=127.0.0.1 port=$closed user=sender password=$secret dbname=shop"
expect "URI, nothing listening" 1 \
    "cannot connect: connection to server at \"127.0.0.1\", port $closed failed: Connection refused" \
    --once --db "postgresql://sender:$secret@127.0.0.1:$closed/shop"
expect "URI, a bad %-escape in the password" 1 \
    'cannot connect: the connection string does not parse: invalid percent-encoded token: "..." (what it quotes is not shown: it may be a password)' \
    --once --db "postgresql://sender:$secret%zz@127.0.0.1:$closed/shop"
expect "URI, an IPv6 bracket not closed" 1 \
    'cannot connect: the connection string does not parse: end of string reached when looking for matching "..." in IPv6 host address in URI: "..."' \
    --once --db "postgresql://sender:$secret@[::1/shop"
expect "keywords, the password where an option goes" 1 \
    'cannot connect: the connection string does not parse: invalid connection option "..."' \
    --once --db "host=127.0.0.1 port=$closed $secret=password"
expect "keywords, a quote not closed" 1 \
    'cannot connect: the connection string does not parse: unterminated quoted string in connection info string' \
    --once --db "host=127.0.0.1 port=$closed password='$secret"

# Not --once: it logs that the database is unavailable, retries, and stops on SIGTERM.
log=$(mktemp)
"$sender" --db "host=127.0.0.1 port=$closed user=sender password=$secret dbname=shop" \
    --transport exec --exec true --report 0 >"$log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
    grep -q "database unavailable" "$log" && break
    sleep 0.1
done
kill -TERM "$pid"
wait "$pid"
got=$?
if grep -qF "$secret" "$log"; then echo "retrying: the password is in the log:"; cat "$log"; status=1; fi
grep -qF "database unavailable (cannot connect: connection to server at \"127.0.0.1\", port $closed failed: Connection refused); retrying with backoff" "$log" ||
    { echo "retrying: no line saying the database is unavailable:"; cat "$log"; status=1; }
[ "$got" -eq 0 ] || { echo "retrying: exit status $got after SIGTERM, expected 0"; cat "$log"; status=1; }
rm -f "$log"

# Connected: the log names user@host:port/dbname. The cluster trusts every local connection, so
# the password in the string is not checked, only carried.
cluster_start
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE shop" >/dev/null
psql -X -q -v ON_ERROR_STOP=1 -d shop -c "CREATE EXTENSION magic_sync" \
    -c "CREATE ROLE sender LOGIN IN ROLE sync_sender" >/dev/null
expect "connected" 0 "connected to sender@127.0.0.1:$PGPORT/shop" \
    --once --db "host=127.0.0.1 port=$PGPORT user=sender password=$secret dbname=shop"
expect "connected by URI" 0 "connected to sender@127.0.0.1:$PGPORT/shop" \
    --once --db "postgresql://sender:$secret@127.0.0.1:$PGPORT/shop"

[ $status -eq 0 ] && echo "the sender never logged the password"
exit $status
