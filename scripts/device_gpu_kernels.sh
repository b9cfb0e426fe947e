#!/usr/bin/env bash
# Builds the memory-bound GPU kernel tests, benchmark and ctypes library (libfusebox_memory_bound_capi.so:
# memory_bound_peers.py times ours through it beside the peers) here (build-gpu/, CUDA, sm_90) and packs
# them with their scripts into .bundle/ (scripts/device_bundle.sh; the .so lands in .bundle/bin next to
# the scripts) for the device tool. Then call the device `run` tool with carry [".bundle"] and the
# command this script prints last.
# usage: scripts/device_gpu_kernels.sh [steps for bench/gpu/run_device.sh]
set -euo pipefail
cd "$(dirname "$0")/.."
# Configure every time (seconds): Makefiles do not know a target added since the last configure.
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-gpu --target fusebox_gpu_kernels_test fusebox_gpu_bench_memory_bound \
  fusebox_memory_bound_capi -j"$(nproc)"
scripts/device_bundle.sh build-gpu/tests/gpu/fusebox_gpu_kernels_test \
  build-gpu/bench/gpu/fusebox_gpu_bench_memory_bound build-gpu/bench/gpu/libfusebox_memory_bound_capi.so \
  bench/gpu/run_device.sh \
  bench/gpu/memory_bound_peers.py bench/gpu/memory_bound_report.py
echo "device command: COMMIT=$(git rev-parse --short HEAD) bash .bundle/bin/run_device.sh ${*:-test sanitize bench}"
