#!/usr/bin/env bash
# Builds everything issue 3 runs on the H200 (build-dev/, CUDA) and packs it into one .bundle/
# (scripts/device_bundle.sh): the GPU kernel, matmul and CUDA-backend tests, the memory-bound and
# matmul benchmarks with their Python harnesses, the server with its CUDA module and the end-to-end
# client. Then call the device `run` tool with carry [".bundle"] and one
# or more of the commands printed last (each fits the tool's 10-minute limit).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release >/dev/null
targets=(fusebox-server fusebox_cuda_backend fusebox-e2e
  fusebox_gpu_kernels_test fusebox_gpu_bench_memory_bound fusebox_memory_bound_capi
  fusebox_gpu_matmul_test fusebox_gpu_cuda_backend_test matmul_bench fusebox_matmul_capi)
cmake --build build-dev -j"$(nproc)" --target "${targets[@]}"
b=build-dev
scripts/device_bundle.sh $b/server/fusebox-server $b/server/libfusebox_cuda_backend.so \
  $b/bench/e2e/fusebox-e2e \
  $b/tests/gpu/fusebox_gpu_kernels_test $b/tests/gpu/fusebox_gpu_matmul_test \
  $b/tests/gpu/fusebox_gpu_cuda_backend_test \
  $b/bench/gpu/fusebox_gpu_bench_memory_bound $b/bench/gpu/libfusebox_memory_bound_capi.so \
  $b/bench/gpu/matmul_bench $b/bench/gpu/libfusebox_matmul_capi.so \
  bench/gpu/run_device.sh bench/gpu/memory_bound_peers.py bench/gpu/memory_bound_report.py \
  bench/gpu/run_matmul.sh bench/gpu/matmul_torch.py bench/gpu/matmul_report.py \
  bench/e2e/run_e2e.sh
c=$(git rev-parse --short HEAD)
echo "device commands (carry .bundle):"
echo "  COMMIT=$c bash .bundle/bin/run_device.sh test sanitize bench   # memory-bound kernels, ~6 min"
echo "  bash .bundle/bin/run_e2e.sh                                     # server end to end, ~3 min"
echo "  COMMIT=$c bash .bundle/bin/run_matmul.sh .bundle                # matmul, ~4 min"
