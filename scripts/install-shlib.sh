#!/usr/bin/env bash
# Installs a shared library the way the dynamic loader needs: into a new file beside the target,
# then renamed over it. `install` truncates the target in place, and a backend that has the old
# library mapped dies of SIGBUS when its pages vanish. Called by make as INSTALL_SHLIB with
# install's arguments: [-m mode] [-s] source target.
set -euo pipefail
mode=755
while [ $# -gt 2 ]; do
    case "$1" in
    -m) mode=$2; shift 2 ;;
    *) shift ;;
    esac
done
source=$1
target=$2
[ -d "$target" ] && target="${target%/}/$(basename "$source")"
temporary=$(mktemp "$(dirname "$target")/.$(basename "$target").XXXXXX")
install -m "$mode" "$source" "$temporary"
mv -f "$temporary" "$target"
