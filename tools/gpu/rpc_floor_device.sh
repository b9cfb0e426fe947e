#!/usr/bin/env bash
# On the device (H200 host), from the e2e bundle (tools/gpu/device_all.sh e2e; carry .bundle-e2e):
# fusebox's RPC path against the plain gRPC echo built with it (fusebox-rpc-echo), in one run,
# with the CUDA backend. Three parts (bench/rpc/run_bench.sh, each its own Markdown under $OUT):
#   floor-4KiB.md      4 KiB GeLU, 1/8/16/64 callers, unary and Execute against the echo's unary,
#                      stream and raw-bytes calls (issue 32's latency and calls/s targets)
#   floor-64MiB.md     64 MiB GeLU inline against the raw-bytes echo of 64 MiB (issue 33: <= 1.2x)
#   transfer-4GiB.md   4 GiB Upload and Download on 1, 4 and 8 connections against the echo's Sink
#                      and Source on as many parallel 4 MiB streams (issue 33: >= 8 GB/s, >= 0.7x)
# usage (device): COMMIT=<c> bash .bundle-e2e/bin/rpc_floor_device.sh   [PARTS="floor4k bulk transfer"]
set -u -o pipefail
B=${BUNDLE:-.bundle-e2e}
OUT=${OUT:-/tmp/fusebox-out}
mkdir -p "$OUT"
[[ -f $B/lib.tgz && ! -d $B/lib ]] && tar -C "$B" -xzf "$B/lib.tgz"
export LD_LIBRARY_PATH=$PWD/$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SERVER_BIN=$B/bin/fusebox-server BENCH_BIN=$B/bin/fusebox-rpc-bench ECHO_BIN=$B/bin/fusebox-rpc-echo
export BACKEND=cuda COMMIT=${COMMIT:-unknown}
run=$B/bin/run_bench.sh
status=0
for part in ${PARTS:-floor4k bulk transfer}; do
  case $part in
    floor4k)
      MODE=floor OUT=$OUT/floor-4KiB.md \
        BENCH_ARGS="--floor_bytes 4KiB --floor_callers 1,8,16,64 --rounds 6 --round_seconds 0.5" \
        timeout 300 bash "$run" || status=1 ;;
    bulk)
      MODE=floor OUT=$OUT/floor-64MiB.md \
        BENCH_ARGS="--floor_bytes 64MiB --floor_callers 1 --rounds 8 --round_seconds 1.5 --warmup_seconds 0.3 --stream_window 0" \
        timeout 300 bash "$run" || status=1 ;;
    transfer)
      MODE=transfer OUT=$OUT/transfer-4GiB.md \
        BENCH_ARGS="--transfer_bytes 4GiB --connections 1,4,8 --rounds 2" \
        timeout 400 bash "$run" || status=1 ;;
  esac
  [[ -f $OUT/$part.md ]] || true
done
for f in "$OUT"/floor-4KiB.md "$OUT"/floor-64MiB.md "$OUT"/transfer-4GiB.md; do
  [[ -f $f ]] && { echo "== $(basename "$f")"; grep -E '^\||own Timing|total_us' "$f"; }
done
exit $status
