// Minimal timestamped logging to stderr (abseil 20220623 has no absl/log).
#pragma once

#include <cstdarg>
#include <cstdio>
#include <ctime>

namespace fusebox {

inline void Log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void Log(const char* fmt, ...) {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tm t;
  gmtime_r(&ts.tv_sec, &t);
  char line[1024];
  int n = std::snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ fusebox ",
                        t.tm_year + 1900, t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec,
                        ts.tv_nsec / 1000000);
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line + n, sizeof line - n, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "%s\n", line);
}

}  // namespace fusebox
