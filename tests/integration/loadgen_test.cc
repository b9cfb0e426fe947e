// The load generator's loops and statistics (client/cpp/loadgen.h), with calls that are plain
// functions: no server. Timing-based checks use margins wide enough for a loaded 2-core machine.
#include "client/cpp/loadgen.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <thread>
#include <vector>

namespace fusebox::client::load {
namespace {

TEST(Percentile, IsTheNearestRank) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_EQ(Percentile(v, 0.5), 50);
  EXPECT_EQ(Percentile(v, 0.99), 99);
  EXPECT_EQ(Percentile(v, 0.999), 100);
  EXPECT_EQ(Percentile(v, 0), 1);
  EXPECT_EQ(Percentile({}, 0.5), 0);
}

TEST(MedianWithInterval, NeedsSixValuesForA95PercentInterval) {
  EXPECT_FALSE(MedianWithInterval({1, 2, 3, 4, 5}).ok);
  const MedianInterval m = MedianWithInterval({6, 1, 5, 2, 4, 3});
  ASSERT_TRUE(m.ok);  // P(Binomial(6, 1/2) = 0) = 1/64 <= 2.5%: the extremes
  EXPECT_EQ(m.lo, 1);
  EXPECT_EQ(m.hi, 6);
  EXPECT_EQ(m.median, 3.5);
}

TEST(MedianWithInterval, TakesTheSecondOrderStatisticsForTenValues) {
  // P(B(10, 1/2) <= 1) = 11/1024 <= 2.5% < P(B <= 2) = 56/1024: x(2) and x(9).
  const MedianInterval m = MedianWithInterval({10, 9, 8, 7, 6, 5, 4, 3, 2, 1});
  ASSERT_TRUE(m.ok);
  EXPECT_EQ(m.lo, 2);
  EXPECT_EQ(m.hi, 9);
  EXPECT_EQ(m.median, 5.5);
}

TEST(ClosedLoop, CountsFailedCallsByCodeAndTimesOnlyTheRest) {
  std::atomic<int> n{0};
  const Result r = ClosedLoop(2, 0.05, 0.2, [&](int, bool measured) {
    if (!measured) return 0;
    return n.fetch_add(1) % 2 == 0 ? 0 : 14;  // every other call UNAVAILABLE
  });
  ASSERT_GT(r.calls, 2);
  EXPECT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(static_cast<int64_t>(r.latency_us.size()) + r.errors.at(14), r.calls);
  EXPECT_GT(r.wall_s, 0.15);
}

TEST(OpenLoop, SendsTheScheduledCallsAndCountsQueueingAsLatency) {
  // 200 calls/s for 0.5 s, each taking 20 ms, on one caller: it falls behind at once, so
  // the calls wait for it and their latency from the due time grows far past 20 ms.
  const Result r = OpenLoop(1, 200, 0, 0.5, [](int, bool) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return 0;
  });
  EXPECT_EQ(r.calls, 100);
  EXPECT_GT(r.late, 90);
  EXPECT_GT(Percentile(r.latency_us, 0.99), 1e6);  // the last call is due at 0.5 s, ends at 2 s
}

TEST(OpenLoop, KeepsUpWhenCallersSuffice) {
  const Result r = OpenLoop(8, 100, 0.1, 0.5, [](int, bool) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return 0;
  });
  EXPECT_EQ(r.calls, 50);
  EXPECT_LT(Percentile(r.latency_us, 0.5), 50000);
}

// A fake stream per caller that answers in reverse order of sending: the loop keeps at most
// `window` calls out, matches answers to calls by number, answers every call it sent, and
// counts answers with an error code by that code.
TEST(StreamLoop, KeepsTheWindowAndMatchesAnswersInAnyOrder) {
  constexpr int kCallers = 2, kWindow = 4;
  struct Fake {
    std::deque<uint64_t> out;
    size_t most = 0;
    int64_t sent = 0;
  };
  std::vector<Fake> fakes(kCallers);
  auto send = [&](int c, uint64_t seq, bool) {
    Fake& f = fakes[static_cast<size_t>(c)];
    f.out.push_back(seq);
    f.most = std::max(f.most, f.out.size());
    ++f.sent;
    return 0;
  };
  auto take = [&](int c, bool, uint64_t* seq) {
    Fake& f = fakes[static_cast<size_t>(c)];
    if (f.out.empty()) return -1;
    *seq = f.out.back();  // the newest first
    f.out.pop_back();
    return *seq % 10 == 3 ? 8 : 0;  // every tenth call RESOURCE_EXHAUSTED
  };
  const Result r = StreamLoop(kCallers, kWindow, 0.05, 0.2, send, take);
  int64_t sent = 0;
  for (const Fake& f : fakes) {
    EXPECT_EQ(f.most, static_cast<size_t>(kWindow));
    EXPECT_TRUE(f.out.empty());  // the phase ended by taking every answer out
    sent += f.sent;
  }
  EXPECT_GT(r.calls, 0);
  EXPECT_LE(r.calls, sent);  // the warm-up's calls are not counted
  const int64_t failed = r.errors.count(8) ? r.errors.at(8) : 0;
  EXPECT_GT(failed, 0);
  EXPECT_EQ(static_cast<int64_t>(r.latency_us.size()) + failed, r.calls);
}

}  // namespace
}  // namespace fusebox::client::load
