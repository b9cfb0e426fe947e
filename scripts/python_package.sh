#!/usr/bin/env bash
# The Python client as users install it, in a fresh virtual environment with packages from
# PyPI only: `pip install ./client/python` (no C++ build tree on the path), an sdist and a
# wheel built from it (python -m build), mypy --strict on the package, its tests and the
# example, then the client's Python integration tests against the installed package and the
# server in ${BUILD_DIR:-build}. test.sh runs it after ctest; it needs the network for PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=$(cd "${BUILD_DIR:-build}" && pwd)
venv=$build/python-venv
/usr/bin/python3 -m venv --clear "$venv"
py=$venv/bin/python
"$py" -m pip install -q --disable-pip-version-check "./client/python[bfloat16,progress]" \
  mypy types-grpcio types-protobuf pytest build
rm -rf "$build/python-dist"
"$py" -m build -q --outdir "$build/python-dist" ./client/python >/dev/null
ls "$build/python-dist"/fusebox_client-*.whl "$build/python-dist"/fusebox_client-*.tar.gz
"$py" -m mypy --strict -p fusebox_client
(cd tests/integration && "$py" -m mypy --strict test_python_package.py "$root/client/python/example.py")
cd tests/integration
# The client's side of test_python_client (ops, errors, handles, CLI, example); its server
# side (signals, connection limits, floods, flag ranges) is the server's, which ctest runs.
server_side="sigterm or signal or flood or connection or streams or arrival or reflection or \
unfinished or swell or bodies or allocate or out_of_range or cuda_only or refuses_out"
# One pytest process per file: a process that has used grpc.aio (test_python_package's asyncio
# tests) cannot fork servers reliably afterwards, which test_python_client does throughout.
run() {
  env -u PYTHONPATH FUSEBOX_PIP_INSTALLED=1 FUSEBOX_SERVER_BIN="$build/server/fusebox-server" \
    FUSEBOX_CLI_BIN="$build/client/fusebox" "$py" -m pytest -q -p no:cacheprovider "$@"
}
run test_python_package.py
run test_python_client.py -k "not ($server_side)"
