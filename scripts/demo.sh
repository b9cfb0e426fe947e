#!/usr/bin/env bash
# Installs, builds, starts fusebox-server on a free port, makes a demo call with
# the Python client and the `fusebox` CLI, then stops the server.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build=${BUILD_DIR:-build}
log=$(mktemp)
"$build/server/fusebox-server" --address=127.0.0.1:0 >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 100); do grep -q listening "$log" && break; sleep 0.1; done
head -n 1 "$log"
addr=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$log" | head -n 1)
PYTHONPATH="$build/python" /usr/bin/python3 client/python/example.py --server "$addr"
