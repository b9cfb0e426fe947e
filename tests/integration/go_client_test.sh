#!/usr/bin/env bash
# The Go client end to end: builds client/go offline from Debian's Go packages
# (client/go/build.sh), starts fusebox-server on a free port, runs the example against it
# (bfloat16 GeLU, a chunked upload, softmax by handle, a download, frees) and stops the server.
#   go_client_test.sh SERVER_BIN OUT_DIR
set -euo pipefail
server_bin=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
command -v go >/dev/null || { echo "go_client_test: no go: scripts/setup.sh installs golang-go"; exit 1; }
"$here/../../client/go/build.sh" "$out"
log=$(mktemp)
"$server_bin" --address=127.0.0.1:0 --backend=cpu >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 100); do
  grep -q "listening on" "$log" && break
  sleep 0.1
done
address=$(sed -n 's/.*listening on \([^ ]*\) .*/\1/p' "$log" | head -1)
[ -n "$address" ] || { echo "go_client_test: the server did not start:"; cat "$log"; exit 1; }
FUSEBOX_SERVER=$address "$out/fusebox-go-example"
kill -TERM "$pid"
wait "$pid"
