#!/usr/bin/env bash
# On the device (H200), from the e2e bundle (tools/gpu/device_all.sh e2e; carry .bundle-e2e):
# the shared-memory GPU test (system memory pinned with cudaHostRegister, CUDA IPC from a second
# process), then fusebox-perf against fusebox-server --backend=cuda --allow_shared_memory:
# GeLU float32 of 1 GiB shared memory -> shared memory (issue 33's target: >= 20 GB/s
# shm -> shm), and 4 KiB GeLU unary against the Execute stream on 1 and 8 connections (issue
# 32's streaming targets). Writes shm_gpu_test.log and perf_*.json under $OUT; prints a table.
set -u -o pipefail
B=${BUNDLE:-.bundle-e2e}
OUT=${OUT:-/tmp/fusebox-out}
mkdir -p "$OUT"
[[ -f $B/lib.tgz && ! -d $B/lib ]] && tar -C "$B" -xzf "$B/lib.tgz"
export LD_LIBRARY_PATH=$PWD/$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
status=0
echo "== shared-memory GPU test"
FUSEBOX_CUDA_MODULE=$PWD/$B/bin/libfusebox_cuda_backend.so FUSEBOX_IPC_EXPORTER=$PWD/$B/bin/fusebox_gpu_ipc_exporter \
  timeout 120 "$B/bin/fusebox_gpu_shared_memory_test" --gtest_brief=1 2>&1 | tee "$OUT/shm_gpu_test.log" | tail -n 6 ||
  status=1
"$B/bin/fusebox-server" --backend=cuda --allow_shared_memory --address=127.0.0.1:0 --metrics_address= \
  >"$OUT/server.log" 2>&1 &
srv=$!
for _ in $(seq 100); do grep -q "listening on" "$OUT/server.log" && break; sleep 0.1; done
addr=$(grep -o "listening on [^ ]*" "$OUT/server.log" | head -n 1 | cut -d' ' -f3)
echo "server at $addr"
perf() {  # name, then fusebox-perf flags
  local name=$1; shift
  timeout 120 "$B/bin/fusebox-perf" --server "$addr" --op gelu --warmup_s 1 --timeout_ms 60000 \
    --json "$OUT/perf_$name.json" "$@" >"$OUT/perf_$name.txt" 2>&1 || status=1
  python3 - "$OUT/perf_$name.json" "$name" <<'PY'
import json, math, sys
d = json.load(open(sys.argv[1]))
nbytes = 4 * math.prod(d["shape"])
for r in d["runs"]:
    p50 = r["latency_us"]["p50"]
    print(f"{sys.argv[2]:>16} callers={r['callers']:<3} calls/s={r['calls_per_s']:>9.1f} p50={p50:>10.1f} us "
          f"p99={r['latency_us']['p99']:>10.1f} us  in+out {2 * nbytes / max(p50, 1e-9) / 1e3:8.2f} GB/s at p50  "
          f"server total p50 {r['server_us']['total_us']:.1f} us  errors {r['errors']}")
PY
}
perf shm_1GiB --shape 268435456 --shm --duration_s 4
perf unary_4KiB_1 --shape 1024 --callers 1 --duration_s 3
perf stream_4KiB_1 --shape 1024 --callers 1 --mode stream --window 16 --duration_s 3
perf unary_4KiB_8 --shape 1024 --callers 8 --duration_s 3
perf stream_4KiB_8 --shape 1024 --callers 8 --mode stream --window 16 --duration_s 3
kill "$srv"; wait "$srv" 2>/dev/null
exit $status
