#!/usr/bin/env bash
# bench/relay: what the relay pass costs (issue 4). One run, one throwaway cluster:
#   (a) changes per second through passes for one scope: A_ROWS rows inserted into a catalog
#       table with one live replica; the time of the sync.pass() calls that plan them and write
#       the outbox (one transaction per pass, commit included; every message delivered and
#       confirmed between passes, untimed, as if a sender kept up), against a plain
#       INSERT ... SELECT copy of the same rows into a table of the same shape, in the same
#       database, order alternating by round. Goal: pass rate >= 0.33 of the copy rate.
#       Beside it, the floor the design sets, each step a bare set statement over the same rows:
#       taking the notes, encoding the rows, writing their state once (bench/relay/setup.sql).
#       Goal (issue 38 item 5): passes at >= 0.5 of the floor (the floor's time / the passes').
#       And what the peers start from (issue 25): wal2json decoding the same insert from a slot
#       made before it (the cluster runs wal_level = logical; postgresql-15-wal2json is installed
#       for the benchmark when missing). Goal: passes at >= 1.0 of the decoder's rate.
#   (b) one catalog change fanned out to 1,000, 10,000 and 100,000 live replicas, provisioned and
#       drained first (every message confirmed, cursors at head): one UPDATE of one catalog row,
#       then the passes until one writes no message; time per replica delivery. Sizes rotate
#       by round. Goal: the 100k per-replica cost <= 1.2x the 1k cost. Provisioning is timed too.
#   (c) peak memory of the backend running (a) with every note in one pass
#       (magic_sync.notes_per_pass = C_ROWS): VmHWM from /proc/<pid>/status (reset before the
#       pass through /proc/<pid>/clear_refs when allowed), and the peak of its private memory
#       (RssAnon, sampled every 50 ms), at C_SMALL and C_ROWS notes: bounded means the same.
# Medians over the rounds; ratios are medians of the ratios measured within a round.
#
#   make bench-relay                                   (or bench/relay/run.sh)
#   A_ROWS=100000 A_ROUNDS=3 B_SIZES="1000 10000 100000" B_ROUNDS=5 C_SMALL=100000 C_ROWS=1000000
#   EXPLAIN=1   also loads auto_explain (log_nested_statements, log_analyze) for one extra
#               round of (a) and (b) and prints the slowest statements inside sync.pass()
set -euo pipefail
cd "$(dirname "$0")/../.."
A_ROWS=${A_ROWS:-100000}
A_ROUNDS=${A_ROUNDS:-3}
B_SIZES=${B_SIZES:-1000 10000 100000}
B_ROUNDS=${B_ROUNDS:-5}
B_CATALOG_ROWS=${B_CATALOG_ROWS:-100}
C_SMALL=${C_SMALL:-100000}
C_ROWS=${C_ROWS:-1000000}
EXPLAIN=${EXPLAIN:-0}

