#!/usr/bin/env bash
# Loopback RPC benchmark: starts fusebox-server on a free port, runs
# fusebox-rpc-bench (inline GeLU float32 at 4 KiB x 1 and 8 callers, 64 MiB x 1,
# both client request paths) and writes bench/rpc/results-<date>.md with the
# date, commit and machine.
# MODE=floor instead also starts fusebox-rpc-echo (plain gRPC) and runs fusebox-rpc-bench
# --floor: fusebox's 4 KiB GeLU against the echo of the same size, interleaved, as ratios with
# 95% intervals over rounds; the header adds the command, nproc and the load average.
# MODE=transfer: fusebox-rpc-bench --transfer, a 1 GiB Upload and Download through the C++
# client on 1 and 4 connections against the echo's Sink and Source moving the same bytes on as
# many parallel 4 MiB streams (BENCH_ARGS: --transfer_bytes, --connections 1,4,8, --rounds).
# One command on any host: MODE=transfer bench/rpc/run_bench.sh build (BACKEND=cuda on a GPU).
#
# usage: bench/rpc/run_bench.sh [BUILD_DIR]   (default: build; builds the targets it runs)
#   env: MODE=loopback|floor|transfer (default loopback), ECHO_BIN (prebuilt fusebox-rpc-echo),
#        BACKEND=cpu|cuda|auto (default cpu), WORKERS (server --workers), OUT (results path),
#        BENCH_ARGS (extra fusebox-rpc-bench flags), NO_BUILD=1 (skip cmake --build),
#        SERVER_BIN / BENCH_BIN (prebuilt binaries, e.g. from a device bundle; implies NO_BUILD),
#        SERVER_ARGS (extra server flags), NOTE (a line added to the results header),
#        UNIX=1 (floor: also a second server on a unix socket, measured beside TCP)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
backend=${BACKEND:-cpu}
mode=${MODE:-loopback}
[[ "$mode" == loopback || "$mode" == floor || "$mode" == transfer ]] ||
  { echo "MODE: loopback, floor or transfer" >&2; exit 2; }
if [[ "$mode" == floor || "$mode" == transfer ]]; then
  out=${OUT:-bench/rpc/$mode-$(date -u +%Y-%m-%d).md}
else
  out=${OUT:-bench/rpc/results-$(date -u +%Y-%m-%d).md}
fi
targets=(fusebox-server fusebox-rpc-bench)
[[ "$mode" != loopback ]] && targets+=(fusebox-rpc-echo)
if [[ -z "${NO_BUILD:-}${SERVER_BIN:-}${BENCH_BIN:-}${ECHO_BIN:-}" ]]; then
  cmake --build "$build" --target "${targets[@]}" -j"$(nproc)" >/dev/null
fi
server_bin=${SERVER_BIN:-$build/server/fusebox-server}
bench_bin=${BENCH_BIN:-$build/bench/rpc/fusebox-rpc-bench}
echo_bin=${ECHO_BIN:-$build/bench/rpc/fusebox-rpc-echo}

# Starts a server that prints "listening on HOST:PORT" first; sets $port and $banner.
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null; wait $p 2>/dev/null; done; rm -rf "$tmp"' EXIT
start() {
  local name=$1; shift
  # Made here: the child opens them only once it runs, and a look before that must find them.
  : >"$tmp/$name.log"; : >"$tmp/$name.err"
  "$@" >>"$tmp/$name.log" 2>>"$tmp/$name.err" &
  local pid=$!
  pids+=($pid)
  port=""
  for _ in $(seq 1 300); do
    port=$(sed -n 's/.*listening on [^ ]*:\([0-9][0-9]*\).*/\1/p' "$tmp/$name.log" | head -1)
    [[ -n "$port" ]] && break
    kill -0 $pid 2>/dev/null || { cat "$tmp/$name.log" "$tmp/$name.err" >&2; echo "$name exited" >&2; exit 1; }
    sleep 0.1
  done
  [[ -n "$port" ]] || { cat "$tmp/$name.log" "$tmp/$name.err" >&2; echo "$name did not start" >&2; exit 1; }
  banner=$(head -1 "$tmp/$name.log")
}

server_args=(--address=127.0.0.1:0 --backend="$backend" ${SERVER_ARGS:-})
[[ -n "${WORKERS:-}" ]] && server_args+=(--workers="$WORKERS")
start server "$server_bin" "${server_args[@]}"
server_port=$port server_banner=$banner

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
b=("$bench_bin" --server "127.0.0.1:$server_port" ${BENCH_ARGS:-})
if [[ "$mode" == floor ]]; then
  start echo "$echo_bin" --address=127.0.0.1:0
  echo_port=$port
  b+=(--floor --echo "127.0.0.1:$echo_port")
  if [[ -n "${UNIX:-}" ]]; then  # the same server binary and flags, on a unix socket
    sock="$tmp/fusebox.sock"
    "$server_bin" "${server_args[@]}" --address="unix:$sock" >"$tmp/unix.log" 2>"$tmp/unix.err" &
    pids+=($!)
    for _ in $(seq 1 300); do grep -q "listening on unix:" "$tmp/unix.log" && break; sleep 0.1; done
    grep -q "listening on unix:" "$tmp/unix.log" || { cat "$tmp/unix.err" >&2; echo "unix server did not start" >&2; exit 1; }
    b+=(--unix "unix:$sock")
  fi
  table=$("${b[@]}")
elif [[ "$mode" == transfer ]]; then
  start echo "$echo_bin" --address=127.0.0.1:0
  echo_port=$port
  b+=(--transfer --echo "127.0.0.1:$echo_port")
  table=$("${b[@]}")
