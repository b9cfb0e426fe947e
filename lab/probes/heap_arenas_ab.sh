#!/bin/bash
# A/B of --malloc_arenas: servers with 2 arenas and with glibc's default (0) alternated three
# times; each takes 8 callers x 4 KiB GeLU for 4 s, then 4 callers x 16 MiB GeLU for 6 s, and
# its RSS is read after both. Prints fusebox-perf's CSV rows. Usage: heap_arenas_ab.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
for round in 1 2 3; do
  for a in 2 0; do
    port=$((46000 + a + round * 10))
    "$build/server/fusebox-server" --backend=cpu --address=127.0.0.1:$port --malloc_arenas=$a \
      --metrics_address= >/dev/null 2>&1 &
    pid=$!
    sleep 1.5
    small=$("$build/client/fusebox-perf" --server 127.0.0.1:$port --callers 8 --shape 1024 \
      --duration_s 4 --warmup_s 1 --csv - 2>/dev/null | tail -1)
    large=$("$build/client/fusebox-perf" --server 127.0.0.1:$port --callers 4 --shape 4194304 \
      --duration_s 6 --warmup_s 1 --csv - 2>/dev/null | tail -1)
    rss=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
    echo "arenas=$a round=$round small: $small"
    echo "arenas=$a round=$round large: $large rss_kib=$rss"
    kill $pid
    wait $pid 2>/dev/null || true
  done
done
