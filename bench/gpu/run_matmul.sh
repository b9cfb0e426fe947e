#!/usr/bin/env bash
# One device-machine call for the matmul work: GPU tests (matmul + CUDA backend module), then
# the C++ benchmark (ours alone), then the Python harness (ours via ctypes beside the torch peers,
# one process, with the A/B rounds: our default cuBLASLt runner -- two picks -- beside the 32 MiB
# and the 1 MiB first picks), then the tables, then compute-sanitizer: memcheck over both test
# binaries (everything, cuBLASLt included); racecheck over our tiled kernels only, no cuBLASLt
# call at all (racecheck cannot run cuBLASLt's kernels), as two runs with two logs -- the
# TMA/wgmma kernel, then the mma.sync and FFMA kernels -- so a sanitizer failure in one cannot
# hide the other (FUSEBOX_MATMUL_TEST_IMPLS selects them in the test binary).
# Builds nothing: bundle first (tools/gpu/device_all.sh).
# Writes to $OUT: the two test logs, matmul_ours.json, matmul_torch.json, bench.err,
# matmul_table.md, sanitize_*.log and sanitizer_summary.txt.
# Cost: ~0.5 min tests + C++ bench, ~1 min Python harness (A/B rounds only where the 32 MiB and
# 1 MiB picks differ or the bias target missed: --ab missed, the default), ~1-1.5 min sanitizers
# (each bounded by `timeout`): ~3 min of device time.
#
# usage (on the device): bench/gpu/run_matmul.sh BUNDLE_DIR [--quick] [--no-tests] [--no-bench]
#   [--no-cpp] (skip the C++ cross-check) [--no-backend-test] [--no-sanitize] [--sanitize-only]
#   [--ab all|missed|none] [--ab-rounds N] (A/B rounds, passed to matmul_torch.py; default missed)
# env: MATMUL_SANITIZE_LIMIT_S (default 120: memcheck of the matmul test and each racecheck run;
#   the backend test gets half), MATMUL_SYNCCHECK=1 adds synccheck over the tiled kernels,
#   COMMIT (printed in the table's header).
set -uo pipefail
B=${1:?bundle dir}; shift
quick=""; tests=1; bench=1; cpp=1; sanitize=1; ab=(); suites="fusebox_gpu_matmul_test fusebox_gpu_cuda_backend_test"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=--quick ;; --no-tests) tests=0 ;; --no-bench) bench=0 ;; --no-cpp) cpp=0 ;;
    --no-backend-test) suites=fusebox_gpu_matmul_test ;; --no-sanitize) sanitize=0 ;;
    --sanitize-only) tests=0; bench=0 ;;
    --ab|--ab-rounds) ab+=("$1" "${2:?$1 needs a value}"); shift ;;
    *) echo "run_matmul.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# tools/gpu/device_bundle.sh packs the libraries as lib.tgz past 48 MB.
[ -f "$B/lib.tgz" ] && [ ! -d "$B/lib" ] && tar -C "$B" -xzf "$B/lib.tgz"
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FUSEBOX_CUDA_MODULE=$B/bin/libfusebox_cuda_backend.so
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv,noheader)
echo "$gpu"
rc=0
t0=$SECONDS
if [ $tests = 1 ]; then
  for t in $suites; do
    timeout 120 "$B/bin/$t" --gtest_brief=1 >"$OUT/$t.log" 2>&1; r=$?
    [ $r = 0 ] || rc=1
    [ $r = 124 ] && { echo "$t timed out (a kernel hang?): stopping"; tail -5 "$OUT/$t.log"; exit 1; }
    grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|rel_error|Expected|Which is|error|us,|ms,|two picks|matmul runs:" "$OUT/$t.log" | head -40
    echo "$t: exit $r"
  done
  echo "tests: $((SECONDS - t0)) s"
fi
if [ $bench = 1 ]; then
  t1=$SECONDS
  : >"$OUT/bench.err"
  if [ $cpp = 1 ]; then
    timeout 180 "$B/bin/matmul_bench" --json "$OUT/matmul_ours.json" $quick >/dev/null 2>"$OUT/bench.err" || rc=1
  fi
  echo "C++ bench: $((SECONDS - t1)) s"
  t2=$SECONDS
  PYTHONUNBUFFERED=1 timeout 300 python3 "$B/bin/matmul_torch.py" --capi "$B/bin/libfusebox_matmul_capi.so" \
    --json "$OUT/matmul_torch.json" $quick "${ab[@]}" >/dev/null 2>>"$OUT/bench.err" || rc=1
  echo "Python harness: $((SECONDS - t2)) s"
  grep -v "^[0-9]*x[0-9]*x[0-9]* .* bias=.*: algo" "$OUT/bench.err" | tail -4
  { echo "GPU: $gpu${COMMIT:+; commit $COMMIT}"; echo
    python3 "$B/bin/matmul_report.py" "$OUT/matmul_torch.json" "$OUT/matmul_ours.json"
  } > "$OUT/matmul_table.md"
  cat "$OUT/matmul_table.md"
