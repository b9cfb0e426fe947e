#!/usr/bin/env bash
# The libFuzzer harnesses (tests/fuzz/: request decoding and validation, the Upload protocol,
# the client's .npy reader), built with clang, ASan and UBSan into build-fuzz/, each run for
# FUSEBOX_FUZZ_SECONDS (default 60) from its committed corpus (CI runs this through
# scripts/test.sh; see README).
#   scripts/fuzz.sh [request] [upload] [npy] [ranged_upload]    (no argument: all four)
# Any crash, failed check, sanitizer report, leak, timeout (30 s for one input) or
# out-of-memory fails the run. The input that did it is left in build-fuzz/findings/<name>/;
# reproduce with build-fuzz/tests/fuzz/<name>_fuzzer <file>, fix the bug, and commit the input
# as tests/fuzz/corpus/<name>/regress-<what> (every build then replays it: ctest -L fuzz).
# New inputs a run finds go to build-fuzz/fuzz-corpus/<name>/ (not committed; to grow the
# committed corpus, merge: <name>_fuzzer -merge=1 tests/fuzz/corpus/<name> <that folder>).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUSEBOX_FUZZ_SECONDS:-60}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(request upload npy ranged_upload)
build=build-fuzz
start=$SECONDS
cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFUSEBOX_CUDA=OFF -DFUSEBOX_BENCH=OFF -DFUSEBOX_WERROR=OFF \
  -DFUSEBOX_FUZZ=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/%/_fuzzer}"
echo "== fuzz: built in $((SECONDS - start)) s"

# The longest input each harness is given: a request with a few tensors; an Upload script
# (its data comes from a counter, so a few bytes make megabytes); a .npy file.
declare -A max_len=([request]=16384 [upload]=2048 [npy]=8192 [ranged_upload]=1024)
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1"
export LSAN_OPTIONS="suppressions=$PWD/tools/ci/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
rc=0
for t in "${targets[@]}"; do
  work=$build/fuzz-corpus/$t
  findings=$build/findings/$t
  mkdir -p "$work" "$findings"
  echo "== fuzz: $t for $seconds s"
  t0=$SECONDS
  if ! "$build/tests/fuzz/${t}_fuzzer" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 \
      -max_len="${max_len[$t]}" -print_final_stats=1 -artifact_prefix="$findings/" \
      "$work" "tests/fuzz/corpus/$t" >"$build/fuzz-$t.log" 2>&1; then
    echo "== fuzz: $t FAILED after $((SECONDS - t0)) s; the end of $build/fuzz-$t.log:" >&2
    tail -n 80 "$build/fuzz-$t.log" >&2
    ls -l "$findings" >&2
    rc=1
    continue
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/fuzz-$t.log" | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -o 'cov: [0-9]*' "$build/fuzz-$t.log" | tail -1 || true)
  echo "== fuzz: $t clean: $runs inputs in $((SECONDS - t0)) s, $cov, corpus $(ls "$work" | wc -l) new + $(ls "tests/fuzz/corpus/$t" | wc -l) committed"
done
echo "== fuzz: $((SECONDS - start)) s in all"
exit "$rc"
