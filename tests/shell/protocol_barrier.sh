#!/usr/bin/env bash
# src/protocol/ is pure C++: a protocol source that includes postgres.h does not compile, even
# with PostgreSQL's headers on the include path, and the error says why.
set -uo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags="-std=c++17 -fsyntax-only -DMAGIC_SYNC_PROTOCOL_BUILD -Isrc/protocol/barrier -Isrc -I$(pg_config --includedir-server)"
expected="src/protocol/ is pure C++ shared with sender/ and replica/"
status=0

# Including postgres.h (or fmgr.h) in a protocol source, before or after a protocol header.
for header in postgres.h postgres_fe.h fmgr.h; do
    printf '#include "%s"\n#include "protocol/messages.hpp"\n' "$header" >"$work/before.cpp"
    printf '#include "protocol/messages.hpp"\n#include "%s"\n' "$header" >"$work/after.cpp"
    for source in before after; do
        if g++ $flags "$work/$source.cpp" >"$work/out" 2>&1; then
            echo "a protocol source including $header ($source) compiled"
            status=1
        elif ! grep -q "$expected" "$work/out"; then
            echo "including $header ($source) failed without the barrier's message:"
            cat "$work/out"
            status=1
        fi
    done
done

# That the protocol's own sources compile behind the barrier is the build's to prove: make
# compiles every one of them with the barrier first on the include path (build/protocol/%.o).
[ $status -eq 0 ] && echo "the barrier holds: postgres.h cannot be included in src/protocol/"
exit $status
