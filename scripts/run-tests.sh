#!/usr/bin/env bash
# Runs every test of magic_sync and ends with one line: "N passed, N failed".
# Expects the extension to be installed (make install) and what the tests run built
# (make test-builds). PostgreSQL runs as an unprivileged user in temporary directories that are
# always removed.
#
# The tests are jobs that share nothing (each has its own cluster, directory and ports), run
# MAGIC_SYNC_TEST_JOBS at a time (default: twice the cores, as most of them wait on servers and
# processes), the longest first. A job's line says how long it took; a failed job's log follows it.
#
#   MAGIC_SYNC_TESTS=regress,isolation   only these groups (format, schedules, regress,
#                                        isolation, server, sanitizers, fuzz, shell, sim,
#                                        conformance, browser)
#   MAGIC_SYNC_TEST_JOBS=1               one job at a time
#   KEEP_TEST_OUTPUT=1                   keep the logs and the regress outputs
# The fleet page's test keeps its screenshot in build/test-artifacts/ (fleet_page.png) anyway.
set -uo pipefail
# bash reads a script as it runs it: the braces around the rest make it read all of it first, so
# an edit of this file during a run changes the next run, never this one.
{
case "${1:-}" in
    -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    "") ;;
    *) echo "run-tests: no arguments are taken (see --help)" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bindir=$(pg_config --bindir)
# The server's own programs first: Debian's /usr/bin/psql is pg_wrapper, a Perl script that
# picks a version and then runs this same $bindir/psql; it cost ~45-60 ms of CPU per call, and
# the shell tests and the demo make ~135 calls (the same psql runs, so nothing they test
# changes).
export PATH="$bindir:$PATH"
pgxs_dir=$(dirname "$(pg_config --pgxs)")/..
pg_regress="$pgxs_dir/test/regress/pg_regress"
pg_isolation_regress="$pgxs_dir/test/isolation/pg_isolation_regress"

# Everything the tests write goes under one directory, in memory where the machine has a tmpfs at
# /dev/shm with room: the clusters' copies, WAL and logs, the replicas' SQLite files and their
# fsyncs then cost no disk (on this 2-core machine the suite's CPU fell by an eighth). Every test
# makes its directories under $TMPDIR (tests/support/temp_dir.hpp, mktemp).
place=/tmp
if [ -d /dev/shm ] && [ -w /dev/shm ] &&
    [ "$(df --output=avail -k /dev/shm 2>/dev/null | tail -1)" -gt $((4 * 1024 * 1024)) ] 2>/dev/null; then
    place=/dev/shm
fi
work=$(mktemp -d "$place/magic_sync_test.XXXXXX")
cleanup() {
    local pids
    pids=$(jobs -p)
    [ -n "$pids" ] && kill $pids 2>/dev/null
    [ -n "${KEEP_TEST_OUTPUT:-}" ] && { echo "test output kept in $work"; return; }
    rm -rf "$work"
}
trap cleanup EXIT
chmod 755 "$work"
mkdir -m 1777 "$work/tmp"
export TMPDIR=$work/tmp

# Run as the unprivileged postgres user when we are root (initdb and postgres refuse root).
as_pg() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
[ "$(id -u)" -eq 0 ] && chown postgres: "$work"

# One initdb for every cluster the tests make: each copies this data directory instead
# (tests/support/cluster.cpp, scripts/cluster.sh), a tenth of initdb's cost.
as_pg "$bindir/initdb" -D "$work/pgdata" -U postgres -A trust --no-sync >"$work/initdb.log" 2>&1 ||
    { cat "$work/initdb.log"; exit 1; }
export MAGIC_SYNC_TEST_PGDATA=$work/pgdata

wanted() { [ -z "${MAGIC_SYNC_TESTS:-}" ] || [[ ",$MAGIC_SYNC_TESTS," == *",$1,"* ]]; }

