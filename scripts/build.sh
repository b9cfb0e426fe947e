#!/usr/bin/env bash
# Configures and builds everything into ${BUILD_DIR:-build} (CUDA parts when nvcc is found).
# FUSEBOX_WERROR=ON makes compiler warnings errors (CI sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFUSEBOX_WERROR="${FUSEBOX_WERROR:-OFF}" >/dev/null
cmake --build "$build" -j"$(nproc)"
