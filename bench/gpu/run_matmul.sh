#!/usr/bin/env bash
# One device-machine call for the matmul work: GPU tests (matmul + CUDA backend module), then
# the C++ benchmark (ours alone), then the Python harness (ours via ctypes beside the torch peers,
# one process), then the tables last. Builds nothing: bundle first (see NOTES-matmul.md).
# Writes to $OUT: the two test logs, matmul_ours.json, matmul_torch.json, bench.err and
# matmul_table.md (6 files). Cost: ~1.5 min of device time.
#
# usage (on the device): bench/gpu/run_matmul.sh BUNDLE_DIR [--quick] [--no-tests] [--no-bench]
#   [--no-cpp] (skip the C++ cross-check) [--no-backend-test]
set -uo pipefail
B=${1:?bundle dir}; shift
quick=""; tests=1; bench=1; cpp=1; suites="fusebox_gpu_matmul_test fusebox_gpu_cuda_backend_test"
for a in "$@"; do
  case "$a" in --quick) quick=--quick ;; --no-tests) tests=0 ;; --no-bench) bench=0 ;;
    --no-cpp) cpp=0 ;; --no-backend-test) suites=fusebox_gpu_matmul_test ;; esac
done
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FUSEBOX_CUDA_MODULE=$B/bin/libfusebox_cuda_backend.so
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv,noheader)
echo "$gpu"
rc=0
if [ $tests = 1 ]; then
  for t in $suites; do
    timeout 120 "$B/bin/$t" --gtest_brief=1 >"$OUT/$t.log" 2>&1; r=$?
    [ $r = 0 ] || rc=1
    [ $r = 124 ] && { echo "$t timed out (a kernel hang?): stopping"; tail -5 "$OUT/$t.log"; exit 1; }
    grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|rel_error|Expected|Which is|error|us,|ms," "$OUT/$t.log" | head -40
    echo "$t: exit $r"
  done
fi
if [ $bench = 1 ]; then
  : >"$OUT/bench.err"
  if [ $cpp = 1 ]; then
    timeout 180 "$B/bin/matmul_bench" --json "$OUT/matmul_ours.json" $quick >/dev/null 2>"$OUT/bench.err" || rc=1
  fi
  PYTHONUNBUFFERED=1 timeout 240 python3 "$B/bin/matmul_torch.py" --capi "$B/bin/libfusebox_matmul_capi.so" \
    --json "$OUT/matmul_torch.json" $quick >/dev/null 2>>"$OUT/bench.err" || rc=1
  tail -4 "$OUT/bench.err"
  { echo "GPU: $gpu"; echo
    python3 "$B/bin/matmul_report.py" "$OUT/matmul_torch.json" "$OUT/matmul_ours.json"
  } > "$OUT/matmul_table.md"
  cat "$OUT/matmul_table.md"
fi
exit $rc