else
  table=$("${b[@]}" --cases 4KiB:1,4KiB:8,64MiB:1)
  # The 64 MiB alternatives: a serialized protobuf request; a fresh result buffer per call.
  table+=$'\n'$("${b[@]}" --no_header --cases 64MiB:1 --request_path protobuf)
  table+=$'\n'$("${b[@]}" --no_header --cases 64MiB:1 --output_buffer fresh)
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [[ -z "${COMMIT:-}" ]] && ! git diff --quiet HEAD -- client bench server proto kernels 2>/dev/null; then
  commit="$commit (+ uncommitted changes)"
fi
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)
if [[ "$mode" == transfer ]]; then
{
  echo "# fusebox bulk transfers: Upload and Download on 1 and N connections against a plain gRPC floor"
  echo
  echo "- date: $(date -u +'%Y-%m-%d %H:%M UTC')"
  echo "- commit: $commit"
  echo "- machine: $(uname -srm); $cpu; \`nproc\` $(nproc); $mem"
  echo "- load average (1, 5, 15 min): $load_before before, $load_after after"
  [[ -n "${NOTE:-}" ]] && echo "- note: $NOTE"
  echo "- command: \`MODE=transfer${BENCH_ARGS:+ BENCH_ARGS=\"$BENCH_ARGS\"}${BACKEND:+ BACKEND=$BACKEND}${OUT:+ OUT=$OUT} bench/rpc/run_bench.sh $build\`"
  echo "- fusebox: \`$server_banner\` (flags: ${server_args[*]})"
  echo "- echo: fusebox-rpc-echo Sink / Source (raw byte buffers on the server: counted, or one"
  echo "  prebuilt message sent again and again; generated sync stubs on the client)"
  echo "- client: \`${b[*]}\`; fusebox through fusebox_client: 1 connection is the plain"
  echo "  Upload / Download stream, N > 1 the ranged path (CreateUpload, WriteUpload per"
  echo "  connection, CommitUpload; ranged Downloads), ranges of 8 MiB in 4 MiB messages; downloads"
  echo "  into a buffer touched before (DownloadInto, N connections) and into a new HostTensor"
  echo "- GB/s = tensor bytes / wall time of the whole transfer (create and commit included);"
  echo "  medians over rounds, each round every target back to back"
  echo
  echo "$table"
} >"$out"
elif [[ "$mode" == floor ]]; then
{
  echo "# fusebox RPC-path floor: inline GeLU against a plain gRPC echo"
  echo
  echo "- date: $(date -u +'%Y-%m-%d %H:%M UTC')"
  echo "- commit: $commit"
  echo "- machine: $(uname -srm); $cpu; \`nproc\` $(nproc); $mem"
  echo "- load average (1, 5, 15 min): $load_before before, $load_after after"
  [[ -n "${NOTE:-}" ]] && echo "- note: $NOTE"
  echo "- command: \`MODE=floor${UNIX:+ UNIX=$UNIX}${BENCH_ARGS:+ BENCH_ARGS=\"$BENCH_ARGS\"}${OUT:+ OUT=$OUT} bench/rpc/run_bench.sh $build\`"
  echo "- fusebox: \`$server_banner\` (flags: ${server_args[*]})"
  echo "- echo: fusebox-rpc-echo (callback server, same gRPC and build flags), 127.0.0.1 loopback"
  echo "- client: \`${b[*]}\` (C++ sync calls; a connection of its own per caller;"
  echo "  fusebox through fusebox_client, the echo through generated sync stubs; its raw-bytes"
  echo "  target sends one prebuilt buffer and the server returns the request's own slices)"
  echo "- per caller count (all rounds of one before the next), each round runs the"
  echo "  targets back to back (order rotating by round); the target columns are medians over"
  echo "  rounds; a ratio is fusebox / echo per"
  echo "  round, its median over rounds and a distribution-free 95% interval (order statistics)."
  echo "  Latency ratio > 1: fusebox slower; calls/s ratio < 1: fusebox serves fewer."
  echo "  Execute: an Execute stream per caller with a window of calls in flight (send while"
  echo "  fewer are out, else take an answer); its latency runs from a call's send to its answer,"
  echo "  so it includes the wait behind the window. The windowed echo stream writes as far ahead."
  echo
  echo "$table"
} >"$out"
else
{
  echo "# fusebox loopback RPC benchmark: inline GeLU"
  echo
  echo "- date: $(date -u +'%Y-%m-%d %H:%M UTC')"
  echo "- commit: $commit"
  echo "- machine: $(uname -srm); $cpu; $(nproc) cores; $mem"
  echo "- server: \`$server_banner\` (flags: ${server_args[*]})"
  [[ -n "${NOTE:-}" ]] && echo "- note: $NOTE"
  echo "- client: fusebox-rpc-bench (C++ client, one channel, synchronous calls), 127.0.0.1 loopback"
  echo "- GB/s in = request payload bytes / wall time; in+out counts the equal-sized response too."
  echo "  p50/p99 are client round trips; server total/kernel are the server's own Timing."
  echo "  request path: zerocopy = the payload is referenced, not copied, by the request;"
  echo "  protobuf = a request message is built and serialized (two client-side copies)."
  echo "  output buffer: reused = one result per caller, its buffer's capacity kept across calls;"
  echo "  fresh = a new 64 MiB buffer per call (glibc mmaps it: a page fault per 4 KiB)."
  echo
  echo "$table"
} >"$out"
fi
cat "$out"