. scripts/cluster.sh
BINDIR=$(pg_config --bindir)
HERE=bench/relay
WORK=$(mktemp -d /tmp/magic_sync_bench_relay.XXXXXX)
chmod 755 "$WORK"
[ "$(id -u)" -eq 0 ] && chown postgres: "$WORK"
cleanup() {
    cluster_stop
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The decoder the peers build on, for this benchmark only (the product does not use it).
if [ ! -e "$(pg_config --pkglibdir)/wal2json.so" ]; then
    [ "$(id -u)" -eq 0 ] || { echo "wal2json is missing: apt-get install postgresql-15-wal2json" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15-wal2json >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends postgresql-15-wal2json >/dev/null; }
    [ -e "$(pg_config --pkglibdir)/wal2json.so" ] ||
        { echo "wal2json is not in $(pg_config --pkglibdir) after installing postgresql-15-wal2json" >&2; exit 1; }
fi

started=$(date +%s)
conf=("shared_buffers = 256MB" "max_wal_size = 8GB" "checkpoint_timeout = 1h"
    "magic_sync.database = ''" "wal_level = logical" "max_replication_slots = 4"
    "output_plugin_libraries = 'wal2json'")
if [ "$EXPLAIN" = 1 ]; then
    conf+=("session_preload_libraries = 'auto_explain'" "auto_explain.log_min_duration = -1"
        "auto_explain.log_nested_statements = on" "auto_explain.log_analyze = on"
        "auto_explain.log_timing = on" "auto_explain.log_buffers = off" "log_line_prefix = ''")
fi
cluster_start "${conf[@]}"
q() { as_pg "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -At "$@"; }
as_pg "$BINDIR/createdb" base
cp "$HERE/setup.sql" "$WORK/setup.sql"
chmod 644 "$WORK/setup.sql"
q -d base -f "$WORK/setup.sql" >/dev/null

RESULTS=$WORK/results # timing: db label n passes ms notes messages quiet_ms; mem: db label hwm_kb anon_kb reset
: >"$RESULTS"
PASSES=$WORK/passes # db label n pass ms notes messages
: >"$PASSES"

new_db() { # name
    as_pg "$BINDIR/createdb" -T base "$1"
}
collect() { # db: its timings and passes into the result files, then drop it
    q -d "$1" -F ' ' -c "SELECT '$1', label, n, passes, round(ms::numeric, 3), notes, messages,
        coalesce(round(quiet_ms::numeric, 3), 0) FROM bench.timing ORDER BY at" | sed 's/^/timing /' >>"$RESULTS"
    q -d "$1" -F ' ' -c "SELECT '$1', label, n, pass, round(ms::numeric, 3), notes, messages
        FROM bench.pass_log" >>"$PASSES"
    as_pg "$BINDIR/dropdb" "$1"
}

# Runs a psql script in db in a backend whose memory is watched; records "mem db label hwm anon".
measured() { # db label sql
    local db=$1 label=$2 pidfile=$WORK/backend.pid script=$WORK/measured.sql
    rm -f "$pidfile"
    {
        echo "SELECT pg_backend_pid() AS backend \\gset"
        echo "\\o $pidfile"
        echo "\\qecho :backend"
        echo "\\o"
        echo "SELECT pg_sleep(0.5);"
        echo "$3"
        echo "SELECT pg_sleep(0.3);"
    } >"$script"
    chmod 644 "$script"
    q -d "$db" -f "$script" >"$WORK/measured.out" &
    local client=$! pid="" hwm=0 anon=0 reset=no now
    for _ in $(seq 1 200); do
        [ -s "$pidfile" ] && break
        sleep 0.02
    done
    pid=$(tr -d ' \n' <"$pidfile")
    echo 5 >"/proc/$pid/clear_refs" 2>/dev/null && reset=yes
    while kill -0 "$client" 2>/dev/null; do
        if [ -r "/proc/$pid/status" ]; then
            now=$(awk '/^RssAnon:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
            [ -n "$now" ] && [ "$now" -gt "$anon" ] && anon=$now
            now=$(awk '/^VmHWM:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
            [ -n "$now" ] && hwm=$now
        fi
        sleep 0.05
    done
    wait "$client" || {
        cat "$WORK/measured.out" >&2
        exit 1
    }
    echo "mem $db $label $hwm $anon $reset" >>"$RESULTS"
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.6f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
verdict() { awk -v v="$1" -v g="$2" -v op="$3" 'BEGIN { ok = (op == ">=") ? v >= g : v <= g; print ok ? "met" : "NOT MET" }'; }
timing() { # label field [db-pattern] -> values, one per db, in the order run
    awk -v l="$1" -v f="$2" -v d="${3:-.}" '$1 == "timing" && $3 == l && $2 ~ d { print $f }' "$RESULTS"
}
elapsed() { echo "$(($(date +%s) - started)) s"; }

# (a) ---------------------------------------------------------------------------------------------
echo "(a) $A_ROWS rows through passes for one scope vs a plain copy; $A_ROUNDS rounds"
for round in $(seq 1 "$A_ROUNDS"); do
    db=a_$round
    new_db "$db"
    q -d "$db" >/dev/null <<SQL
INSERT INTO bench.registers VALUES (gen_random_uuid());
CALL bench.run_passes('a.provision', 1, true);
SELECT pg_create_logical_replication_slot('bench_a', 'wal2json');
INSERT INTO bench.items SELECT i, 'item ' || i, i % 1000, (i % 5000) / 100.0, now()
    FROM generate_series(1, $A_ROWS) i;
VACUUM ANALYZE;
CHECKPOINT;
SQL
    # The decoder reads the insert first, and its slot goes: it would hold back the horizon.
    q -d "$db" -c "CALL bench.time_decode('a.decode', 'bench_a')" \
        -c "SELECT pg_drop_replication_slot('bench_a')" -c CHECKPOINT >/dev/null
    if ((round % 2)); then
        q -d "$db" -c "CALL bench.time_copy('a.copy')" -c CHECKPOINT
        measured "$db" a.pass "CALL bench.run_passes('a.pass', $A_ROWS, true);"
    else
        measured "$db" a.pass "CALL bench.run_passes('a.pass', $A_ROWS, true);"
        q -d "$db" -c CHECKPOINT -c "CALL bench.time_copy('a.copy')"
    fi
    # Every row reached the replica: its cursor is at the scope's head, and as many rows.
    check=$(q -d "$db" -c "SELECT s.n = $A_ROWS AND m.sent = s.head AND m.confirmed = s.head
        FROM sync.scope s JOIN sync.member m ON m.scope = s.id WHERE s.match = '*'")
    [ "$check" = t ] || { echo "(a) round $round: the replica is not at head" >&2; exit 1; }
    q -d "$db" -c CHECKPOINT -c "CALL bench.time_floor('a.floor')"
    collect "$db"
    copy_ms=$(timing a.copy 6 "^$db\$")
    pass_ms=$(timing a.pass 6 "^$db\$")
    decode_ms=$(timing a.decode 6 "^$db\$")
    floor_ms=$(for step in notes encode state; do timing "a.floor.$step" 6 "^$db\$"; done | paste -sd' ')
    awk -v r="$round" -v n="$A_ROWS" -v c="$copy_ms" -v p="$pass_ms" -v f="$floor_ms" -v d="$decode_ms" 'BEGIN {
        split(f, s, " ")
        printf "  round %d: copy %9.1f ms %10.0f rows/s   passes %9.1f ms %8.0f rows/s   ratio %.4f\n",
            r, c, n / c * 1000, p, n / p * 1000, c / p
        printf "           wal2json decoding the insert %.1f ms %.0f rows/s: passes at %.3f of the decoder\n",
            d, n / d * 1000, d / p
        printf "           floor: notes %.1f + encode %.1f + state %.1f ms = %.2f copies: passes at %.3f of the floor (goal >= 0.5)\n",
            s[1], s[2], s[3], (s[1] + s[2] + s[3]) / c, (s[1] + s[2] + s[3]) / p }'
done
echo "  ($(elapsed))"

# (b) ---------------------------------------------------------------------------------------------
echo "(b) one catalog change fanned out to $B_SIZES live replicas; $B_ROUNDS rounds"
for n in $B_SIZES; do
    db=b_$n
    new_db "$db"
    q -d "$db" >/dev/null <<SQL
INSERT INTO bench.items SELECT i, 'item ' || i, i % 1000, (i % 5000) / 100.0, now()
    FROM generate_series(1, $B_CATALOG_ROWS) i;
CALL bench.run_passes('b.catalog', 0, true);
INSERT INTO bench.registers SELECT gen_random_uuid() FROM generate_series(1, $n);
VACUUM ANALYZE;
CHECKPOINT;
SQL
    measured "$db" b.provision "CALL bench.run_passes('b.provision', $n, true);"
    check=$(q -d "$db" -c "SELECT count(*) FROM sync.replica r WHERE r.live AND NOT EXISTS
        (SELECT FROM sync.member m JOIN sync.scope s ON s.id = m.scope
         WHERE m.replica = r.id AND (m.confirmed < s.head OR m.sent < s.head))")
    [ "$check" = "$n" ] || { echo "(b) $n: $check replicas at head" >&2; exit 1; }
    q -d "$db" -c "VACUUM ANALYZE" -c CHECKPOINT
    read -r ms passes <<<"$(q -d "$db" -F " " -c "SELECT ms, passes FROM bench.timing WHERE label = 'b.provision'")"
    awk -v n="$n" -v ms="$ms" -v p="$passes" 'BEGIN {
        printf "  provisioned %6d replicas in %9.1f ms (%d passes, delivery untimed): %7.1f us per replica\n",
            n, ms, p, ms / n * 1000 }'
done
read -ra sizes <<<"$B_SIZES"
for round in $(seq 1 "$B_ROUNDS"); do
    k=$(((round - 1) % ${#sizes[@]}))
    line="  round $round:"
    for n in "${sizes[@]:k}" "${sizes[@]:0:k}"; do
        db=b_$n
        q -d "$db" -c "UPDATE bench.items SET qty = qty + 1, updated_at = now() WHERE id = 1" -c CHECKPOINT
        measured "$db" b.fanout "CALL bench.run_passes('b.fanout', $n, false);"
        # Settle: everything delivered and confirmed, as before the change.
        q -d "$db" -c "CALL bench.deliver()" -c "CALL bench.run_passes('b.settle', $n, true)" \
            -c "VACUUM sync.outbox, sync.member, sync.replica, sync.confirmation"
        ms=$(q -d "$db" -c "SELECT ms || ' ' || messages FROM bench.timing WHERE label = 'b.fanout' ORDER BY at DESC LIMIT 1")
        read -r ms messages <<<"$ms"
        [ "$messages" -eq "$n" ] || { echo "(b) $n: $messages messages for $n replicas" >&2; exit 1; }
        line+=$(awk -v n="$n" -v ms="$ms" 'BEGIN { printf "  %d: %.1f ms (%.2f us/replica)", n, ms, ms / n * 1000 }')
    done
    echo "$line"
done
for n in $B_SIZES; do collect "b_$n"; done
echo "  ($(elapsed))"

# (c) ---------------------------------------------------------------------------------------------
echo "(c) peak backend memory of one pass over $C_SMALL and $C_ROWS notes"
for n in $C_SMALL $C_ROWS; do
    db=c_$n
    new_db "$db"
    q -d "$db" >/dev/null <<SQL
INSERT INTO bench.registers VALUES (gen_random_uuid());
CALL bench.run_passes('c.provision', 1, true);
INSERT INTO bench.items SELECT i, 'item ' || i, i % 1000, (i % 5000) / 100.0, now()
    FROM generate_series(1, $n) i;
VACUUM ANALYZE;
CHECKPOINT;
SQL
    measured "$db" c.pass "SET magic_sync.notes_per_pass = $n;
CALL bench.run_passes('c.pass', $n, false, 1);"
    notes=$(q -d "$db" -c "SELECT notes FROM bench.timing WHERE label = 'c.pass'")
    [ "$notes" -eq "$n" ] || { echo "(c) $n: the pass took $notes notes" >&2; exit 1; }
    collect "$db"
    read -r hwm anon reset <<<"$(awk -v d="$db" '$1 == "mem" && $2 == d { print $4, $5, $6 }' "$RESULTS")"
    awk -v n="$n" -v ms="$(timing c.pass 6 "^$db\$")" -v h="$hwm" -v a="$anon" -v r="$reset" 'BEGIN {
        printf "  %7d notes in one pass: %9.1f ms (%6.0f notes/s)   VmHWM %7.1f MiB%s   peak RssAnon %6.1f MiB\n",
            n, ms, n / ms * 1000, h / 1024, r == "yes" ? "" : " (since backend start)", a / 1024 }'
done
echo "  ($(elapsed))"

# EXPLAIN: the statements of one pass, slowest first ----------------------------------------------
if [ "$EXPLAIN" = 1 ]; then
    explain() { # db label sql
        local log=$CLUSTER_DIR/server.log from
        from=$(wc -c <"$log")
        q -d "$1" -c "SET auto_explain.log_min_duration = 0" -c "$3" >/dev/null
        tail -c +"$((from + 1))" "$log" >"$WORK/explain.$2.log"
        echo "  $2: slowest statements inside the pass (auto_explain, log_analyze):"
        awk '/^LOG:  duration: / { if (d != "") print d "\t" q; d = $3; q = ""; intext = 0; next }
             /^[ \t]*Query Text:/ { sub(/^[ \t]*Query Text:[ \t]*/, ""); q = $0; intext = 1; next }
             intext && /^[ \t]*$/ { intext = 0; next }
             intext { q = q " " $0 }
             END { if (d != "") print d "\t" q }' "$WORK/explain.$2.log" |
            awk -F'\t' '{ gsub(/[ \t]+/, " ", $2); print $1 "\t" substr($2, 1, 170) }' |
            grep -v 'run_passes\|bench.pass_log\|sync.pass()' | sort -t$'\t' -k1,1gr |
            awk -F'\t' 'NR <= 8 { printf "    %10.1f ms  %s\n", $1, $2 }'
        echo "    (full plans: $WORK/explain.$2.log, kept with KEEP=1)"
    }
    db=e_a
    new_db "$db"
    q -d "$db" >/dev/null <<SQL
INSERT INTO bench.registers VALUES (gen_random_uuid());
CALL bench.run_passes('e.provision', 1, true);
INSERT INTO bench.items SELECT i, 'item ' || i, i % 1000, (i % 5000) / 100.0, now()
    FROM generate_series(1, $A_ROWS) i;
VACUUM ANALYZE;
SQL
    echo "EXPLAIN"
    explain "$db" a.pass "CALL bench.run_passes('e.pass', $A_ROWS, false, 1)"
    for n in $B_SIZES; do last=$n; done
    db=e_b
    new_db "$db"
    q -d "$db" >/dev/null <<SQL
INSERT INTO bench.items SELECT i, 'item ' || i, i % 1000, (i % 5000) / 100.0, now()
    FROM generate_series(1, $B_CATALOG_ROWS) i;
INSERT INTO bench.registers SELECT gen_random_uuid() FROM generate_series(1, $last);
CALL bench.run_passes('e.provision', $last, true);
CALL bench.deliver();
CALL bench.run_passes('e.settle', $last, true);
VACUUM ANALYZE;
UPDATE bench.items SET qty = qty + 1 WHERE id = 1;
SQL
    explain "$db" "b.fanout.$last" "CALL bench.run_passes('e.fanout', $last, false, 1)"
    [ "${KEEP:-0}" = 1 ] && { cp "$WORK"/explain.*.log /tmp/ && echo "  (copied to /tmp/explain.*.log)"; }
fi

# Summary -----------------------------------------------------------------------------------------
echo
echo "magic_sync bench-relay"
echo "machine: $(nproc) cores, $(free -g | awk '/^Mem:/ { print $2 }') GiB RAM, $(uname -m), $("$BINDIR/postgres" --version), load average $(cut -d' ' -f1-3 /proc/loadavg)"
copy_med=$(timing a.copy 6 | median)
pass_med=$(timing a.pass 6 | median)
ratio_a=$(paste <(timing a.copy 6) <(timing a.pass 6) | awk '{ printf "%.6f\n", $1 / $2 }' | median)
plan_ms=$(awk '$2 == "a.pass" && $6 > 0 { t[$1] += $5 } END { for (d in t) print t[d] }' "$PASSES" | median)
outbox_ms=$(awk '$2 == "a.pass" && $6 == 0 { t[$1] += $5 } END { for (d in t) print t[d] }' "$PASSES" | median)
passes_a=$(timing a.pass 5 | median)
awk -v n="$A_ROWS" -v c="$copy_med" -v p="$pass_med" -v r="$ratio_a" -v v="$(verdict "$ratio_a" 0.33 '>=')" \
    -v pl="$plan_ms" -v ob="$outbox_ms" -v np="$passes_a" 'BEGIN {
    printf "(a) one scope, %d rows:  copy %.0f rows/s (%.1f ms)   passes %.0f rows/s (%.1f ms, %d passes)   ratio %.4f (goal >= 0.33: %s)\n",
        n, n / c * 1000, c, n / p * 1000, p, np, r, v
    printf "    of the pass time: %.1f ms in the passes that took notes (planning + first messages), %.1f ms in outbox-only passes\n", pl, ob }'
decode_med=$(timing a.decode 6 | median)
ratio_decode=$(paste <(timing a.decode 6) <(timing a.pass 6) | awk '{ printf "%.6f\n", $1 / $2 }' | median)
awk -v n="$A_ROWS" -v d="$decode_med" -v r="$ratio_decode" -v v="$(verdict "$ratio_decode" 1.0 '>=')" 'BEGIN {
    printf "    wal2json decoding the same insert from a slot: %.0f rows/s (%.1f ms); passes at %.3f of the decoder (goal >= 1.0: %s)\n",
        n / d * 1000, d, r, v }'
floor_copies() { # step...: per round, the steps' time in copies; the median
    for db in $(awk '$1 == "timing" && $3 == "a.copy" { print $2 }' "$RESULTS"); do
        awk -v d="$db" -v steps="$*" '$1 == "timing" && $2 == d {
            if ($3 == "a.copy") c = $6
            for (i = split(steps, s, " "); i > 0; i--) if ($3 == "a.floor." s[i]) f += $6 }
            END { printf "%.6f\n", f / c }' "$RESULTS"
    done | median
}
awk -v no="$(floor_copies notes)" -v en="$(floor_copies encode)" -v st="$(floor_copies state)" \
    -v all="$(floor_copies notes encode state)" 'BEGIN {
    printf "    the floor of docs/DESIGN.md §3/§4, bare set statements over the same rows, in copies: taking the notes %.2f,\n", no
    printf "    encoding the rows %.2f, writing their state once (its two indexes) %.2f; in all %.2f copies,\n", en, st, all
    printf "    so no pass of this design can reach a ratio above %.3f (the goal allows 3 copies in all)\n", 1 / all }'
floor_ratio=$(for db in $(awk '$1 == "timing" && $3 == "a.pass" { print $2 }' "$RESULTS"); do
    awk -v d="$db" '$1 == "timing" && $2 == d {
        if ($3 == "a.pass") p = $6
        if ($3 ~ /^a\.floor\./) f += $6 }
        END { printf "%.6f\n", f / p }' "$RESULTS"
done | median)
awk -v r="$floor_ratio" -v v="$(verdict "$floor_ratio" 0.5 '>=')" 'BEGIN {
    printf "    passes at %.3f of the floor (median of the rounds; goal >= 0.5: %s)\n", r, v }'
first=${sizes[0]}
last=${sizes[${#sizes[@]} - 1]}
for n in $B_SIZES; do
    ms=$(timing b.fanout 6 "^b_$n\$" | median)
    prov=$(timing b.provision 6 "^b_$n\$" | median)
    hwm=$(awk -v d="b_$n" '$1 == "mem" && $2 == d && $3 == "b.fanout" { print $4 }' "$RESULTS" | median)
    anon=$(awk -v d="b_$n" '$1 == "mem" && $2 == d && $3 == "b.fanout" { print $5 }' "$RESULTS" | median)
    awk -v n="$n" -v ms="$ms" -v pr="$prov" -v h="$hwm" -v a="$anon" 'BEGIN {
        printf "(b) %6d replicas: fan-out pass %9.1f ms = %6.2f us per replica   (VmHWM %.0f MiB, peak RssAnon %.1f MiB)   provisioning %.1f s = %.0f us per replica\n",
            n, ms, ms / n * 1000, h / 1024, a / 1024, pr / 1000, pr / n * 1000 }'
done
ratio_b=$(for round in $(seq 1 "$B_ROUNDS"); do
    a=$(awk -v d="b_$first" '$1 == "timing" && $2 == d && $3 == "b.fanout" { print $6 }' "$RESULTS" | sed -n "${round}p")
    b=$(awk -v d="b_$last" '$1 == "timing" && $2 == d && $3 == "b.fanout" { print $6 }' "$RESULTS" | sed -n "${round}p")
    awk -v a="$a" -v b="$b" -v na="$first" -v nb="$last" 'BEGIN { printf "%.6f\n", (b / nb) / (a / na) }'
done | median)
printf '    per-replica cost %s / %s: %.3f (goal <= 1.2: %s)\n' "$last" "$first" "$ratio_b" "$(verdict "$ratio_b" 1.2 '<=')"
for n in $C_SMALL $C_ROWS; do
    read -r hwm anon reset <<<"$(awk -v d="c_$n" '$1 == "mem" && $2 == d { print $4, $5, $6 }' "$RESULTS")"
    ms=$(timing c.pass 6 "^c_$n\$")
    awk -v n="$n" -v h="$hwm" -v a="$anon" -v ms="$ms" -v r="$reset" 'BEGIN {
        printf "(c) %7d notes in one pass: VmHWM %.1f MiB%s, peak RssAnon %.1f MiB   (%.1f s, %.0f notes/s)\n",
            n, h / 1024, r == "yes" ? "" : " (since backend start)", a / 1024, ms / 1000, n / ms * 1000 }'
done
read -r h1 a1 _ <<<"$(awk -v d="c_$C_SMALL" '$1 == "mem" && $2 == d { print $4, $5 }' "$RESULTS")"
read -r h2 a2 _ <<<"$(awk -v d="c_$C_ROWS" '$1 == "mem" && $2 == d { print $4, $5 }' "$RESULTS")"
awk -v h1="$h1" -v h2="$h2" -v a1="$a1" -v a2="$a2" -v n1="$C_SMALL" -v n2="$C_ROWS" 'BEGIN {
    printf "    %d / %d notes (%.0fx): VmHWM %.2fx, private memory %.2fx\n", n2, n1, n2 / n1, h2 / h1, a2 / a1 }'
echo "anchors: Electric 4,000-6,000 row changes/s matching a shape; PowerSync 2,000-4,000 replicated ops/s"
echo "took $(elapsed)"
