#!/usr/bin/env bash
# Builds the server, the CUDA backend module, fusebox-e2e and the memory-bound
# benchmark here (build-dev/, CUDA) and packs them into .bundle/ for the device
# tool; then call `run` with carry [".bundle"] and the command printed last.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -f build-dev/CMakeCache.txt ]] || cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-dev -j"$(nproc)" --target fusebox-server fusebox_cuda_backend fusebox-e2e \
  fusebox_gpu_bench_memory_bound
scripts/device_bundle.sh build-dev/server/fusebox-server build-dev/server/libfusebox_cuda_backend.so \
  build-dev/bench/e2e/fusebox-e2e build-dev/bench/gpu/fusebox_gpu_bench_memory_bound \
  bench/e2e/run_e2e.sh
echo "device command: bash .bundle/bin/run_e2e.sh"
