#!/usr/bin/env bash
# The test command (README, .ci/run): install packages, build, run every test, then the
# Python client as pip installs it (scripts/python_package.sh: a venv, packages from PyPI).
# GPU tests skip themselves on hosts without a GPU.
#
# FUSEBOX_EXTRA_CHECKS=ON (CI sets it) then also runs, in order:
#   a soak of FUSEBOX_SOAK_SECONDS (default 150) on the server just built (tools/soak.py),
#   the libFuzzer harnesses for FUSEBOX_FUZZ_SECONDS each (default 120 here; scripts/fuzz.sh),
#   the ASan+UBSan and TSan builds and their tests (scripts/sanitize.sh).
# Each step prints its time; the first that fails stops the run.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
step() {  # step NAME COMMAND...: runs it and says how long it took
  local name=$1 t0=$SECONDS
  shift
  echo "== test.sh: $name"
  "$@"
  echo "== test.sh: $name done in $((SECONDS - t0)) s"
}
step setup scripts/setup.sh
step build scripts/build.sh
step ctest ctest --test-dir "$build" --output-on-failure -j2 --timeout 600
step python-package scripts/python_package.sh
if [ "${FUSEBOX_EXTRA_CHECKS:-OFF}" = ON ]; then
  step soak /usr/bin/python3 tools/soak.py --build_dir "$build" \
    --duration "${FUSEBOX_SOAK_SECONDS:-150}" --out "$build/soak"
  step fuzz env FUSEBOX_FUZZ_SECONDS="${FUSEBOX_FUZZ_SECONDS:-120}" scripts/fuzz.sh
  step sanitizers scripts/sanitize.sh asan tsan
fi