# ---- The jobs ------------------------------------------------------------------------------
# A job is a name, a weight (its seconds on this 2-core machine, for the order: the longest start
# first), a kind that says how its outcome is counted, and a command. Its output goes to
# $work/<name>.log; it ends by writing its counts, "passed failed", to $work/<name>.counts.
job_names=()
declare -A job_weight=() job_kind=() job_command=()
add_job() { # name weight kind command...
    job_names+=("$1")
    job_weight[$1]=$2
    job_kind[$1]=$3
    job_command[$1]=$(printf '%q ' "${@:4}")
}

# Kinds. Each runs the command and writes "passed failed" for the summary.
#   one:     the command is one test (exit 0 passes, 77 is skipped with its last line as reason)
#   gtest:   a GoogleTest binary: its own counts; a crash without counts is one failure
#   sanitized: a gtest run under the sanitizers: also fails on a sanitizer's report
#   regress: pg_regress: its "... ok" and "... FAILED" lines
run_kind() { # kind name command...
    local kind=$1 name=$2 log=$work/$2.log status
    shift 2
    "$@" >"$log" 2>&1
    status=$?
    case $kind in
    one)
        if [ $status -eq 77 ]; then echo "skip" >"$work/$name.counts"
        elif [ $status -eq 0 ]; then echo "1 0" >"$work/$name.counts"
        else echo "0 1" >"$work/$name.counts"; fi ;;
    gtest | sanitized)
        if [ "$kind" = sanitized ] &&
            grep -qE '^(==[0-9]+==ERROR|.*runtime error:|SUMMARY: (Address|Leak|UndefinedBehavior)Sanitizer)' "$log"; then
            status=1
            echo "(a sanitizer reported an error)" >>"$log"
        fi
        local ok bad
        ok=$(sed -nE 's/^\[  PASSED  \] ([0-9]+) tests?.*/\1/p' "$log" | tail -1)
        bad=$(sed -nE 's/^\[  FAILED  \] ([0-9]+) tests?, listed below.*/\1/p' "$log" | tail -1)
        # A run that failed without a count of failures (a crash, a sanitizer) is one failure.
        [ $status -ne 0 ] && [ -z "$bad" ] && bad=1
        echo "${ok:-0} ${bad:-0}" >"$work/$name.counts" ;;
    regress)
        local ok bad
        ok=$(grep -cE '\.\.\. ok' "$log")
        bad=$(grep -cE '\.\.\. (FAILED|failed)' "$log")
        # pg_regress that failed before any test ran is one failure.
        [ $status -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
        echo "$ok $bad" >"$work/$name.counts" ;;
    esac
    return $status
}

# ---- format and schedules ------------------------------------------------------------------
if wanted format; then
    add_job format-check 2 one make -s format-check
fi

