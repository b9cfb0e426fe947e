#!/usr/bin/env bash
# Installs, builds, starts fusebox-server on a free port, makes demo calls with
# the Python client and the `fusebox` CLI, then stops the server (SIGTERM).
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
grep -m 1 listening "$log"
addr=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$log" | head -n 1)
echo "== Python client (client/python/example.py)"
PYTHONPATH="$build/python" /usr/bin/python3 client/python/example.py "$addr"
echo "== command line: fusebox softmax on a .npy file"
dir=$(mktemp -d)
/usr/bin/python3 -c "import numpy as np; np.save('$dir/x.npy', np.random.default_rng(0).standard_normal((4, 8), dtype=np.float32))"
"$build/client/fusebox" --server "$addr" softmax "$dir/x.npy" -o "$dir/y.npy"
/usr/bin/python3 -c "import numpy as np; print('row sums of the softmax:', np.load('$dir/y.npy').sum(-1))"
rm -rf "$dir"
