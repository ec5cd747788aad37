#!/usr/bin/env bash
# Runs every test runner of magic_sync and ends with one line: "N passed, N failed".
# Expects the extension to be installed (make install) and the programs built (make all).
# PostgreSQL runs as an unprivileged user in a temporary directory that is always removed.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bindir=$(pg_config --bindir)
pgxs_dir=$(dirname "$(pg_config --pgxs)")/..
pg_regress="$pgxs_dir/test/regress/pg_regress"
pg_isolation_regress="$pgxs_dir/test/isolation/pg_isolation_regress"

work=$(mktemp -d /tmp/magic_sync_test.XXXXXX)
cleanup() { [ -n "${KEEP_TEST_OUTPUT:-}" ] && { echo "test output kept in $work"; return; }; rm -rf "$work"; }
trap cleanup EXIT
chmod 755 "$work"

# Run as the unprivileged postgres user when we are root (initdb and postgres refuse root).
as_pg() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
[ "$(id -u)" -eq 0 ] && chown postgres: "$work"

passed=0
failed=0
skipped=()
failures=()
record() { # name outcome(0 ok)
    if [ "$2" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); failures+=("$1"); fi
}

section() { printf '\n== %s ==\n' "$1"; }

# MAGIC_SYNC_TESTS=regress,isolation runs only those runners (format, schedules, gtest, regress,
# isolation, shell, sim); unset, all of them.
wanted() { [ -z "${MAGIC_SYNC_TESTS:-}" ] || [[ ",$MAGIC_SYNC_TESTS," == *",$1,"* ]]; }

# Counts "... ok" / "... FAILED" lines of a pg_regress-style log.
count_regress() { # label logfile status outputdir
    local ok bad
    ok=$(grep -cE '\.\.\. ok' "$2")
    bad=$(grep -cE '\.\.\. (FAILED|failed)' "$2")
    passed=$((passed + ok))
    failed=$((failed + bad))
    if [ "$bad" -gt 0 ] || { [ "$3" -ne 0 ] && [ "$ok" -eq 0 ]; }; then
        [ "$bad" -eq 0 ] && failed=$((failed + 1))
        failures+=("$1")
        [ -f "$4/regression.diffs" ] && head -c 20000 "$4/regression.diffs"
    fi
}

if wanted format; then
section "format"
make -s format-check
record format-check $?
fi

if wanted schedules; then
section "schedules"
# Every regress and isolation test must be in its schedule, or it would silently never run.
schedule_ok=0
for f in sql/*.sql; do
    name=$(basename "$f" .sql)
    grep -qwE "^test:.*\b$name\b" tests/schedule || { echo "sql/$name.sql is not in tests/schedule"; schedule_ok=1; }
done
for f in tests/isolation/specs/*.spec; do
    name=$(basename "$f" .spec)
    grep -qwE "^test:.*\b$name\b" tests/isolation/schedule ||
        { echo "$f is not in tests/isolation/schedule"; schedule_ok=1; }
done
[ $schedule_ok -eq 0 ] && echo "every test is in its schedule"
record schedules $schedule_ok
fi

if wanted gtest; then
section "GoogleTest"
for binary in build/tests/*_tests; do
    name=$(basename "$binary")
    if "$binary" --gtest_brief=1 >"$work/$name.log" 2>&1; then status=0; else status=1; fi
    tail -n 30 "$work/$name.log"
    gtest_passed=$(sed -nE 's/^\[  PASSED  \] ([0-9]+) tests?.*/\1/p' "$work/$name.log" | tail -1)
    gtest_failed=$(sed -nE 's/^\[  FAILED  \] ([0-9]+) tests?, listed below.*/\1/p' "$work/$name.log" | tail -1)
    passed=$((passed + ${gtest_passed:-0}))
    failed=$((failed + ${gtest_failed:-0}))
    # A binary that failed without a count (a crash) still counts as one failure.
    if [ $status -ne 0 ] && [ -z "${gtest_failed:-}" ]; then failed=$((failed + 1)); fi
    [ $status -ne 0 ] && failures+=("$name")
done
fi

temp_config="$work/temp.conf"
cat >"$temp_config" <<CONF
shared_preload_libraries = 'magic_sync'
max_worker_processes = 16
CONF