fi
if [ $sanitize = 1 ]; then
  CS=/usr/local/cuda/bin/compute-sanitizer
  [ -x "$CS" ] || CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  limit=${MATMUL_SANITIZE_LIMIT_S:-120}
  : >"$OUT/sanitizer_summary.txt"
  echo "== compute-sanitizer ($("$CS" --version 2>/dev/null | grep -i version | head -1)); small test shapes"
  # san NAME LIMIT_S IMPLS TOOL [sanitizer options] TEST [test args]: one bounded run with
  # FUSEBOX_MATMUL_TEST_IMPLS=IMPLS (the matmul test's kernel selection; the backend test ignores
  # it), its summary line, the test's run counts and the distinct error lines it reported; the
  # full log is $OUT/sanitize_NAME.log.
  san() {
    local name=$1 lim=$2 impls=$3 tool=$4; shift 4
    local log="$OUT/sanitize_$name.log" start=$SECONDS
    FUSEBOX_GPU_TEST_SMALL=1 FUSEBOX_MATMUL_TEST_IMPLS=$impls timeout -k 10 "$lim" \
      "$CS" --tool "$tool" --error-exitcode 3 "$@" >"$log" 2>&1
    local r=$?
    local summary tests_line runs note=""
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK SUMMARY" "$log" | tail -1 | sed 's/^=* *//')
    tests_line=$(grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$log" | tr -s ' ' | tr '\n' ' ')
    runs=$(grep -E "^matmul runs:" "$log" | tail -1)
    [ $r = 124 ] || [ $r = 137 ] && note=" TIMED OUT after ${lim} s (raise MATMUL_SANITIZE_LIMIT_S)"
    [ $r = 3 ] && note=" SANITIZER ERRORS"
    echo "$name ($tool, impls $impls): exit $r in $((SECONDS - start)) s$note; ${summary:-no summary}; ${tests_line:-no test summary}${runs:+; $runs}" |
      tee -a "$OUT/sanitizer_summary.txt"
    grep -E "Invalid __|Invalid (global|shared|local)|Race reported|Hazard|Program hit|Barrier error|Misaligned|Out-of-range|Sanitizer Error|hardware exception|\[  FAILED  \]" \
      "$log" | sed 's/^=* *//; s/ at 0x[0-9a-f]*//; s/0x[0-9a-f]\{6,\}/ADDR/g' | sort | uniq -c | sort -rn | head -8
    [ $r = 0 ] || rc=1
  }
  # memcheck: every matmul test, cuBLASLt included (the 1000^3 shape left out by
  # FUSEBOX_GPU_TEST_SMALL), and the backend module's tests except the ones that fault on purpose
  # (death test, out-of-memory and a full pool: API errors by design) or time themselves
  # (concurrency, timings, 96 MiB transfers).
  san memcheck_matmul "$limit" all memcheck "$B/bin/fusebox_gpu_matmul_test" --gtest_brief=1
  san memcheck_backend $((limit / 2)) all memcheck "$B/bin/fusebox_gpu_cuda_backend_test" \
    --gtest_brief=1 \
    "--gtest_filter=-CudaBackendBroken.*:CudaBackendPoolFull.*:*OutOfMemory*:*LargeTransfers*:*Concurrent*:*TimingsMatchTheWork*:CudaBackendRpcThreads.*"
  # racecheck: shared-memory hazards in our own kernels, and no cuBLASLt kernel launched at all
  # (racecheck fails on them, "failed to handle a hardware exception", and every later test fails
  # with it). Two runs, two logs: WgmmaMatmulRelu (TMA + wgmma; racecheck may not
  # model the async proxy), then MmaMatmulRelu (cp.async + mma.sync) and SimtMatmulRelu (FFMA).
  san racecheck_wgmma "$limit" wgmma racecheck --kernel-name kns=MatmulRelu \
    "$B/bin/fusebox_gpu_matmul_test" --gtest_brief=1 "--gtest_filter=Dtypes/MatmulTest.*"
  san racecheck_mma_ffma "$limit" mma,ffma racecheck --kernel-name kns=MatmulRelu \
    "$B/bin/fusebox_gpu_matmul_test" --gtest_brief=1 "--gtest_filter=Dtypes/MatmulTest.*"
  if [ "${MATMUL_SYNCCHECK:-0}" = 1 ]; then
    san synccheck_tiled "$limit" tiled synccheck --kernel-name kns=MatmulRelu \
      "$B/bin/fusebox_gpu_matmul_test" --gtest_brief=1 "--gtest_filter=Dtypes/MatmulTest.*"
  fi
fi
echo "run_matmul.sh: $((SECONDS - t0)) s, exit $rc"
exit $rc
