// Load generation shared by fusebox-perf and the benchmarks: closed loop (N callers, each
// calling again as soon as its call returns), streaming closed loop (N streams, each keeping a
// window of calls in flight) and open loop (calls sent at a fixed rate by a
// pool of callers, each call's latency counted from its intended send time, so a server that
// falls behind shows its queueing in the latency instead of lowering the offered rate), and the
// percentile and interval statistics their reports use.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace fusebox::client::load {

using Clock = std::chrono::steady_clock;

// What one phase (warm-up or measured) of a run saw.
struct Result {
  std::vector<double> latency_us;  // successful calls only
  std::map<int, int64_t> errors;   // gRPC code -> calls that ended with it (0, OK, not counted)
  int64_t calls = 0;               // every call that ended in the phase, errors included
  double wall_s = 0;
  int64_t late = 0;                // open loop: calls that started past their intended time by
                                   // more than 1 ms (every caller was busy)
  double calls_per_s() const { return wall_s > 0 ? static_cast<double>(calls) / wall_s : 0; }
};

// One caller thread's count of a phase, added to the run's Result once at the end.
struct Tally {
  std::vector<double> latency_us;
  std::map<int, int64_t> errors;
  int64_t calls = 0, late = 0;
  // A call that ended with `code` (0 = OK, then its latency counts).
  void Add(int code, double latency_us_of_call) {
    ++calls;
    if (code == 0) {
      latency_us.push_back(latency_us_of_call);
    } else {
      ++errors[code];
    }
  }
  void MergeInto(Result* r, std::mutex* mu) const {
    std::lock_guard<std::mutex> lock(*mu);
    r->latency_us.insert(r->latency_us.end(), latency_us.begin(), latency_us.end());
    for (auto [code, k] : errors) r->errors[code] += k;
    r->calls += calls;
    r->late += late;
  }
};

inline double MicrosSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

// A warm-up phase (warmup_s, not measured; skipped when 0) and then the measured one
// (duration_s), each running body(caller, until, measured, &tally) on `callers` threads started
// together; the measured phase's tallies make the Result, its wall time from its start to the
// last caller's return.
template <typename Body>
Result Phases(int callers, double warmup_s, double duration_s, Body&& body) {
  Result result;
  std::mutex mu;
  auto phase = [&](bool measured, double seconds) {
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(seconds));
    std::vector<std::thread> threads;
    const auto t0 = Clock::now();
    for (int c = 0; c < callers; ++c) {
      threads.emplace_back([&, c] {
        Tally mine;
        body(c, until, measured, &mine);
        if (measured) mine.MergeInto(&result, &mu);
      });
    }
    for (auto& t : threads) t.join();
    if (measured) result.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  };
  if (warmup_s > 0) phase(false, warmup_s);
  phase(true, duration_s);
  return result;
}

// Closed loop: `callers` threads each call fn(caller, measured) back to back for warmup_s, then
// all start again together for duration_s; fn returns the call's gRPC code (0 = OK). The
// measured phase's calls are those that start before its end.
template <typename Fn>
Result ClosedLoop(int callers, double warmup_s, double duration_s, Fn&& fn) {
  auto drive = [&](int c, Clock::time_point until, bool measured, Tally* mine) {
    while (Clock::now() < until) {
      const auto start = Clock::now();
      const int code = fn(c, measured);
      mine->Add(code, MicrosSince(start));
    }
  };
  return Phases(callers, warmup_s, duration_s, drive);
}

