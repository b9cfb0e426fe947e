#!/usr/bin/env bash
# The test command (README, .ci/run): install packages, build, run every test.
# GPU tests skip themselves on hosts without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j2 --timeout 600
