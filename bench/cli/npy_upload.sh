#!/usr/bin/env bash
# The CLI's .npy path against NumPy: `fusebox upload X.npy` (mmap, streamed to a CPU server on
# loopback) beside `np.load(X.npy)` alone, alternated ROUNDS times, wall time and peak RSS of
# each (GNU time); the server keeps every upload until the script ends. The file (float32, MIB MiB) is made once, so both read it from the page cache.
# usage: bench/cli/npy_upload.sh [BUILD_DIR] [MIB] [ROUNDS]     (default: build 2048 3)
set -euo pipefail
build=${1:-build}; mib=${2:-2048}; rounds=${3:-3}
f=$(mktemp --suffix=.npy)
trap 'rm -f "$f"; kill "$srv" 2>/dev/null || true' EXIT
/usr/bin/python3 -c "
import numpy as np, sys
n = $mib * (1 << 18)
np.save(sys.argv[1], np.random.default_rng(1).standard_normal(n, dtype=np.float32).reshape(-1, 1024))" "$f"
port=$((40000 + RANDOM % 20000))
"$build/server/fusebox-server" --backend=cpu --address=127.0.0.1:$port --metrics_address= >/dev/null 2>&1 &
srv=$!
sleep 1.5
echo "# $(date -u '+%F %H:%M UTC'), commit $(git rev-parse --short HEAD), $(nproc) cores, ${mib} MiB float32 .npy"
for r in $(seq "$rounds"); do
  /usr/bin/time -f "numpy np.load round $r: %e s, peak RSS %M KB" /usr/bin/python3 -c \
    "import numpy as np, sys; np.load(sys.argv[1])" "$f" 2>&1 | tail -n 1
  /usr/bin/time -f "cli fusebox upload round $r: %e s, peak RSS %M KB" "$build/client/fusebox" \
    --server 127.0.0.1:$port upload "$f" 2>&1 >/dev/null | tail -n 1
done
