// FUZZ_CHECK, the harnesses' failure: when `cond` is false, it prints the harness's name
// (kFuzzerName, which each harness defines), the condition and a printf-style message on
// stderr, then aborts, which libFuzzer and the corpus replay both report as a crash.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK_AS(name, cond, ...)                \
  do {                                                \
    if (!(cond)) {                                    \
      std::fprintf(stderr, "%s: %s: ", name, #cond);  \
      std::fprintf(stderr, __VA_ARGS__);              \
      std::fprintf(stderr, "\n");                     \
      std::abort();                                   \
    }                                                 \
  } while (0)

#define FUZZ_CHECK(cond, ...) FUZZ_CHECK_AS(kFuzzerName, cond, __VA_ARGS__)
