#!/usr/bin/env bash
# Runs on the device machine (H200) from the bundle that tools/gpu/device_all.sh e2e makes
# (.bundle-e2e); builds nothing. In one run:
#   1. pinned host->device bandwidth (torch), the ceiling for uploads;
#   2. the memory-bound kernel benchmark, ours only (bench medians to compare with);
#   3. fusebox-server --backend=cuda with /metrics on, and fusebox-e2e against it
#      (correctness of every RPC, kernel time vs the benchmark, 4 KiB latency,
#      64 MiB throughput, 4 GiB upload + chain);
#   4. a scrape of /metrics with the CUDA backend loaded, then SIGTERM: exit 0;
#   5. tests/metrics/gpu_metrics_check.py, when the bundle carries it.
# Writes server.log, e2e.log, e2e.json, ours.json, metrics.txt, metrics_check.log under $OUT and
# prints the summary table last.
set -u -o pipefail
B=${BUNDLE:-.bundle}
OUT=${OUT:-/tmp/fusebox-out}
mkdir -p "$OUT"
[[ -f $B/lib.tgz && ! -d $B/lib ]] && tar -C "$B" -xzf "$B/lib.tgz"
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv

h2d=$(python3 - <<'PY'
import torch
n = 1 << 30
src = torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(1)
dst = torch.empty(n, dtype=torch.uint8, device="cuda")
for _ in range(3): dst.copy_(src, non_blocking=True)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
t = []
for _ in range(10):
    s.record(); dst.copy_(src, non_blocking=True); e.record(); e.synchronize(); t.append(s.elapsed_time(e))
t.sort()
print(f"{n / (t[len(t)//2] * 1e-3) / 1e9:.1f}")
PY
)
echo "pinned H2D: ${h2d} GB/s"

if [[ -x $B/bin/fusebox_gpu_bench_memory_bound ]]; then
  "$B/bin/fusebox_gpu_bench_memory_bound" --json "$OUT/ours.json" --no-variants > "$OUT/bench.log" 2>&1 || status=1
  tail -n 3 "$OUT/bench.log"
fi

mport=9464
"$B/bin/fusebox-server" --address=127.0.0.1:0 --backend=cuda --metrics_address=127.0.0.1:$mport \
  --idle_expiry_s=0 >"$OUT/server.out" 2>"$OUT/server.log" &
pid=$!
for _ in $(seq 300); do grep -q listening "$OUT/server.out" && break; sleep 0.1; done
cat "$OUT/server.out" "$OUT/server.log"
port=$(sed -n 's/.*listening on [^:]*:\([0-9]*\).*/\1/p' "$OUT/server.out")
if [[ -z $port ]]; then echo "server did not start"; exit 1; fi

"$B/bin/fusebox-e2e" --server=127.0.0.1:$port --bench_json="$OUT/ours.json" --h2d_gbps="${h2d:-0}" \
  --json="$OUT/e2e.json" >"$OUT/e2e.log" 2>&1 || status=1

python3 - "$mport" "$OUT/metrics.txt" <<'PY' || status=1
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
open(sys.argv[2], "w").write(body)
fams = sorted({l.split()[2] for l in body.splitlines() if l.startswith("# TYPE fusebox_")})
calls = sum(float(l.split()[-1]) for l in body.splitlines() if l.startswith("fusebox_calls_total{"))
mem = [l for l in body.splitlines() if l.startswith("fusebox_device_memory") and not l.startswith("#")]
print(f"/metrics with the CUDA backend loaded: {len(fams)} fusebox_ families, {calls:.0f} calls counted")
print("\n".join(mem[:2]))
sys.exit(0 if fams and calls > 0 else 1)
PY

kill -TERM $pid
wait $pid
rc=$?
echo "server exit after SIGTERM: $rc"
[[ $rc -eq 0 ]] || status=1

# 5. tests/metrics/gpu_metrics_check.py when the bundle has it (tools/gpu/device_all.sh): /metrics
#    counts and sums against the responses, with the CUDA backend loaded.
if [[ -f $B/bin/gpu_metrics_check.py && -d $B/bin/python ]]; then
  python3 "$B/bin/gpu_metrics_check.py" "$B/bin/fusebox-server" "$B/bin/python" >"$OUT/metrics_check.log" 2>&1
  rc=$?
  echo "gpu_metrics_check.py: exit $rc ($(grep -c '^ok' "$OUT/metrics_check.log") checks ok)"
  [[ $rc -eq 0 ]] || { status=1; grep -v '^ok' "$OUT/metrics_check.log" | tail -n 5; }
fi
sed -n '/== summary/,$p' "$OUT/e2e.log"
exit $status