check_schedules() {
    # Every regress and isolation test must be in its schedule, or it would silently never run.
    local status=0 f name
    for f in sql/*.sql; do
        name=$(basename "$f" .sql)
        grep -qwE "^test:.*\b$name\b" tests/schedule || { echo "sql/$name.sql is not in tests/schedule"; status=1; }
    done
    for f in tests/isolation/specs/*.spec; do
        name=$(basename "$f" .spec)
        grep -qwE "^test:.*\b$name\b" tests/isolation/schedule ||
            { echo "$f is not in tests/isolation/schedule"; status=1; }
    done
    [ $status -eq 0 ] && echo "every test is in its schedule"
    return $status
}
if wanted schedules; then
    add_job schedules 1 one check_schedules
fi

# ---- pg_regress and pg_isolation_regress, each in its own temporary instance ----------------
temp_config="$work/temp.conf"
cat >"$temp_config" <<CONF
shared_preload_libraries = 'magic_sync'
max_worker_processes = 16
CONF

run_regress() { # program dir schedule-dir dbname
    local program=$1 dir=$work/$2 dbname=$4
    mkdir -p "$dir"
    cp -r $3 "$dir/"
    [ "$(id -u)" -eq 0 ] && chown -R postgres: "$dir"
    as_pg "$program" --bindir="$bindir" --temp-instance="$dir/instance" \
        --temp-config="$temp_config" --inputdir="$dir" --outputdir="$dir" \
        --schedule="$dir/schedule" --dbname="$dbname"
    local status=$?
    [ -f "$dir/regression.diffs" ] && head -c 20000 "$dir/regression.diffs"
    return $status
}
if wanted regress; then
    add_job regress 25 regress run_regress "$pg_regress" regress "sql expected tests/schedule" regression
fi
if wanted isolation; then
    add_job isolation 8 regress run_regress "$pg_isolation_regress" isolation \
        "tests/isolation/specs tests/isolation/expected tests/isolation/schedule" isolation_regression
fi

# ---- the server tests: a job per test, each with its own cluster ----------------------------
# Their weights: seconds each took here, for the order (the rest take a few).
declare -A server_weight=(
    [Repair.DriftOfEverySizeInThirtyThousandRows]=40
    [Fault.EveryReplicaConvergesAfterEachFaultUnderLoad]=65
    [Worker.WaitsForItsDatabaseWithoutCrashLooping]=17
    [NatsCluster.ANodeKilledUnderLoadLosesNothingAndAppliesNothingTwice]=15
    [Repair.DriftFoundAndRepairedByRange]=13
    [Worker.WaitsForItsRoleAndTheTemporaryPrivilege]=12
    [Worker.ALauncherStartedAgainLeavesOneRelay]=12
    [Pull.AHundredReplicasPullingFromOneSenderHoldWhatTheTablesSay]=11
    [Fleet.ThePageShowsTheDeviceThatWasCutFailing]=11
)
if wanted server; then
    for test in $(build/tests/server_tests --gtest_list_tests --gtest_filter=-Browser.* |
                  awk '/^[A-Za-z]/ {suite = $1} /^  / {print suite $1}'); do
        add_job "server:$test" "${server_weight[$test]:-5}" gtest \
            build/tests/server_tests --gtest_brief=1 --gtest_filter="$test"
    done
fi

# ---- the unit, replica and sender tests, under the sanitizers; the replica's under valgrind --
# Leaks are errors; so is any undefined behaviour (the build also has -fno-sanitize-recover=all).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# A leak of libnats' own at teardown, not ours: tests/lsan.supp says which and why.
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/lsan.supp:print_suppressions=0}
if wanted sanitizers; then
    add_job sanitized:unit 3 sanitized build/asan/tests/unit_tests --gtest_brief=1
    add_job sanitized:replica 12 sanitized build/asan/tests/replica_tests --gtest_brief=1
    # The sender tests mostly wait on their sinks: three shards side by side. The tests start
    # build/asan/bin/magic-sync-sender (the replica's CLI tests find theirs beside the binary).
    for shard in 0 1 2; do
        add_job "sanitized:sender-$shard" 30 sanitized env GTEST_TOTAL_SHARDS=3 GTEST_SHARD_INDEX=$shard \
            MAGIC_SYNC_SENDER=build/asan/bin/magic-sync-sender build/asan/tests/sender_tests --gtest_brief=1
    done
    # valgrind: the replica library tests (SQLite only, no processes) of the unsanitized build.
    add_job valgrind:replica 25 sanitized valgrind --error-exitcode=1 --leak-check=full --quiet \
        build/tests/replica_library_tests --gtest_brief=1 --gtest_filter='ReplicaTest.*'
fi

# ---- the bounded fuzz run: each libFuzzer target for FUZZ_SECONDS (10) from the seed corpus ----
# (scripts/fuzz.sh; a crash, hang, leak or broken property fails it; `make fuzz` runs longer).
# 10 s each, the seed corpus and then new inputs: the suite's budget went to the browser and
# conformance jobs, and `make fuzz-quick` (20 s) or `make fuzz` (600 s) fuzz for longer.
if wanted fuzz; then
    for target in decode canonical upload; do
        add_job "fuzz:$target" "${FUZZ_SECONDS:-10}" one \
            scripts/fuzz.sh --seconds "${FUZZ_SECONDS:-10}" --jobs 1 "$target"
    done
fi

# ---- the shell tests: real clusters and processes ------------------------------------------
declare -A shell_weight=([upgrade]=30 [demo]=9 [protocol_barrier]=8)
if wanted shell; then
    for test in tests/shell/*.sh; do
        name=$(basename "$test" .sh)
        add_job "shell:$name" "${shell_weight[$name]:-3}" one "$test"
    done
fi

# ---- the seeded whole-system simulation (tests/sim): each seed of a fixed set is one test -----
# Together they take every kind of step, partitioned and not, replicas declared before and after
# the tables. `make sim SEED=n` replays one.
sim_seeds="264 163 111 228"
sim_take_every_kind() {
    # A new kind of step, or a change that moves the seeds' choices, must not leave a kind untried.
    local untried
    untried=$(comm -13 <(for seed in $sim_seeds; do build/tests/sim --seed "$seed" --print; done |
                         sed -nE 's/^  \[[0-9]+\] ([a-z_]+).*/\1/p' | sort -u) \
                       <(build/tests/sim --list-kinds | awk '{print $1}' | sort) | tr '\n' ' ')
    if [ -z "$untried" ]; then
        echo "sim seeds $sim_seeds take every kind of step"
    else
        echo "sim seeds $sim_seeds never take: $untried (choose seeds that do)"
        return 1
    fi
}
if wanted sim; then
    add_job sim:seeds_take_every_kind 1 one sim_take_every_kind
    for seed in $sim_seeds; do
        add_job "sim:seed $seed" 8 one build/tests/sim --seed "$seed"
    done
