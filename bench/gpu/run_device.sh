#!/usr/bin/env bash
# Runs on the device machine (H200), from the bundle made by tools/gpu/device_all.sh kernels; builds
# nothing. Steps, in order (default: test sanitize bench):
#   test      the GPU kernel tests (tests/gpu), all of them                      ~1 min
#   sanitize  compute-sanitizer memcheck over the tests (largest shapes and the >2^31-element
#             tests left out), racecheck and synccheck over the softmax / row-sum paths   ~2 min
#   bench     memory-bound benchmark (C++: ours + forced variants), then memory_bound_peers.py:
#             ours (libfusebox_memory_bound_capi.so via ctypes, checked against torch eager) and
#             the peers (torch eager, torch.compile, Triton) timed interleaved in one process,
#             and the ceilings; then the same again traced (--trace: kernel times without the
#             launch latency); then the verdict table (from the untraced in-process numbers)
#             with the kernel-time columns from the traced pass                          ~3-4 min
#   quick     bench without torch.compile, without our variants and without the trace  ~1 min
#   ab        in-process A/B: memory_bound_peers.py with the flags in AB (--only CASE,
#             --variant CASE:key=v,...), e.g. AB="--variant softmax:bfloat16:65536x1024:exp_once=1";
#             with the bundle's libfusebox_memory_bound_capi_base.so (BASELINE=<rev> device_all.sh)
#             that build is timed too, as "ours@base"
#   peerprof  Nsight Compute on ours and the torch.compile / eager kernels of the cases in
#             PEERPROF ("op:dtype:RxC ..."), run inside memory_bound_peers.py; torch.compile's
#             generated code goes to inductor.log; PEERPROF_ARGS: more flags (e.g. --variant ...);
#             PEERPROF_METRICS: extra ncu metrics (comma-separated), printed per kernel
# Writes test.log, sanitizer.log, bench.log, ours.json, peers.json, trace.json, report.md,
# results.json under $OUT; prints the verdict table last.
#   sweep     bench/gpu/sweep.py: shapes drawn fresh per run (seed printed), ours vs the peers in one
#             process; sweep.json, sweep.md, sweep.log (SWEEP_ARGS: e.g. "--quick", "--shapes 20")
# usage: COMMIT=<hash> BUNDLE=.bundle-kernels bash .bundle-kernels/bin/run_device.sh [test] [sanitize]
#        [bench|quick] [sweep] [ours] [ab] [profile] [peerprof]
set -u -o pipefail
B=${BUNDLE:-.bundle}
OUT=${OUT:-/tmp/fusebox-out}
mkdir -p "$OUT"
[[ -f $B/lib.tgz && ! -d $B/lib ]] && tar -C "$B" -xzf "$B/lib.tgz"
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
steps=${*:-test sanitize bench}
T=$B/bin/fusebox_gpu_kernels_test
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
NCU_SECTIONS=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy
  --section LaunchStats --section SchedulerStats)
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv |
  tee "$OUT/bench.log"