// Streaming closed loop: `callers` threads, each driving a stream of its own with up to `window`
// calls unanswered: it sends while fewer are out, else takes the next answer. send(c, seq,
// measured) sends caller c's call number `seq` and returns 0, or a gRPC code when the stream is
// broken; take(c, measured, &seq) takes caller c's next answer, sets the number of the call it
// answers and returns its gRPC code (0 = OK), or -1 when the stream has ended. A call's latency
// runs from its send to its answer. Each phase ends by taking every answer still out (those
// calls count in it), so the next phase starts with an empty window.
template <typename Send, typename Take>
Result StreamLoop(int callers, int window, double warmup_s, double duration_s, Send&& send,
                  Take&& take) {
  std::vector<uint64_t> next_seq(static_cast<size_t>(callers), 0);
  auto drive = [&](int c, Clock::time_point until, bool measured, Tally* mine) {
    std::unordered_map<uint64_t, Clock::time_point> out;
    uint64_t& seq = next_seq[static_cast<size_t>(c)];
    for (;;) {
      const bool sending = Clock::now() < until;
      if (sending && static_cast<int>(out.size()) < window) {
        const auto start = Clock::now();
        const int code = send(c, seq, measured);
        if (code != 0) {
          mine->Add(code, 0);
          break;
        }
        out.emplace(seq++, start);
        continue;
      }
      if (out.empty()) break;
      uint64_t answered = 0;
      const int code = take(c, measured, &answered);
      if (code < 0) {  // the stream ended: what was out is lost
        mine->errors[14] += static_cast<int64_t>(out.size());  // UNAVAILABLE
        mine->calls += static_cast<int64_t>(out.size());
        break;
      }
      const auto it = out.find(answered);
      if (it == out.end()) continue;  // not ours (cannot happen with a sane server)
      mine->Add(code, MicrosSince(it->second));
      out.erase(it);
    }
  };
  return Phases(callers, warmup_s, duration_s, drive);
}

// Open loop at `rate` calls/s: call i is due at start + i / rate; a pool of `callers` threads
// takes the calls in order, each waiting until its call is due. Latency runs from the due time
// to the end of the call, so when every caller is busy the wait for a free one counts. Warm-up
// (warmup_s, not measured) and the measured phase are one schedule, without a pause between.
template <typename Fn>
Result OpenLoop(int callers, double rate, double warmup_s, double duration_s, Fn&& fn) {
  Result result;
  std::mutex mu;
  const auto start = Clock::now();
  const auto at = [&](double s) {
    return start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  const int64_t warm_calls = static_cast<int64_t>(std::llround(warmup_s * rate));
  const int64_t total_calls = warm_calls + static_cast<int64_t>(std::llround(duration_s * rate));
  std::atomic<int64_t> next{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < callers; ++c) {
    threads.emplace_back([&, c] {
      Tally mine;
      for (;;) {
        const int64_t i = next.fetch_add(1);
        if (i >= total_calls) break;
        const auto due = at(static_cast<double>(i) / rate);
        std::this_thread::sleep_until(due);
        const bool measured = i >= warm_calls;
        if (measured && Clock::now() - due > std::chrono::milliseconds(1)) ++mine.late;
        const int code = fn(c, measured);
        if (measured) mine.Add(code, MicrosSince(due));
      }
      mine.MergeInto(&result, &mu);
    });
  }
  for (auto& t : threads) t.join();
  // The measured phase spans from its first call's due time to the last call's end.
  result.wall_s = std::chrono::duration<double>(Clock::now() - at(warmup_s)).count();
  return result;
}

// The p-quantile (0..1) by the nearest rank; 0 for no values. Sorts a copy.
inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(p * static_cast<double>(v.size()));
  const size_t i = rank < 1 ? 0 : std::min(v.size() - 1, static_cast<size_t>(rank) - 1);
  return v[i];
}

// The median of v and a distribution-free interval for it with at least 95% coverage: order
// statistics x(k) and x(n+1-k), k the largest with P(Binomial(n, 1/2) < k) <= 2.5%. It assumes
// only that the values are independent draws from one distribution (one per round), nothing
// about its shape. ok is false when n < 6 (no such k: too few rounds for any 95% interval).
struct MedianInterval {
  double median = 0, lo = 0, hi = 0;
  bool ok = false;
};
inline MedianInterval MedianWithInterval(std::vector<double> v) {
  MedianInterval m;
  if (v.empty()) return m;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  m.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  // P(B < k) = sum_{i<k} C(n,i) / 2^n, accumulated in doubles (n is a count of rounds).
  double term = std::pow(0.5, static_cast<double>(n)), below = 0;
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    below += term;  // now P(B <= i) = P(B < i + 1)
    if (below > 0.025) break;
    k = i + 1;
    term = term * static_cast<double>(n - i) / static_cast<double>(i + 1);
  }
  if (k >= 1) {
    m.lo = v[k - 1];
    m.hi = v[n - k];
    m.ok = true;
  }
  return m;
}

}  // namespace fusebox::client::load
