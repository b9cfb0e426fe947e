#!/usr/bin/env bash
# Builds what the H200 runs (build-dev/, CUDA; BUILD_DIR=build reuses the main build) and packs one bundle per device job
# (tools/gpu/device_bundle.sh), because the device tool carries at most 64 MiB with the working tree:
#   kernels  .bundle-kernels: GPU kernel tests, the memory-bound benchmark and its Python harnesses
#   matmul   .bundle-matmul: matmul and CUDA-backend tests, the matmul benchmark and its harnesses
#   e2e      .bundle-e2e: the server with its CUDA module, the end-to-end client, the memory-bound
#            benchmark (its medians), the /metrics check with the Python stubs, the metrics
#            RecordCall benchmark (bench/baselines/metrics-record-call-*), fusebox-rpc-bench, and the CUDA
#            backend's tests (fusebox_gpu_cuda_backend_test, which loads the module next to it
#            or FUSEBOX_CUDA_MODULE: with BASELINE, base/'s shows whether a new test fails there),
#            and tools/soak.py (on the device: python3 .bundle-e2e/bin/soak.py --build_dir
#            .bundle-e2e/bin --server_bin .bundle-e2e/bin/fusebox-server --server_arg=--backend=cuda),
#            and the RPC floor: fusebox-rpc-echo with bench/rpc/run_bench.sh (rpc_floor_device.sh)
#   pending  .bundle-pending: what a change owes the GPU in one device command
#            (tools/gpu/pending_device.sh): the kernel and CUDA-backend tests, compute-sanitizer,
#            the 4 KiB floor with and without --cuda_graphs (the sweep is the kernels bundle's)
# Then call the device `run` tool with carry [".bundle-<job>"] and the command printed for it
# (each fits the tool's 10-minute limit).
# BASELINE=<rev> also builds that revision (in a worktree under build-base/) for an A/B of two
# builds: kernels gets its libfusebox_memory_bound_capi.so as libfusebox_memory_bound_capi_base.so,
# which the `ab` step of run_device.sh times beside ours ("ours@base") in one process; e2e gets
# its fusebox-server and CUDA module as base.tgz, which tools/gpu/ab_servers.sh builds runs
# alternated with this revision's server.
# usage: [BASELINE=<rev>] tools/gpu/device_all.sh [kernels] [matmul] [e2e] [pending]
#        (default: kernels matmul e2e)
set -euo pipefail
cd "$(dirname "$0")/../.."
jobs=("$@")
(( ${#jobs[@]} )) || jobs=(kernels matmul e2e)
b=${BUILD_DIR:-build-dev}  # BUILD_DIR=build reuses the main build
declare -A targets=(
  [kernels]="fusebox_gpu_kernels_test fusebox_gpu_bench_memory_bound fusebox_memory_bound_capi"
  [matmul]="fusebox_gpu_matmul_test fusebox_gpu_cuda_backend_test fusebox_cuda_backend matmul_bench fusebox_matmul_capi"
  [e2e]="fusebox-server fusebox_cuda_backend fusebox-e2e fusebox_gpu_bench_memory_bound fusebox_proto_python
         fusebox_metrics_bench fusebox-rpc-bench fusebox_gpu_cuda_backend_test
         fusebox_gpu_shared_memory_test fusebox_gpu_ipc_exporter fusebox-perf fusebox-rpc-echo"
  [pending]="fusebox_gpu_kernels_test fusebox_gpu_cuda_backend_test
             fusebox-server fusebox_cuda_backend fusebox-rpc-bench fusebox-rpc-echo"
)
declare -A files=(
  [kernels]="$b/tests/gpu/fusebox_gpu_kernels_test $b/bench/gpu/fusebox_gpu_bench_memory_bound
             $b/bench/gpu/libfusebox_memory_bound_capi.so
             bench/gpu/run_device.sh bench/gpu/memory_bound_peers.py bench/gpu/triton_peers.py bench/gpu/memory_bound_report.py
             bench/gpu/interleaved_timer.py bench/gpu/paired_stats.py bench/gpu/sweep.py"
  [matmul]="$b/tests/gpu/fusebox_gpu_matmul_test $b/tests/gpu/fusebox_gpu_cuda_backend_test
            $b/server/libfusebox_cuda_backend.so $b/bench/gpu/matmul_bench $b/bench/gpu/libfusebox_matmul_capi.so
            bench/gpu/run_matmul.sh bench/gpu/matmul_torch.py bench/gpu/matmul_report.py
            bench/gpu/interleaved_timer.py bench/gpu/matmul_sweep.py bench/gpu/paired_stats.py"
  [e2e]="$b/server/fusebox-server $b/server/libfusebox_cuda_backend.so $b/bench/e2e/fusebox-e2e
         $b/bench/gpu/fusebox_gpu_bench_memory_bound $b/bench/metrics/fusebox_metrics_bench
         $b/bench/rpc/fusebox-rpc-bench $b/python tests/metrics/gpu_metrics_check.py bench/e2e/run_e2e.sh
         $b/tests/gpu/fusebox_gpu_cuda_backend_test tools/gpu/ab_servers.sh tools/soak.py
         $b/tests/gpu/fusebox_gpu_shared_memory_test $b/tests/gpu/fusebox_gpu_ipc_exporter
         $b/client/fusebox-perf $b/bench/rpc/fusebox-rpc-echo bench/rpc/run_bench.sh
         tools/gpu/rpc_floor_device.sh"
  [pending]="$b/tests/gpu/fusebox_gpu_kernels_test $b/tests/gpu/fusebox_gpu_cuda_backend_test
             $b/server/fusebox-server $b/server/libfusebox_cuda_backend.so
             $b/bench/rpc/fusebox-rpc-bench $b/bench/rpc/fusebox-rpc-echo bench/rpc/run_bench.sh
             tools/gpu/rpc_floor_device.sh tools/gpu/pending_device.sh bench/gpu/run_device.sh"
)
c=$(git rev-parse --short HEAD)
declare -A command=(
  [kernels]="COMMIT=$c BUNDLE=.bundle-kernels bash .bundle-kernels/bin/run_device.sh test sanitize bench  # ~4-6 min"
  [matmul]="COMMIT=$c bash .bundle-matmul/bin/run_matmul.sh \$PWD/.bundle-matmul  # ~4 min"
  [e2e]="BUNDLE=.bundle-e2e bash .bundle-e2e/bin/run_e2e.sh  # ~3 min; A/B: ab_servers.sh builds|backends"
  [pending]="COMMIT=$c bash .bundle-pending/bin/pending_device.sh  # <= 560 s"
)
want=()
for j in "${jobs[@]}"; do
  [[ -n ${targets[$j]:-} ]] || { echo "unknown job '$j' (kernels, matmul, e2e, pending)" >&2; exit 2; }
  read -r -a t <<<"${targets[$j]//$'\n'/ }"
  want+=("${t[@]}")
done
cmake -S . -B $b -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build $b -j"$(nproc)" --target "${want[@]}"
if [[ -n ${BASELINE:-} ]]; then
  wt=build-base/src
  if [[ $(git -C $wt rev-parse HEAD 2>/dev/null) != "$(git rev-parse "$BASELINE^{commit}")" ]]; then
    git worktree remove --force $wt 2>/dev/null || rm -rf $wt
    git worktree prune
    git worktree add --detach $wt "$BASELINE" >/dev/null
  fi
  cmake -S $wt -B build-base/build -DCMAKE_BUILD_TYPE=Release >/dev/null
  declare -A base_targets=([kernels]=fusebox_memory_bound_capi [e2e]="fusebox-server fusebox_cuda_backend")
  base_want=()
  for j in "${jobs[@]}"; do
    read -r -a t <<<"${base_targets[$j]:-}"
    base_want+=("${t[@]}")
  done
  (( ${#base_want[@]} )) && cmake --build build-base/build -j"$(nproc)" --target "${base_want[@]}"
  if [[ " ${jobs[*]} " == *" kernels "* ]]; then
    cp build-base/build/bench/gpu/libfusebox_memory_bound_capi.so build-base/libfusebox_memory_bound_capi_base.so
    files[kernels]+=" build-base/libfusebox_memory_bound_capi_base.so"
  fi
fi
for j in "${jobs[@]}"; do
  read -r -a f <<<"${files[$j]//$'\n'/ }"
  BUNDLE_DIR=.bundle-$j tools/gpu/device_bundle.sh "${f[@]}"
done
# The base server's shared libraries are the bundle's (the same packages); its binaries travel
# gzipped (the CUDA module is 14 MB) under base/, next to each other as the server expects.
if [[ -n ${BASELINE:-} && " ${jobs[*]} " == *" e2e "* ]]; then
  rm -rf build-base/pack && mkdir -p build-base/pack/base
  cp build-base/build/server/fusebox-server build-base/build/server/libfusebox_cuda_backend.so \
    build-base/pack/base/
  tar -C build-base/pack -czf .bundle-e2e/base.tgz base
  du -sh .bundle-e2e | awk '{print "bundle .bundle-e2e with base.tgz: " $1}'
fi
echo "device commands (carry the bundle named first):"
for j in "${jobs[@]}"; do echo "  .bundle-$j: ${command[$j]}"; done
