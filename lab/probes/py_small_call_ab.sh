#!/usr/bin/env bash
# A/B of the Python client's small-call cost: the package at REV (default HEAD~1) against the
# build's, alternated against one CPU-backend server, ROUNDS rounds (the order swapped every
# other round: the first process of a pair runs slower), CALLS 4 KiB GeLU calls each after 300
# of warm-up. Prints us per call for each and the new / old ratio per round, then the median.
# usage: lab/probes/py_small_call_ab.sh [BUILD_DIR]   env: REV, ROUNDS (10), CALLS (3000),
#        PYTHON (default /usr/bin/python3, which has grpcio and numpy from Debian)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
rev=${REV:-HEAD~1}
py=${PYTHON:-/usr/bin/python3}
old=$(mktemp -d)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$old"' EXIT
cp -r "$build/python/." "$old/"
for f in $(git ls-tree --name-only "$rev" client/python/fusebox_client/ | grep '\.py$'); do
  git show "$rev:$f" >"$old/fusebox_client/$(basename "$f")"
done
log="$old/server.log"
: >"$log"
"$build/server/fusebox-server" --address=127.0.0.1:0 --backend=cpu >>"$log" 2>/dev/null &
pid=$!
for _ in $(seq 100); do grep -q listening "$log" && break; sleep 0.1; done
addr=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$log" | head -1)
loop='
import sys, time, numpy as np
from fusebox_client import Client
x = np.random.rand(1024).astype(np.float32)
with Client(sys.argv[1]) as c:
    for _ in range(300): c.gelu(x)
    n = int(sys.argv[2]); t = time.perf_counter()
    for _ in range(n): c.gelu(x)
    print(f"{(time.perf_counter() - t) / n * 1e6:.1f}")'
run() { PYTHONPATH=$1 "$py" -c "$loop" "$addr" "${CALLS:-3000}"; }
ratios=()
for r in $(seq "${ROUNDS:-10}"); do
  if (( r % 2 )); then o=$(run "$old"); n=$(run "$build/python"); else n=$(run "$build/python"); o=$(run "$old"); fi
  ratio=$("$py" -c "print(f'{$n / $o:.3f}')")
  ratios+=("$ratio")
  echo "round $r: $rev $o us, build $n us, build / $rev $ratio"
done
"$py" -c "import statistics, sys; print(f'median build / {sys.argv[1]}: {statistics.median(map(float, sys.argv[2:])):.3f}')" "$rev" "${ratios[@]}"
