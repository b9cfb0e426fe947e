#!/usr/bin/env bash
# One device-machine call for the matmul work: GPU tests (matmul + CUDA backend module), then
# the benchmark (ours in C++, the torch peers in Python, same run), then a short table last.
# Builds nothing: run scripts/device_bundle.sh on the build machine first (see NOTES-matmul.md).
# Full logs and JSON go to $OUT. Cost: ~2 min of device time.
#
# usage (on the device): bench/gpu/run_matmul.sh BUNDLE_DIR [--quick] [--no-tests] [--no-bench]
set -uo pipefail
B=${1:?bundle dir}; shift
quick=""; tests=1; bench=1
for a in "$@"; do
  case "$a" in --quick) quick=--quick ;; --no-tests) tests=0 ;; --no-bench) bench=0 ;; esac
done
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FUSEBOX_CUDA_MODULE=$B/bin/libfusebox_cuda_backend.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv,noheader | tee "$OUT/gpu.txt"
rc=0
if [ $tests = 1 ]; then
  for t in fusebox_gpu_matmul_test fusebox_gpu_cuda_backend_test; do
    timeout 120 "$B/bin/$t" --gtest_brief=1 >"$OUT/$t.log" 2>&1; r=$?
    [ $r = 0 ] || rc=1
    [ $r = 124 ] && { echo "$t timed out (a kernel hang?): stopping"; tail -5 "$OUT/$t.log"; exit 1; }
    grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|rel_error|Expected|Which is|error|us,|ms," "$OUT/$t.log" | head -40
    echo "$t: exit $r"
  done
fi
if [ $bench = 1 ]; then
  timeout 180 "$B/bin/matmul_bench" --json "$OUT/matmul_ours.json" $quick >/dev/null 2>"$OUT/matmul_bench.err" || rc=1
  tail -2 "$OUT/matmul_bench.err"
  PYTHONUNBUFFERED=1 timeout 240 python3 "$B/bin/matmul_torch.py" --capi "$B/bin/libfusebox_matmul_capi.so" \
    --json "$OUT/matmul_torch.json" $quick >/dev/null 2>"$OUT/matmul_torch.err" || rc=1
  tail -3 "$OUT/matmul_torch.err"
  python3 "$B/bin/matmul_report.py" "$OUT/matmul_torch.json" "$OUT/matmul_ours.json" | tee "$OUT/matmul_table.md"
fi
exit $rc
