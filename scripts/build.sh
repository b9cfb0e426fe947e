#!/usr/bin/env bash
# Configures and builds everything into ${BUILD_DIR:-build} (CUDA parts when nvcc is found).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"