fi

# ---- the conformance suite (tests/conformance, docs/PROTOCOL.md) against the reference replica --
conformance_js() {
    build/tests/conformance --replica clients/js/bin/conformance-replica
    local status=$? i
    # Its ops server ends within 50 ms of the suite's directory going: waited for, so that its
    # CPU is the job's and nothing of the job outlives it.
    for i in $(seq 100); do
        pgrep -f "ops-server.js --port-file $TMPDIR/" >/dev/null || break
        sleep 0.05
    done
    return $status
}
if wanted conformance; then
    add_job conformance:reference 6 one build/tests/conformance --replica build/bin/magic-sync-replica
    # The TypeScript replica (clients/js) under Node. Its command line as a process per operation
    # (node --liftoff-only clients/js/dist/cli.js) passes the same, at ~0.25 s of CPU each for
    # Node and sql.js to start (38 s under the whole suite); bin/conformance-replica runs each in
    # one Node process of its own instead, as dist/cli.js does (the file read, the operation, the
    # file written).
    add_job conformance:js 10 one conformance_js
fi

# ---- the TypeScript replica (clients/js): its unit tests under Node, and its page in chromium ----
# (tests/server/browser_test.cpp: a real gateway with --cors-origin; one chromium launch).
if wanted browser; then
    add_job browser:unit 1 one node --test clients/js/test/unit.test.js clients/js/test/replica.test.js
    add_job browser:page 16 gtest build/tests/server_tests --gtest_brief=1 --gtest_filter='Browser.*'
fi

# ---- the scheduler ---------------------------------------------------------------------------
max_jobs=${MAGIC_SYNC_TEST_JOBS:-$(($(nproc) * 2))}
mapfile -t order < <(for name in "${job_names[@]}"; do echo "${job_weight[$name]} $name"; done |
                     sort -s -k1,1nr | cut -d' ' -f2-)
echo "running ${#order[@]} test jobs, $max_jobs at a time"

# Each job's CPU, its servers' included (they leave its process tree, not its cgroup), where
# this shell may make cgroups (cgroup v1's cpuacct, as root): what to cut first to make the run
# shorter on a machine that is busy with all of them.
cpu_root=/sys/fs/cgroup/cpuacct/magic_sync_test.$$
mkdir "$cpu_root" 2>/dev/null || cpu_root=
declare -A cpu_ms=()
job_cpu() { # name index: its CPU in ms, and its cgroup removed
    local usage=0
    [ -n "$cpu_root" ] || return 0
    read -r usage <"$cpu_root/$2/cpuacct.usage" 2>/dev/null
    cpu_ms[$1]=$((usage / 1000000))
    rmdir "$cpu_root/$2" 2>/dev/null
}

