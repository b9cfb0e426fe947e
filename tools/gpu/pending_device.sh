#!/usr/bin/env bash
# On the device, from the bundle of `tools/gpu/device_all.sh pending` (carry .bundle-pending): the
# GPU checks a change owes before its numbers can be quoted, in one device command of at most
# TOTAL_S seconds (default 560, under the tool's 10 minutes). Each step runs under its own limit,
# cut to what is left of the total, so one that hangs cannot take the rest with it:
#   kernels   the GPU kernel tests (tests/gpu), all                                    <= 150 s
#   backend   the CUDA backend's tests (the module loaded as the server loads it)      <= 90 s
#   sanitize  compute-sanitizer memcheck, racecheck, synccheck over the kernel tests   <= ~120 s
#   floor     the 4 KiB RPC floor (rpc_floor_device.sh floor4k), the default server and
#             SERVER_ARGS=--cuda_graphs=true, each against the echo of its own run      <= 2 x 170 s
# (The every-shape sweep needs the kernels bundle and a command of its own: run_device.sh sweep.)
# Logs and records under $OUT/<step>/; prints a table of step, status and seconds last.
# usage (device): COMMIT=<c> bash .bundle-pending/bin/pending_device.sh
#                 [STEPS="kernels backend sanitize floor"] [TOTAL_S=560]
set -u -o pipefail
B=${BUNDLE:-.bundle-pending}
OUT=${OUT:-/tmp/fusebox-out}
COMMIT=${COMMIT:-unknown}
TOTAL_S=${TOTAL_S:-560}
mkdir -p "$OUT"
[[ -f $B/lib.tgz && ! -d $B/lib ]] && tar -C "$B" -xzf "$B/lib.tgz"
export LD_LIBRARY_PATH=$PWD/$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export FUSEBOX_CUDA_MODULE=$PWD/$B/bin/libfusebox_cuda_backend.so
begin=$SECONDS
rows=()

# The limit for a step that wants `want` seconds: what is left of TOTAL_S, less 10 s for the rest.
limit() {
  local left=$((TOTAL_S - (SECONDS - begin) - 10))
  (( left < want )) && want=$left
  echo $((want > 0 ? want : 0))
}

# step NAME WANT_S COMMAND...: runs COMMAND with its output in $OUT/NAME/log, under the limit.
step() {
  local name=$1 want=$2; shift 2
  local t d=$OUT/$name start=$SECONDS rc
  t=$(limit)
  mkdir -p "$d"
  if (( t < 20 )); then
    rows+=("$name|skipped (no time left)|0")
    return
  fi
  echo "== $name (limit ${t} s)"
  OUT=$d timeout --kill-after=10 "$t" "$@" >"$d/log" 2>&1
  rc=$?
  tail -n 15 "$d/log"
  # gtest's summary, where there is one: a GPU test suite that skipped is not a pass.
  local counts
  counts=$(grep -hoE '^\[ +(PASSED|SKIPPED|FAILED) +\] [0-9]+ tests?' "$d/log" | sed 's/^\[  *//; s/  *\] / /' |
    tr '\n' ',' | sed 's/,$//; s/,/, /g')
  case $rc in
    0) rows+=("$name|ok${counts:+ ($counts)}|$((SECONDS - start))") ;;
    124|137) rows+=("$name|TIMED OUT at ${t} s|$((SECONDS - start))") ;;
    *) rows+=("$name|FAILED (exit $rc)|$((SECONDS - start))") ;;
  esac
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv |
  tee "$OUT/machine.txt"
echo "commit $COMMIT" | tee -a "$OUT/machine.txt"
for s in ${STEPS:-kernels backend sanitize floor}; do
  case $s in
    kernels) step kernels 150 "$B/bin/fusebox_gpu_kernels_test" --gtest_brief=1 ;;
    backend) step backend 90 "$B/bin/fusebox_gpu_cuda_backend_test" --gtest_brief=1 ;;
    sanitize)
      step sanitize 130 env BUNDLE="$B" SANITIZER_LIMIT_S=30 COMMIT="$COMMIT" \
        bash "$B/bin/run_device.sh" sanitize ;;
    floor)
      step floor 170 env BUNDLE="$B" COMMIT="$COMMIT" PARTS=floor4k \
        bash "$B/bin/rpc_floor_device.sh"
      step floor-graphs 170 env BUNDLE="$B" COMMIT="$COMMIT" PARTS=floor4k \
        SERVER_ARGS=--cuda_graphs=true bash "$B/bin/rpc_floor_device.sh" ;;
    *) echo "unknown step '$s' (kernels backend sanitize floor)" >&2; exit 2 ;;
  esac
done

echo
echo "| step | status | seconds |"
echo "|---|---|---|"
status=0
for r in "${rows[@]}"; do
  IFS='|' read -r name st secs <<<"$r"
  echo "| $name | $st | $secs |"
  [[ $st == ok ]] || status=1
done
exit $status
