#!/usr/bin/env bash
# Builds a released version's extension from the repository's history into build/release/VERSION/
# and prints that directory; a tree built before is kept (the update test runs it again as is).
# Exits 77, saying why on stderr, when the clone lacks the release's commit (shallow, or an export).
#
#   scripts/build-release.sh VERSION
set -euo pipefail
cd "$(dirname "$0")/.."

# Each release and the commit it was made from.
declare -A commits=([0.1.0]=56f535c)

case "${1:-}" in
    -h | --help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
version=${1:?usage: scripts/build-release.sh VERSION}
commit=${commits[$version]:-}
[ -n "$commit" ] || { echo "build-release: no release $version (known: ${!commits[*]})" >&2; exit 2; }
tree=build/release/$version
if [ -f "$tree/.built" ]; then
    echo "$PWD/$tree"
    exit 0
fi
git cat-file -e "$commit^{commit}" 2>/dev/null ||
    { echo "commit $commit (release $version) is not in this clone: clone with its history to build it" >&2
      exit 77; }
rm -rf "$tree"
mkdir -p "$tree"
git archive "$commit" | tar -x -C "$tree"
# Its extension only (PGXS's `all`), at -O0: the update test runs it, nothing measures it. Under
# `make -j` the jobs are shared with the make that called us.
jobs=-j$(nproc)
[[ "${MAKEFLAGS:-}" == *jobserver* ]] && jobs=
make -C "$tree" -s $jobs all CXXFLAGS='-O0 -g0' HOST_CXXFLAGS='-O0 -g0' >"$tree/build.log" 2>&1 ||
    { tail -n 30 "$tree/build.log" >&2; exit 1; }
touch "$tree/.built"
echo "$PWD/$tree"
