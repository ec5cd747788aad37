#!/usr/bin/env bash
# `make test-asan` inside `make test`: the unit, replica and sender GoogleTest binaries (and the
# programs they start) built with AddressSanitizer and UndefinedBehaviorSanitizer into build/asan/
# and run, and the replica library tests under valgrind (scripts/sanitize.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec scripts/sanitize.sh
