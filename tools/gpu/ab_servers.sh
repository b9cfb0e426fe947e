#!/usr/bin/env bash
# Runs on the device machine from the bundle that tools/gpu/device_all.sh e2e makes; builds nothing.
# Small-call latency of the real server on loopback, fusebox-rpc-bench (the bundle's) against
# servers started in turn, alternated so that drift between server instances shows as spread:
#   builds    BASELINE's server (the bundle's base/, from BASELINE=<rev> tools/gpu/device_all.sh
#             e2e) against this bundle's, both --backend=cuda: base head, head base, base head
#   backends  this bundle's server with --backend=cpu against --backend=cuda, three rounds
#   flags     this bundle's CUDA server with its defaults and with each extra argument's flags
#             (one argument per configuration, e.g. "--cuda_graphs=true" "--kernel_gate=false"),
#             ROUNDS (2) rounds, the order reversed every other round
# Each server instance prints one row per case with the server's phase medians (--phases).
# usage: BUNDLE=.bundle-e2e bash .bundle-e2e/bin/ab_servers.sh builds|backends|flags [FLAGS...]
#        [CASES=4KiB:1,4KiB:8] [SECONDS_PER_CASE=3]
set -u -o pipefail
B=${BUNDLE:-.bundle-e2e}
mode=${1:-}
shift $(( $# > 0 ))
cases=${CASES:-4KiB:1,4KiB:8}
[[ -f $B/lib.tgz && ! -d $B/lib ]] && tar -C "$B" -xzf "$B/lib.tgz"
[[ -f $B/base.tgz && ! -d $B/base ]] && tar -C "$B" -xzf "$B/base.tgz"
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log=$(mktemp -d)
status=0
header=()  # the first table prints its header

# run NAME SERVER_BINARY SERVER_FLAGS...: one server instance, the cases against it, SIGTERM.
run() {
  local name=$1 bin=$2; shift 2
  "$bin" --address=127.0.0.1:0 --idle_expiry_s=0 "$@" >"$log/out" 2>"$log/err" &
  local pid=$!
  for _ in $(seq 300); do grep -q listening "$log/out" && break; sleep 0.1; done
  local port
  port=$(sed -n 's/.*listening on [^:]*:\([0-9]*\).*/\1/p' "$log/out")
  if [[ -z $port ]]; then
    echo "$name: the server did not start"; cat "$log/err"; kill $pid 2>/dev/null; status=1; return
  fi
  echo "== $name"
  "$B/bin/fusebox-rpc-bench" --server "127.0.0.1:$port" --cases "$cases" \
    --max_seconds "${SECONDS_PER_CASE:-3}" --phases "${header[@]}" || status=1
  header=(--no_header)
  kill -TERM $pid; wait $pid || { echo "$name: server exit $?"; status=1; }
}

case $mode in
  builds)
    [[ -x $B/base/fusebox-server ]] || { echo "no $B/base: BASELINE=<rev> tools/gpu/device_all.sh e2e"; exit 2; }
    for r in 1 2 3; do
      if (( r == 2 )); then order="head base"; else order="base head"; fi
      for who in $order; do
        if [[ $who == base ]]; then run "base round $r" "$B/base/fusebox-server" --backend=cuda
        else run "head round $r" "$B/bin/fusebox-server" --backend=cuda; fi
      done
    done ;;
  backends)
    for r in 1 2 3; do
      run "cpu round $r" "$B/bin/fusebox-server" --backend=cpu
      run "cuda round $r" "$B/bin/fusebox-server" --backend=cuda
    done ;;
  flags)
    configs=("" "$@")
    for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
      idx=($(seq 0 $((${#configs[@]} - 1))))
      (( r % 2 == 0 )) && idx=($(printf '%s\n' "${idx[@]}" | tac))
      for i in "${idx[@]}"; do
        # shellcheck disable=SC2086  # one configuration's flags, split on spaces
        run "cuda ${configs[i]:-defaults} round $r" "$B/bin/fusebox-server" --backend=cuda ${configs[i]}
      done
    done ;;
  *) echo "usage: ab_servers.sh builds|backends|flags [FLAGS...]"; exit 2 ;;
esac
rm -rf "$log"
exit $status