passed=0
failed=0
failures=()
skipped=()
declare -A started_at=() pid_job=() took=() job_index=()
run_started=$SECONDS
now_ms() { date +%s%3N; }

finish() { # name status
    local name=$1 status=$2 counts seconds
    seconds=$(printf '%d.%d' $((took[$name] / 1000)) $((took[$name] % 1000 / 100)))
    read -r counts <"$work/$name.counts" 2>/dev/null || counts="0 1"
    if [ "$counts" = skip ]; then
        echo "$name ... SKIPPED: $(tail -n 1 "$work/$name.log")"
        skipped+=("$name")
        return
    fi
    local ok=${counts% *} bad=${counts#* }
    passed=$((passed + ok))
    failed=$((failed + bad))
    local cpu=
    [ -n "${cpu_ms[$name]:-}" ] && cpu=$(printf ', %d.%d s CPU' $((cpu_ms[$name] / 1000)) $((cpu_ms[$name] % 1000 / 100)))
    if [ "$status" -eq 0 ] && [ "$bad" -eq 0 ]; then
        echo "$name ... ok (${seconds} s$cpu$( [ "${job_kind[$name]}" = one ] || echo ", $ok passed"))"
    else
        echo "$name ... FAILED (${seconds} s)"
        failures+=("$name")
        # What failed (GoogleTest's failures with what follows them), then how the log ends.
        grep -E -A 10 ': Failure$|^\[  FAILED  \]|ERROR|error:' "$work/$name.log" | head -n 60
        echo "... the end of its log:"
        tail -n 30 "$work/$name.log"
    fi
}

next=0
running=0
while [ $next -lt ${#order[@]} ] || [ $running -gt 0 ]; do
    while [ $running -lt "$max_jobs" ] && [ $next -lt ${#order[@]} ]; do
        name=${order[$next]}
        next=$((next + 1))
        started_at[$name]=$(now_ms)
        job_index[$name]=$next
        if [ -n "$cpu_root" ] && mkdir "$cpu_root/$next"; then
            (echo "$BASHPID" >"$cpu_root/$next/cgroup.procs"
             eval "run_kind ${job_kind[$name]} $(printf '%q' "$name") ${job_command[$name]}") &
        else
            eval "run_kind ${job_kind[$name]} $(printf '%q' "$name") ${job_command[$name]}" &
        fi
        pid_job[$!]=$name
        running=$((running + 1))
    done
    wait -n -p done_pid
    status=$?
    name=${pid_job[$done_pid]}
    unset "pid_job[$done_pid]"
    running=$((running - 1))
    took[$name]=$(($(now_ms) - started_at[$name]))
    job_cpu "$name" "${job_index[$name]}"
    finish "$name" "$status"
done
[ -n "$cpu_root" ] && rmdir "$cpu_root" 2>/dev/null

echo
echo "the slowest jobs: $(for name in "${!took[@]}"; do echo "${took[$name]} $name"; done |
                        sort -rn | head -5 | awk '{t = $1; $1 = ""; printf "%s%s (%.0f s)", sep, substr($0, 2), t / 1000; sep = ", "}')"
if [ ${#cpu_ms[@]} -gt 0 ]; then
    echo "the most CPU: $(for name in "${!cpu_ms[@]}"; do echo "${cpu_ms[$name]} $name"; done |
                          sort -rn | head -5 | awk '{t = $1; $1 = ""; printf "%s%s (%.0f s)", sep, substr($0, 2), t / 1000; sep = ", "}')"
    echo "the tests used $(for name in "${!cpu_ms[@]}"; do echo "${cpu_ms[$name]}"; done |
                           awk '{s += $1} END {printf "%.0f", s / 1000}') s of CPU"
fi
echo "the tests ran in $((SECONDS - run_started)) s"
if [ ${#failures[@]} -gt 0 ]; then echo "failed: ${failures[*]}"; fi
if [ ${#skipped[@]} -gt 0 ]; then
    echo "skipped (could not run here; see above): ${skipped[*]}"
    echo "$passed passed, $failed failed, ${#skipped[@]} skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
exit
}
