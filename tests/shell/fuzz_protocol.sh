#!/usr/bin/env bash
# The bounded fuzz run of `make test`: the three libFuzzer targets of tests/fuzz/ (the protocol
# decoder, canonical JSON, the upload path) run at once for FUZZ_SECONDS (30) each from the seed
# corpus; the run fails on a crash, hang, leak or broken property (scripts/fuzz.sh). The longer
# run is `make fuzz`.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec scripts/fuzz.sh --seconds "${FUZZ_SECONDS:-30}" --jobs 3
