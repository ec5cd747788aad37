#!/usr/bin/env bash
# `make test-asan`: builds the GoogleTest binaries (units, and the sender's and the replica's when
# they build) and the programs they start with AddressSanitizer and UndefinedBehaviorSanitizer in
# build/asan/, runs them, then runs the replica library tests (the normal build) under valgrind.
# Ends with "sanitizers: N passed, N failed" and fails when any run failed.
#
#   scripts/sanitize.sh [--skip SUITE]... [--filter SUITE=GTEST_FILTER]...
#     SUITE: unit, replica, sender, valgrind
#     e.g. --skip sender --filter replica=ReplicaTest.*:UpRouteTest.*
set -uo pipefail
cd "$(dirname "$0")/.."

declare -A skip=() filter=()
while [ $# -gt 0 ]; do
    case "$1" in
        --skip) skip[$2]=1; shift 2 ;;
        --filter) filter[${2%%=*}]=${2#*=}; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "sanitize: unknown argument $1" >&2; exit 2 ;;
    esac
done

if ! command -v valgrind >/dev/null && [ -z "${skip[valgrind]:-}" ]; then
    if [ "$(id -u)" -eq 0 ]; then
        echo "sanitize: installing valgrind"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends valgrind >/dev/null
    else
        echo "sanitize: valgrind is missing: apt-get install valgrind" >&2
        exit 1
    fi
fi

# Leaks are errors; so is any undefined behaviour (the build also has -fno-sanitize-recover=all).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

jobs=$(nproc)
work=$(mktemp -d /tmp/magic_sync_asan.XXXXXX)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
failures=()
record() { # name status
    if [ "$2" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); failures+=("$1"); fi
}

build() { # what to make...
    make -s -j"$jobs" "$@" >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log"; return 1; }
}

run_gtest() { # name binary [env...]
    local name=$1 binary=$2 log=$work/$1.log start=$SECONDS status
    shift 2
    local args=(--gtest_brief=1)
    [ -n "${filter[$name]:-}" ] && args+=("--gtest_filter=${filter[$name]}")
    env "$@" "$binary" "${args[@]}" >"$log" 2>&1
    status=$?
    grep -qE '^(==[0-9]+==ERROR|.*runtime error:|SUMMARY: (Address|Leak|UndefinedBehavior)Sanitizer)' \
        "$log" && status=1
    local summary
    summary=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]' "$log" | tr '\n' ' ')
    if [ $status -eq 0 ]; then
        echo "sanitize: $name ok ($((SECONDS - start)) s): $summary"
    else
        echo "sanitize: $name FAILED ($((SECONDS - start)) s): $summary"
        grep -E -B2 -A30 '^(==[0-9]+==ERROR|.*runtime error:)' "$log" | head -80
        grep -E '^\[  FAILED' "$log" | head -20
        tail -n 15 "$log"
    fi
    record "$name" $status
}

echo "sanitize: building into build/asan/ (AddressSanitizer, UndefinedBehaviorSanitizer)"
start=$SECONDS
# Everything at once first, so that all cores compile; each suite's build below then only says
# whether its part built.
all=(build/asan/tests/unit_tests)
compgen -G "tests/replica/*_test.cpp" >/dev/null &&
    all+=(build/asan/tests/replica_tests build/asan/bin/magic-sync-replica build/tests/replica_tests)
[ -f sender/main.cpp ] && compgen -G "tests/sender/*_test.cpp" >/dev/null &&
    all+=(build/asan/tests/sender_tests build/asan/bin/magic-sync-sender)
make -s -k -j"$jobs" "${all[@]}" >/dev/null 2>&1
echo "sanitize: built in $((SECONDS - start)) s"
if [ -z "${skip[unit]:-}" ]; then
    if build build/asan/tests/unit_tests; then
        run_gtest unit build/asan/tests/unit_tests
    else
        echo "sanitize: the unit tests do not build under the sanitizers"
        record unit-build 1
    fi
fi
if [ -z "${skip[replica]:-}" ] && compgen -G "tests/replica/*_test.cpp" >/dev/null; then
    if build build/asan/tests/replica_tests build/asan/bin/magic-sync-replica; then
        # The CLI tests start build/asan/bin/magic-sync-replica, beside the test binary.
        run_gtest replica build/asan/tests/replica_tests
    else
        echo "sanitize: replica tests SKIPPED: they do not build (see above)"
    fi
fi
if [ -z "${skip[sender]:-}" ] && [ -f sender/main.cpp ] &&
    compgen -G "tests/sender/*_test.cpp" >/dev/null; then
    if build build/asan/tests/sender_tests build/asan/bin/magic-sync-sender; then
        run_gtest sender build/asan/tests/sender_tests \
            MAGIC_SYNC_SENDER=build/asan/bin/magic-sync-sender
    else
        echo "sanitize: sender tests SKIPPED: they do not build (see above)"
    fi
fi

# valgrind: the replica library tests (SQLite only, no processes) of the normal build.
if [ -z "${skip[valgrind]:-}" ] && compgen -G "tests/replica/*_test.cpp" >/dev/null; then
    if build build/tests/replica_tests; then
        vstart=$SECONDS
        vfilter=${filter[valgrind]:-ReplicaTest.*}
        valgrind --error-exitcode=1 --leak-check=full \
            --quiet build/tests/replica_tests --gtest_brief=1 --gtest_filter="$vfilter" \
            >"$work/valgrind.log" 2>&1
        status=$?
        summary=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]' "$work/valgrind.log" | tr '\n' ' ')
        if [ $status -eq 0 ]; then
            echo "sanitize: valgrind replica ($vfilter) ok ($((SECONDS - vstart)) s): $summary"
        else
            echo "sanitize: valgrind replica ($vfilter) FAILED ($((SECONDS - vstart)) s): $summary"
            grep -E '^==[0-9]+==' "$work/valgrind.log" | head -80
            tail -n 15 "$work/valgrind.log"
        fi
        record valgrind-replica $status
    else
        echo "sanitize: the replica tests do not build; valgrind run SKIPPED"
    fi
fi

echo "sanitize: done in $((SECONDS - start)) s"
[ ${#failures[@]} -gt 0 ] && echo "sanitize: failed: ${failures[*]}"
echo "sanitizers: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
