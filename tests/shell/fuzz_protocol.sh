#!/usr/bin/env bash
# The bounded fuzz run of `make test`: each libFuzzer target of tests/fuzz/ (the protocol decoder,
# canonical JSON, the upload path) runs FUZZ_SECONDS (30) from the seed corpus, two at a time on
# two cores; the run fails on a crash, hang, leak or broken property (scripts/fuzz.sh). The longer
# run is `make fuzz`.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec scripts/fuzz.sh --seconds "${FUZZ_SECONDS:-30}"