for step in $steps; do
  case $step in
  test)
    echo "== tests"
    start=$SECONDS
    "$T" --gtest_brief=1 2>&1 | tee "$OUT/test.log" | tail -n 30 || status=1
    echo "tests took $((SECONDS - start)) s"
    ;;
  sanitize)
    echo "== compute-sanitizer" | tee "$OUT/sanitizer.log"
    for tool in memcheck racecheck synccheck; do
      filter='-HugeTensors.*'
      [[ $tool != memcheck ]] && filter='*SoftmaxShapes/float32:*SoftmaxShapes/bfloat16:*RowSumShapes/bfloat16:*RowSumEightByteAccessRows/bfloat16:*RowSumOneBatchRows/bfloat16:*RowSumExactShortRows/bfloat16:*SoftmaxExactRows/float32:*SoftmaxExactRows/bfloat16:*BenchmarkVariants/float32'
      limit=${SANITIZER_LIMIT_S:-100}
      [[ $tool == memcheck ]] && limit=$((limit * 3 / 2))
      start=$SECONDS
      FUSEBOX_GPU_TEST_SMALL=1 timeout "$limit" "$CS" --tool "$tool" --error-exitcode 3 "$T" --gtest_brief=1 \
        --gtest_filter="$filter" >>"$OUT/sanitizer.log" 2>&1
      rc=$?
      echo "$tool: exit $rc in $((SECONDS - start)) s ($(grep -c 'ERROR SUMMARY: 0 errors\|RACECHECK SUMMARY: 0 hazards' "$OUT/sanitizer.log") clean summaries so far)" |
        tee -a "$OUT/sanitizer.log"
      grep -E "ERROR SUMMARY|HAZARD SUMMARY|RACECHECK SUMMARY|Invalid|Race|FAILED" "$OUT/sanitizer.log" | sort | uniq -c | head -n 12
      [[ $rc -ne 0 ]] && status=1
    done
    ;;
  bench | quick)
    echo "== benchmark"
    extra=()
    [[ $step == quick ]] && extra=(--no-variants)
    "$B/bin/fusebox_gpu_bench_memory_bound" --json "$OUT/ours.json" "${extra[@]}" 2>&1 | tee -a "$OUT/bench.log" | tail -n 8
    pextra=()
    [[ $step == quick ]] && pextra=(--quick)
    python3 "$B/bin/memory_bound_peers.py" --json "$OUT/peers.json" --capi "$B/bin/libfusebox_memory_bound_capi.so" \
      "${pextra[@]}" 2>&1 | tee -a "$OUT/bench.log" | tail -n 4
    rextra=()
    if [[ $step == bench ]]; then
      echo "== traced pass (kernel times)" | tee -a "$OUT/bench.log"
      python3 "$B/bin/memory_bound_peers.py" --json "$OUT/trace.json" --capi "$B/bin/libfusebox_memory_bound_capi.so" \
        --trace >>"$OUT/bench.log" 2>&1 && rextra=(--trace "$OUT/trace.json") || status=1
    fi
    python3 "$B/bin/memory_bound_report.py" "$OUT/ours.json" "$OUT/peers.json" --md "$OUT/report.md" \
      --json "$OUT/results.json" --commit "${COMMIT:-unknown}" --date "$(date -u +%F)" "${rextra[@]}" || status=1
    ;;
  sweep)  # every-shape sweep: shapes drawn fresh (seed printed; SWEEP_ARGS e.g. "--quick" or "--shapes 20 --seed N")
    echo "== sweep" | tee "$OUT/sweep.log"
    # shellcheck disable=SC2086
    timeout "${SWEEP_LIMIT_S:-420}" python3 "$B/bin/sweep.py" --capi "$B/bin/libfusebox_memory_bound_capi.so" \
      --json "$OUT/sweep.json" --md "$OUT/sweep.md" ${SWEEP_ARGS:-} >>"$OUT/sweep.log" 2>&1 || status=1
    grep -E "seed|WRONG|failed|budget" "$OUT/sweep.log" | head -n 20
    [[ -f $OUT/sweep.md ]] && sed -n '/## Summary/,$p' "$OUT/sweep.md"
    ;;
  ours)  # our kernels and all forced variants only (no peers): a tuning run
    echo "== ours"
    "$B/bin/fusebox_gpu_bench_memory_bound" --json "$OUT/ours.json" 2>&1 | tee -a "$OUT/bench.log" |
      grep -v "^#" | cut -c1-118
    ;;
  profile)  # Nsight Compute on the cases in PROFILE ("filter=kernel-regex;..."), clocks left alone
    IFS=';' read -r -a cases <<<"${PROFILE:-softmax float32 128x1048576 ours=SoftmaxChunk}"
    for c in "${cases[@]}"; do
      echo "== ncu: $c" | tee -a "$OUT/profile.log"
      timeout 120 "$NCU" --clock-control none -k "regex:${c##*=}" --launch-skip 3 --launch-count 1 "${NCU_SECTIONS[@]}" \
        "$B/bin/fusebox_gpu_bench_memory_bound" --reps 3 --filter "${c%=*}" >>"$OUT/profile.log" 2>&1 || status=1
      grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Compute \(SM\)|Waves Per SM|Grid Size|L2 Hit|Mem Busy|Max Bandwidth|One or More|No Eligible|Active Warps" \
        "$OUT/profile.log" | tail -n 26
    done
    ;;
  ab)
    echo "== in-process A/B: ${AB:-}"
    base=()
    [[ -f $B/bin/libfusebox_memory_bound_capi_base.so ]] && base=(--baseline "$B/bin/libfusebox_memory_bound_capi_base.so")
    # shellcheck disable=SC2086  # AB holds several flags
    python3 "$B/bin/memory_bound_peers.py" --json "$OUT/ab.json" --capi "$B/bin/libfusebox_memory_bound_capi.so" \
      "${base[@]}" ${AB:-} 2>&1 | tee -a "$OUT/ab.log" | grep -v "^#" || status=1
    ;;
  peerprof)
    for c in ${PEERPROF:-rowsum:float32:8192x8192}; do
      echo "== ncu in the peers' process: $c" | tee -a "$OUT/peerprof.log"
      # shellcheck disable=SC2086  # PEERPROF_ARGS holds several flags
      FUSEBOX_PROFILE_TIMED=1 TORCH_LOGS=output_code timeout 240 "$NCU" --clock-control none --profile-from-start off \
        -k "regex:${PEERPROF_KERNELS:-RowSum|Softmax|SoftMax|triton_(red|per)_}" --launch-count "${PEERPROF_COUNT:-12}" \
        "${NCU_SECTIONS[@]}" ${PEERPROF_METRICS:+--metrics "$PEERPROF_METRICS"} \
        python3 "$B/bin/memory_bound_peers.py" --json "$OUT/peerprof.json" --reps 2 \
        --capi "$B/bin/libfusebox_memory_bound_capi.so" --only "$c" ${PEERPROF_ARGS:-} >>"$OUT/peerprof.log" \
        2>>"$OUT/inductor.log" ||
        status=1
      grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Grid Size|Block Size${PEERPROF_METRICS:+|${PEERPROF_METRICS//,/|}}" \
        "$OUT/peerprof.log" | tail -n ${PEERPROF_TAIL:-24}
    done
    ;;
  *) echo "unknown step $step"; status=2 ;;
  esac
done
exit $status
