#!/usr/bin/env bash
# Sanitizer builds of the CPU server and its tests, and their ctest runs (CI runs this through
# scripts/test.sh; see README). Our code is instrumented; Debian's gRPC, protobuf, abseil and
# OpenBLAS are not.
#   asan: AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer -> build-asan/
#   tsan: ThreadSanitizer                                              -> build-tsan/
#   scripts/sanitize.sh [asan] [tsan]    (no argument: both)
# Every report is fatal, and each process writes its reports to <build>/sanitizer-reports/,
# so a report from a server that a test started (and whose exit the test does not read)
# fails the run too. Zero reports is the pass mark.
#
# Trimmed, and why (the plain build runs all of these):
#   * tests that run no C++ of ours: the layering check, the benchmark report's statistics,
#     the Kubernetes manifests, promtool on the alert rules and scrape config;
#   * test_an_output_the_host_cannot_allocate_is_resource_exhausted_and_serving_goes_on
#     (test_python_client.py skips it when FUSEBOX_SANITIZE is set): a sanitizer's operator
#     new aborts when an allocation fails instead of throwing std::bad_alloc.
#   * test_cli_holds_an_uploaded_npy_in_memory_about_once (skipped the same way): the peak RSS
#     it bounds would hold the sanitizer's shadow memory and quarantine.
#   * HeapTest (tests/server/heap_test.cc, skipped the same way): it checks glibc's heap,
#     which a sanitizer's allocator replaces.
#   * TSan only: the tests that call through gRPC (the in-process server's ServiceTest and
#     friends, the integration and TLS tests, fusebox-perf, the Python and Go clients, the Routers and the
#     proxy test, the real Prometheus scrape, the metrics port under a real server, the Upload
#     and ranged-upload corpus replays, the Execute stream, ranged transfer and shared-memory
#     client tests). Debian's gRPC is not built with TSan, and its synchronisation (absl::Mutex,
#     lock-free atomics in its core) is invisible to it: every handoff between gRPC's threads
#     reads as a race, in gRPC's own inlined code (grpcpp headers) and in ours alike (a reactor
#     made on one gRPC thread and deleted in OnDone on another): thousands of false reports
#     that no suppression of third-party frames alone can remove. TSan runs everything of ours
#     whose threads synchronise through our own code: the work queue and executor, the CPU
#     backend, the kernels' thread pool, the tensor store, the in-flight budget, request
#     checks, the metrics exporter, the client. The gRPC-facing tests run under ASan+UBSan.
#     Checking the reactors with TSan needs a gRPC (and abseil) built with -fsanitize=thread.
# tools/ci/tsan.supp and lsan.supp hold suppressions for third-party frames only, each with
# its reason (both are empty now).
set -euo pipefail
cd "$(dirname "$0")/.."
kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(asan tsan)
not_ours='server_layers_include_nothing_above_their_own|bench_report_statistics|deploy_k8s_manifests_validate|metrics_alert_rules_are_valid|metrics_alert_rules_fire_as_specified|metrics_scrape_config_is_valid'
through_grpc='python_client_integration|python_package_integration|perf_tool_integration|go_client_example|proxy_routes_held_tensors_to_their_replica|tls_integration.*|metrics_http_endpoint_survives_any_request|metrics_real_prometheus_scrapes_server|fuzz_corpus_upload_replays_cleanly|fuzz_corpus_ranged_upload_replays_cleanly|python_shared_memory_integration|TlsFiles\.AServerInProcess.*|(Service[A-Za-z]*|TokenService|Integration|ServerLifecycle|Router|Execute|RangedTransfer|SharedMemoryClient|BatchingEndToEnd)Test\..*'

for kind in "${kinds[@]}"; do
  case "$kind" in
    asan) san=address,undefined; skip="^($not_ours)\$" ;;
    tsan) san=thread; skip="^($not_ours|$through_grpc)\$" ;;
    *) echo "sanitize.sh: unknown kind '$kind' (asan, tsan)" >&2; exit 2 ;;
  esac
  build=build-$kind
  start=$SECONDS
  echo "== sanitize: $kind ($san) into $build/"
  # No -Werror here: GCC warns falsely under sanitizers (-Wmaybe-uninitialized in libstdc++'s
  # <regex> under ASan); the plain build holds the warnings line.
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFUSEBOX_CUDA=OFF -DFUSEBOX_BENCH=OFF \
    -DFUSEBOX_WERROR=OFF -DFUSEBOX_SANITIZE="$san" >/dev/null
  cmake --build "$build" -j"$(nproc)"
  echo "== sanitize: $kind built in $((SECONDS - start)) s"
  reports=$PWD/$build/sanitizer-reports
  rm -rf "$reports"
  mkdir -p "$reports"
  export FUSEBOX_SANITIZE=$san
  export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:log_path=$reports/asan"
  export LSAN_OPTIONS="suppressions=$PWD/tools/ci/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports/ubsan"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tools/ci/tsan.supp:print_suppressions=0:log_path=$reports/tsan"
  test_start=$SECONDS
  rc=0
  ctest --test-dir "$build" --output-on-failure -j2 --timeout 900 -E "$skip" || rc=$?
  echo "== sanitize: $kind tests ran in $((SECONDS - test_start)) s"
  shopt -s nullglob
  found=("$reports"/*)
  shopt -u nullglob
  if ((${#found[@]})); then
    echo "== sanitize: $kind: ${#found[@]} report file(s):" >&2
    for f in "${found[@]}"; do
      echo "--- $f" >&2
      head -c 20000 "$f" >&2
    done
    rc=1
  fi
  unset FUSEBOX_SANITIZE ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS
  if ((rc)); then
    echo "== sanitize: $kind FAILED" >&2
    exit "$rc"
  fi
  echo "== sanitize: $kind clean: 0 reports ($((SECONDS - start)) s in all)"
done
