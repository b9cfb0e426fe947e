#!/bin/bash
# Runs issue 30's regression tests at HEAD (the pytest ones, unchanged, from a checkout of main)
# and this folder's reproduction scripts against one fusebox-server binary; prints one
# PASS/FAIL line per item and keeps each item's output under $LOGS.
#   run_all.sh SERVER_BIN LABEL [ITEM...]      (ITEM: f01 f02 ... f14 or a pytest node id)
# Needs: /usr/bin/python3 with pytest, grpcio, h2, numpy; PYTHONPATH a build's python/ (stubs
# and fusebox_client), by default /work/main/build/python; MAIN the checkout whose tests/ run.
# Against 7d2c18e: SERVER_BIN=/work/wt-base7d/build/server/fusebox-server.
set -u
BIN=$(readlink -f "$1"); LABEL=$2; shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
MAIN=${MAIN:-/work/main}
export PYTHONPATH=${PYTHONPATH:-$MAIN/build/python}
export FUSEBOX_SERVER_BIN=$BIN FUSEBOX_SERVER=$BIN FUSEBOX_PYTHON_PATH=$PYTHONPATH
export FUSEBOX_CLI_BIN=${FUSEBOX_CLI_BIN:-$MAIN/build/client/fusebox}
LOGS=${LOGS:-/tmp/regress-7d2c18e/$LABEL}; mkdir -p "$LOGS"
PY=tests/integration/test_python_client.py
MH=tests/metrics/test_metrics_http.py
declare -A ITEMS=(
  [f01]="pytest $MH::test_other_requests_get_an_error_and_the_server_survives $MH::test_every_bad_request_in_a_row_then_a_scrape"
  [f02]="pytest $PY::test_a_request_that_would_swell_in_parsing_is_refused_before_it_is"
  [f03a]="pytest $PY::test_a_connection_may_open_at_most_100_streams_at_once"
  [f03b]="pytest $PY::test_requests_that_never_finish_arriving_lose_their_connection_after_the_arrival_timeout"
  [f03]="script f03_unfinished_requests.py"
  [f04a]="pytest $PY::test_a_flood_of_idle_connections_past_the_descriptor_limit_loses_nothing"
  [f04b]="pytest $PY::test_connections_past_the_limit_are_closed_at_once_and_silent_ones_after_the_handshake"
  [f04]="script f04_idle_connections_handshake.py"
  [f04c]="script f04_fd_flood_loses_tensors.py"
  [f05a]="pytest tests/integration/test_tls.py"
  [f05b]="gtest $MAIN/build/tests/integration/fusebox_tls_integration_test"
  [f05]="script f05_tls.py"
  [f06]="script f06_upload_trickle.py"
  [f07]="script f07_lone_client_refused.py"
  [f08]="script f08_tenant_inflight_share.py"
  [f09]="script f09_tensor_table_share.py"
  [f10]="script f10_no_kernel_reply_amplification.py"
  [f11]="pytest $PY::test_bodies_that_do_not_parse_are_invalid_argument_counted_and_logged_at_most_a_little"
  [f11s]="script f11_unparseable_bodies.py"
  [f12]="pytest $MH::test_300_idle_connections_do_not_stall_a_scrape"
  [f12s]="script f12_metrics_scrape_stall.py"
  [f13]="script f13_short_deadline_orphans.py"
  [f14]="pytest $PY::test_sigterm_refuses_a_request_still_arriving_at_once_and_lets_calls_in_flight_finish"
)
ORDER="f01 f02 f03a f03b f03 f04a f04b f04 f04c f05a f05b f05 f06 f07 f08 f09 f10 f11 f11s f12 f12s f13 f14"
[ $# -gt 0 ] && ORDER="$*"
for item in $ORDER; do
  read -r kind rest <<<"${ITEMS[$item]}"
  log=$LOGS/$item.log
  t0=$(date +%s)
  case $kind in
    pytest) (cd "$MAIN" && timeout 600 nice /usr/bin/python3 -m pytest -q -p no:cacheprovider $rest) >"$log" 2>&1 ;;
    script) (cd "$HERE" && timeout 600 nice /usr/bin/python3 $rest "$BIN") >"$log" 2>&1 ;;
    gtest)  timeout 600 nice $rest >"$log" 2>&1 ;;
  esac
  rc=$?
  if [ $rc -eq 0 ]; then r=PASS; elif [ $rc -eq 124 ]; then r=TIMEOUT; else r="FAIL(rc=$rc)"; fi
  summary=$(grep -E "^(PASS|FAIL):|passed|failed|error|FAILED TESTS|\[  PASSED  \]" "$log" | tail -1 | cut -c1-220)
  echo "$LABEL $item $r $(( $(date +%s) - t0 ))s :: $summary"
done
