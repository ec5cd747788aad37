#!/usr/bin/env bash
# `make demo` works: the shop converges, through a cut line, with every real part.
set -euo pipefail
cd "$(dirname "$0")/../.."
output=$(scripts/demo.sh 2>&1) || { echo "$output" | tail -60; exit 1; }
echo "$output" | grep -q "^all three registers converged$" || { echo "$output" | tail -60; exit 1; }
echo "the demo converged"
