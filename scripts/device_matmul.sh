#!/usr/bin/env bash
# Builds the matmul GPU tests, benchmarks and the CUDA backend module (in $BUILD, default
# build-gpu; CUDA, sm_90a) and packs them with their scripts into .bundle/
# (scripts/device_bundle.sh) for the device tool. Then call the device `run` tool with
# carry [".bundle"] and the command this script prints last (bench/gpu/run_matmul.sh).
# usage: [BUILD=build-dir] scripts/device_matmul.sh [options for run_matmul.sh]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build-gpu}
[[ -f $build/CMakeCache.txt ]] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target fusebox_gpu_matmul_test fusebox_gpu_cuda_backend_test matmul_bench \
  fusebox_matmul_capi fusebox_cuda_backend -j"${JOBS:-2}"
scripts/device_bundle.sh "$build/tests/gpu/fusebox_gpu_matmul_test" \
  "$build/tests/gpu/fusebox_gpu_cuda_backend_test" "$build/server/libfusebox_cuda_backend.so" \
  "$build/bench/gpu/matmul_bench" "$build/bench/gpu/libfusebox_matmul_capi.so" \
  bench/gpu/matmul_torch.py bench/gpu/matmul_report.py bench/gpu/run_matmul.sh
echo "device command (carry [\".bundle\"]): bash .bundle/bin/run_matmul.sh .bundle${*:+ $*}"