if wanted regress; then
section "regress (pg_regress)"
mkdir -p "$work/regress"
cp -r sql expected tests/schedule "$work/regress/"
[ "$(id -u)" -eq 0 ] && chown -R postgres: "$work"
as_pg "$pg_regress" --bindir="$bindir" --temp-instance="$work/regress/instance" \
    --temp-config="$temp_config" --inputdir="$work/regress" --outputdir="$work/regress" \
    --schedule="$work/regress/schedule" --dbname=regression >"$work/regress.log" 2>&1
status=$?
grep -E '^(test|     |ok|not ok| *[0-9]+ of|=+|.*tests passed)' "$work/regress.log" | grep -vE '^=+$' | head -100
count_regress regress "$work/regress.log" $status "$work/regress"
fi

if wanted isolation; then
section "isolation (pg_isolation_regress)"
mkdir -p "$work/isolation"
cp -r tests/isolation/specs tests/isolation/expected tests/isolation/schedule "$work/isolation/"
[ "$(id -u)" -eq 0 ] && chown -R postgres: "$work"
as_pg "$pg_isolation_regress" --bindir="$bindir" --temp-instance="$work/isolation/instance" \
    --temp-config="$temp_config" --inputdir="$work/isolation" --outputdir="$work/isolation" \
    --schedule="$work/isolation/schedule" --dbname=isolation_regression >"$work/isolation.log" 2>&1
status=$?
grep -E '(\.\.\. |tests? (passed|failed))' "$work/isolation.log" | head -100
count_regress isolation "$work/isolation.log" $status "$work/isolation"
fi

if wanted shell; then
section "shell tests (real clusters and processes)"
for test in tests/shell/*.sh; do
    name=$(basename "$test" .sh)
    "$test" >"$work/$name.log" 2>&1
    outcome=$?
    if [ $outcome -eq 0 ]; then
        echo "$name ... ok"
        record "$name" 0
    elif [ $outcome -eq 77 ]; then
        # A test that cannot run here says why in its last line (exit 77, as automake's).
        echo "$name ... SKIPPED: $(tail -n 1 "$work/$name.log")"
        skipped+=("$name")
    else
        echo "$name ... FAILED"
        tail -n 40 "$work/$name.log"
        record "$name" 1
    fi
done
fi

# The seeded whole-system simulation (tests/sim, issue 19): each seed of this fixed set, run with
# every kind of step, counts as one test. Together they cover every kind of step, partitioned
# and not, replicas declared before and after the tables. `make sim SEED=n` replays one.
sim_seeds="1 3 6 13 25 146"
if wanted sim; then
section "simulation (build/tests/sim)"
# A new kind of step, or a change that moves the seeds' choices, must not leave a kind untried.
untried=$(comm -13 <(for seed in $sim_seeds; do build/tests/sim --seed "$seed" --print; done |
                     sed -nE 's/^  \[[0-9]+\] ([a-z_]+).*/\1/p' | sort -u) \
                   <(build/tests/sim --list-kinds | awk '{print $1}' | sort) | tr '\n' ' ')
if [ -z "$untried" ]; then
    echo "sim seeds $sim_seeds take every kind of step ... ok"
    record sim_seeds_take_every_kind 0
else
    echo "sim seeds $sim_seeds never take: $untried ... FAILED (choose seeds that do)"
    record sim_seeds_take_every_kind 1
fi
for seed in $sim_seeds; do
    if build/tests/sim --seed "$seed" >"$work/sim_$seed.log" 2>&1; then
        echo "sim seed $seed ... ok ($(sed -nE 's/^seed [0-9]+: passed, (.*)$/\1/p' "$work/sim_$seed.log"))"
        record "sim_seed_$seed" 0
    else
        echo "sim seed $seed ... FAILED"
        head -c 30000 "$work/sim_$seed.log"
        record "sim_seed_$seed" 1
    fi
done
fi

echo
if [ ${#failures[@]} -gt 0 ]; then echo "failed: ${failures[*]}"; fi
if [ ${#skipped[@]} -gt 0 ]; then
    echo "skipped (could not run here; see above): ${skipped[*]}"
    echo "$passed passed, $failed failed, ${#skipped[@]} skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
