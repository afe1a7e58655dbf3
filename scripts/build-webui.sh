#!/usr/bin/env bash
# Rebuilds the chat page that `osprey serve` embeds (webui/prebuilt/index.html.gz) from
# webui/src with the packages pinned in webui/package-lock.json. Run it after changing
# webui/src and commit the result; the C++ build embeds the committed file and needs no node.
# The same sources, lockfile and node give the same bytes (no timestamps; gzip mtime 0).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../webui"
command -v npm >/dev/null 2>&1 || { echo "build-webui: npm is missing (apt-get install nodejs npm)" >&2; exit 1; }
if [ ! -d node_modules/esbuild ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
node build.mjs
