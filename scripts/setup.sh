#!/usr/bin/env bash
# Installs the Debian packages magic_sync builds and tests with, when any is missing.
set -euo pipefail

packages=(
    build-essential clang-format
    postgresql-15 postgresql-server-dev-15 libpq-dev
    nlohmann-json3-dev libssl-dev libcurl4-openssl-dev libsqlite3-dev sqlite3 zlib1g-dev
    libgtest-dev libnats-dev nats-server pgbouncer libcpp-httplib-dev
    clang clang-14 libclang-rt-14-dev valgrind systemd curl jq git
    chromium
)

missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
        missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing packages: ${missing[*]}" >&2
    echo "setup: run 'sudo make setup' (or install them with apt-get) and try again" >&2
    exit 1
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
