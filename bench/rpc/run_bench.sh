#!/usr/bin/env bash
# Loopback RPC benchmark: starts fusebox-server on a free port, runs
# fusebox-rpc-bench (inline GeLU float32 at 4 KiB x 1 and 8 callers, 64 MiB x 1,
# both client request paths) and writes bench/rpc/results-<date>.md with the
# date, commit and machine.
#
# usage: bench/rpc/run_bench.sh [BUILD_DIR]   (default: build; builds the two targets)
#   env: BACKEND=cpu|cuda|auto (default cpu), WORKERS (server --workers), OUT (results path),
#        BENCH_ARGS (extra fusebox-rpc-bench flags), NO_BUILD=1 (skip cmake --build),
#        SERVER_BIN / BENCH_BIN (prebuilt binaries, e.g. from a device bundle; implies NO_BUILD),
#        SERVER_ARGS (extra server flags), NOTE (a line added to the results header)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
backend=${BACKEND:-cpu}
out=${OUT:-bench/rpc/results-$(date -u +%Y-%m-%d).md}
if [[ -z "${NO_BUILD:-}${SERVER_BIN:-}${BENCH_BIN:-}" ]]; then
  cmake --build "$build" --target fusebox-server fusebox-rpc-bench -j"$(nproc)" >/dev/null
fi
server_bin=${SERVER_BIN:-$build/server/fusebox-server}
bench_bin=${BENCH_BIN:-$build/bench/rpc/fusebox-rpc-bench}

log=$(mktemp)
errlog=$(mktemp)
server_args=(--address=127.0.0.1:0 --backend="$backend" ${SERVER_ARGS:-})
[[ -n "${WORKERS:-}" ]] && server_args+=(--workers="$WORKERS")
"$server_bin" "${server_args[@]}" >"$log" 2>"$errlog" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log" "$errlog"' EXIT
port=""
for _ in $(seq 1 300); do
  port=$(sed -n 's/.*listening on [^ ]*:\([0-9][0-9]*\).*/\1/p' "$log" | head -1)
  [[ -n "$port" ]] && break
  kill -0 $pid 2>/dev/null || { cat "$log" "$errlog" >&2; echo "server exited" >&2; exit 1; }
  sleep 0.1
done
[[ -n "$port" ]] || { cat "$log" "$errlog" >&2; echo "server did not start" >&2; exit 1; }
banner=$(head -1 "$log")

b=("$bench_bin" --server "127.0.0.1:$port" ${BENCH_ARGS:-})
table=$("${b[@]}" --cases 4KiB:1,4KiB:8,64MiB:1)
# The 64 MiB alternatives: a serialized protobuf request; a fresh result buffer per call.
table+=$'\n'$("${b[@]}" --no_header --cases 64MiB:1 --request_path protobuf)
table+=$'\n'$("${b[@]}" --no_header --cases 64MiB:1 --output_buffer fresh)

commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [[ -z "${COMMIT:-}" ]] && ! git diff --quiet HEAD -- client bench server proto kernels 2>/dev/null; then
  commit="$commit (+ uncommitted changes)"
fi
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)
{
  echo "# fusebox loopback RPC benchmark: inline GeLU"
  echo
  echo "- date: $(date -u +'%Y-%m-%d %H:%M UTC')"
  echo "- commit: $commit"
  echo "- machine: $(uname -srm); $cpu; $(nproc) cores; $mem"
  echo "- server: \`$banner\` (flags: ${server_args[*]})"
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
cat "$out"
kill -TERM $pid; wait $pid || true
