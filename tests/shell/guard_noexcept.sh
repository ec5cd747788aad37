#!/usr/bin/env bash
# pg::guard() takes only a noexcept call: a C++ exception leaving PG_TRY would skip PG_END_TRY and
# leave PG_exception_stack pointing at a dead frame. A lambda that may throw does not compile, and
# the error says why; a noexcept one does.
set -uo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags="-std=c++17 -fsyntax-only -Wall -Wextra -Werror -Isrc -isystem $(pg_config --includedir-server)"
expected="a guarded call is noexcept"
status=0

for returns in void int; do
    if [ $returns = void ]; then body='{ elog(ERROR, "no"); }'; else body='{ return 1; }'; fi
    printf '#include "pg/bridge.hpp"\nvoid f() { magic_sync::pg::guard([] %s); }\n' "$body" \
        >"$work/throwing.cpp"
    printf '#include "pg/bridge.hpp"\nvoid f() { magic_sync::pg::guard([]() noexcept %s); }\n' \
        "$body" >"$work/noexcept.cpp"
    if g++ $flags "$work/throwing.cpp" >"$work/out" 2>&1; then
        echo "guard() took a lambda returning $returns that is not noexcept"
        status=1
    elif ! grep -q "$expected" "$work/out"; then
        echo "a lambda returning $returns that is not noexcept failed without guard()'s message:"
        cat "$work/out"
        status=1
    fi
    g++ $flags "$work/noexcept.cpp" ||
        { echo "guard() refused a noexcept lambda returning $returns"; status=1; }
done
[ $status -eq 0 ] && echo "guard() takes only noexcept calls"
exit $status
