#!/usr/bin/env bash
# On the device (H200), from the e2e bundle (tools/gpu/device_all.sh e2e; carry .bundle-e2e):
# the Python client's torch tests against the server on the CUDA backend (the torch paths CI
# cannot run: CPU and CUDA tensors, bfloat16, DLPack), then the soak (tools/soak.py) on the CUDA
# backend for SOAK_SECONDS (default 300: the device's 10-minute command limit bounds one run).
# Writes torch_client.log, soak-h200.{json,csv,log} under $OUT. Builds nothing.
set -u -o pipefail
B=${BUNDLE:-.bundle-e2e}
OUT=${OUT:-/tmp/fusebox-out}
mkdir -p "$OUT"
[[ -f $B/lib.tgz && ! -d $B/lib ]] && tar -C "$B" -xzf "$B/lib.tgz"
export LD_LIBRARY_PATH=$PWD/$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
echo "== torch client tests (CUDA backend)"
( cd tests/integration &&
  PYTHONPATH=$OLDPWD/$B/bin/python FUSEBOX_SERVER_BIN=$OLDPWD/$B/bin/fusebox-server FUSEBOX_TEST_BACKEND=cuda \
    timeout 240 python3 -m pytest -q -p no:cacheprovider -rs test_torch_client.py ) 2>&1 |
  tee "$OUT/torch_client.log" | tail -n 15 || status=1
echo "== soak, CUDA backend, ${SOAK_SECONDS:-300} s"
timeout $(( ${SOAK_SECONDS:-300} + 120 )) python3 tools/soak.py --build_dir "$B/bin" --server_bin "$B/bin/fusebox-server" \
  --server_arg=--backend=cuda --duration "${SOAK_SECONDS:-300}" --out "$OUT/soak-h200" 2>&1 |
  tee "$OUT/soak-h200.log" | grep -v "^soak: t=" | tail -n 25
rc=${PIPESTATUS[0]}
echo "soak exit $rc"
[[ $rc == 0 ]] || status=1
exit $status
