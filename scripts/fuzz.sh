#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ and runs each for a bounded time, as many at once as
# there are cores. A target that crashes, hangs, leaks or breaks a property fails the run; its input
# is copied to tests/fuzz/crashes/ for the report.
#
#   scripts/fuzz.sh [--seconds N] [--jobs N] [--seeds] [--replay] [TARGET...]
#     --seconds N  how long each target runs (default 60)
#     --jobs N     targets run at once (default: the number of cores)
#     --seeds      regenerate tests/fuzz/corpus/ with build/fuzz/make_seeds first
#     --replay     run every input of tests/fuzz/crashes/ through its target once, no fuzzing
#     TARGET       decode, canonical, upload (default: all)
# Environment: FUZZ_ARGS, more libFuzzer options for every run (e.g. "-max_len=65536").
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
jobs=$(nproc)
seeds=0
replay=0
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) seconds=$2; shift 2 ;;
        --jobs) jobs=$2; shift 2 ;;
        --seeds) seeds=1; shift ;;
        --replay) replay=1; shift ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        -*) echo "fuzz: unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
[ ${#targets[@]} -eq 0 ] && targets=(decode canonical upload)

# libFuzzer ships with clang in libclang-rt-14-dev; install it when we can.
fuzzer_runtime_present() {
    local dir
    dir=$(clang++ -print-resource-dir 2>/dev/null) || return 1
    compgen -G "$dir/lib/linux/libclang_rt.fuzzer-*.a" >/dev/null ||
        compgen -G "$dir/lib/*/libclang_rt.fuzzer.a" >/dev/null
}
if ! command -v clang++ >/dev/null || ! fuzzer_runtime_present; then
    if [ "$(id -u)" -eq 0 ]; then
        echo "fuzz: installing clang-14 and libclang-rt-14-dev"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends clang-14 libclang-rt-14-dev >/dev/null
        command -v clang++ >/dev/null || ln -sf "$(command -v clang++-14)" /usr/local/bin/clang++
    else
        echo "fuzz: clang++ with libFuzzer is missing: apt-get install clang-14 libclang-rt-14-dev" >&2
        exit 1
    fi
fi

make -s -j"$jobs" $(printf 'build/fuzz/%s ' "${targets[@]}")
if [ $seeds -eq 1 ]; then
    make -s build/fuzz/make_seeds
    build/fuzz/make_seeds tests/fuzz/corpus
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if [ $replay -eq 1 ]; then
    status=0
    for target in "${targets[@]}"; do
        inputs=(tests/fuzz/crashes/"$target"-*)
        [ -e "${inputs[0]}" ] || continue
        for input in "${inputs[@]}"; do
            if build/fuzz/"$target" "$input" >/dev/null 2>&1; then
                echo "fuzz: $input no longer fails"
            else
                echo "fuzz: $input still fails"
                status=1
            fi
        done
    done
    exit $status
fi

log_dir=build/fuzz/logs
mkdir -p "$log_dir" build/fuzz/artifacts
run_target() { # target → exit status of libFuzzer
    local target=$1 work=build/fuzz/corpus/$1
    mkdir -p "$work"
    # New inputs go to the first directory (build/), the committed seeds are only read.
    # -timeout: one input taking longer is a hang; -rss_limit_mb: a blow-up is a failure too.
    local status=0
    build/fuzz/"$target" "$work" tests/fuzz/corpus/"$target" \
        -dict=tests/fuzz/protocol.dict -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
        -artifact_prefix=build/fuzz/artifacts/"$target"- ${FUZZ_ARGS:-} \
        >"$log_dir/$target.log" 2>&1 || status=$?
    echo $status >"$log_dir/$target.status"
    return $status
}

echo "fuzz: ${targets[*]}, ${seconds} s each, $jobs at a time"
pids=()
names=()
failed=()
start=$SECONDS
for target in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    rm -f "$log_dir/$target.status"
    run_target "$target" &
    pids+=($!)
    names+=("$target")
done
for i in "${!pids[@]}"; do
    target=${names[$i]}
    wait "${pids[$i]}" 2>/dev/null || true
    status=$(cat "$log_dir/$target.status" 2>/dev/null || echo 1)
    runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log_dir/$target.log" || true)
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$log_dir/$target.log" | tail -1 || true)
    if [ "$status" -eq 0 ]; then
        echo "fuzz: $target ok: ${runs:-?} inputs, $cov"
        continue
    fi
    failed+=("$target")
    echo "fuzz: $target FAILED (exit $status) after ${runs:-?} inputs; log $log_dir/$target.log"
    grep -E -A40 '^(==[0-9]+==ERROR|fuzz property broken|.*runtime error|==[0-9]+== ERROR: libFuzzer)' \
        "$log_dir/$target.log" | head -60 || tail -40 "$log_dir/$target.log"
    mkdir -p tests/fuzz/crashes
    for artifact in build/fuzz/artifacts/"$target"-*; do
        [ -e "$artifact" ] || continue
        kept=tests/fuzz/crashes/$(basename "$artifact")
        cp "$artifact" "$kept" && rm -f "$artifact"
        echo "fuzz: input kept as $kept ($(wc -c <"$kept") bytes; replay: build/fuzz/$target $kept)"
    done
done
echo "fuzz: done in $((SECONDS - start)) s"
[ ${#failed[@]} -eq 0 ] || { echo "fuzz: failed: ${failed[*]}"; exit 1; }
