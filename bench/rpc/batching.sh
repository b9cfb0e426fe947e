#!/usr/bin/env bash
# Batching A/B (issue 32): the server with each of the given flag sets in turn, interleaved over
# ROUNDS rounds (even rounds in reverse order; one server at a time, started fresh per run), fusebox-perf closed loop at
# CALLERS callers; per run: calls/s, client p50, the server's median queue_us and total_us, and
# launches per call from /metrics (fusebox_launches_total / fusebox_op_calls_total).
#
# usage: bench/rpc/batching.sh [BUILD_DIR] -- "FLAGS A" "FLAGS B" ...
#   env: ROUNDS (3), CALLERS (64), OP (softmax), SHAPE (16x64 = 4 KiB float32), DTYPE (float32),
#        DURATION_S (5), WARMUP_S (1), BACKEND (cpu)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}; shift
[[ "${1:-}" == "--" ]] && shift
configs=("$@")
[[ ${#configs[@]} -gt 0 ]] || configs=("--batching=true" "--batching=false")
server_bin=$build/server/fusebox-server
perf_bin=$build/client/fusebox-perf
tmp=$(mktemp -d)
pid=""
trap '[[ -n "$pid" ]] && kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT
metric() { curl -s "http://127.0.0.1:$mport/metrics" | awk -v n="$1" '$1 ~ "^"n"[{ ]" || $1 == n {print $2}' | head -1; }
echo "round,flags,calls_per_s,p50_us,server_queue_us,server_total_us,calls,launches,launches_per_call"
for round in $(seq 1 "${ROUNDS:-3}"); do
  order=("${configs[@]}")
  if (( round % 2 == 0 )); then  # even rounds run the configs in reverse order
    order=(); for (( i=${#configs[@]}-1; i>=0; i-- )); do order+=("${configs[$i]}"); done
  fi
  for flags in "${order[@]}"; do
    mport=$(( 20000 + RANDOM % 20000 ))
    : >"$tmp/server.log"  # before the child opens it: the first look below must find it
    # shellcheck disable=SC2086
    "$server_bin" --address=127.0.0.1:0 --backend="${BACKEND:-cpu}" --metrics_address=127.0.0.1:$mport \
      $flags >>"$tmp/server.log" 2>"$tmp/server.err" &
    pid=$!
    port=""
    for _ in $(seq 1 300); do
      port=$(sed -n 's/.*listening on [^ ]*:\([0-9][0-9]*\).*/\1/p' "$tmp/server.log" | head -1)
      [[ -n "$port" ]] && break
      sleep 0.1
    done
    [[ -n "$port" ]] || { cat "$tmp/server.log" "$tmp/server.err" >&2; exit 1; }
    "$perf_bin" --server=127.0.0.1:$port --op="${OP:-softmax}" --dtype="${DTYPE:-float32}" \
      --shape="${SHAPE:-16x64}" --callers="${CALLERS:-64}" --duration_s="${DURATION_S:-5}" \
      --warmup_s="${WARMUP_S:-1}" --csv="$tmp/run.csv" >/dev/null
    calls=$(metric fusebox_op_calls_total); launches=$(metric fusebox_launches_total)
    python3 - "$round" "$flags" "$tmp/run.csv" "$calls" "$launches" <<'PY'
import sys
rnd, flags, path, calls, launches = sys.argv[1:]
head, row = open(path).read().splitlines()[:2]
r = dict(zip(head.split(","), row.split(",")))
c, l = float(calls), float(launches)
print(f"{rnd},{flags},{r['calls_per_s']},{r['p50_us']},{r.get('server_queue_us')},{r.get('server_total_us')},{c:.0f},{l:.0f},{l / c:.3f}")
PY
    kill $pid; wait $pid 2>/dev/null || true; pid=""
  done
done
