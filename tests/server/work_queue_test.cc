// WorkQueue: bounded, drains on shutdown, runs jobs concurrently on indexed workers.
#include "server/exec/work_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace fusebox {
namespace {

TEST(WorkQueue, RefusesWhenFull) {
  WorkQueue q(1, 2);
  std::promise<void> release;
  auto gate = release.get_future().share();
  std::atomic<int> started{0};
  ASSERT_TRUE(q.TryPush([&, gate](int) { ++started; gate.wait(); }));
  while (started == 0) std::this_thread::yield();  // the worker holds job 1
  EXPECT_TRUE(q.TryPush([](int) {}));
  EXPECT_TRUE(q.TryPush([](int) {}));
  EXPECT_FALSE(q.TryPush([](int) {}));  // two queued: full
  EXPECT_EQ(q.queued(), 2u);
  release.set_value();
}

// A transfer's next piece continues admitted work: taken past capacity, never once stopping.
TEST(WorkQueue, OverCapacityJobsAreTakenWhenFullButNotWhenStopping) {
  std::atomic<int> ran{0};
  {
    WorkQueue q(1, 1);
    std::promise<void> release;
    auto gate = release.get_future().share();
    std::atomic<int> started{0};
    ASSERT_TRUE(q.TryPush([&, gate](int) { ++started; gate.wait(); }));
    while (started == 0) std::this_thread::yield();
    EXPECT_TRUE(q.TryPush([&](int) { ++ran; }));
    EXPECT_FALSE(q.TryPush([&](int) { ++ran; }));  // full
    EXPECT_TRUE(q.TryPush([&](int) { ++ran; }, /*over_capacity=*/true));
    EXPECT_EQ(q.queued(), 2u);
    release.set_value();
    q.Shutdown();
    EXPECT_FALSE(q.TryPush([&](int) { ++ran; }, /*over_capacity=*/true));
  }
  EXPECT_EQ(ran, 2);
}

TEST(WorkQueue, ShutdownRunsQueuedJobsThenRefuses) {
  std::atomic<int> ran{0};
  WorkQueue q(2, 100);
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(q.TryPush([&](int) { ++ran; }));
  q.Shutdown();
  EXPECT_EQ(ran, 50);
  EXPECT_TRUE(q.stopping());
  EXPECT_FALSE(q.TryPush([](int) {}));
}

// A second Shutdown, from another thread while the first drains, returns only once the
// queue has drained too (it used to return at once).
TEST(WorkQueue, EveryShutdownCallerWaitsForTheDrain) {
  WorkQueue q(1, 10);
  std::atomic<bool> finished{false};
  std::atomic<bool> started{false};
  ASSERT_TRUE(q.TryPush([&](int) {
    started = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    finished = true;
  }));
  while (!started) std::this_thread::yield();
  std::thread first([&] { q.Shutdown(); });
  while (!q.stopping()) std::this_thread::yield();  // the first caller is draining
  q.Shutdown();
  EXPECT_TRUE(finished);
  first.join();
}

TEST(WorkQueue, ZeroWorkersIsOneWorker) {
  std::atomic<int> ran{0};
  WorkQueue q(0, 10);
  EXPECT_EQ(q.workers(), 1);
  ASSERT_TRUE(q.TryPush([&](int) { ++ran; }));
  q.Shutdown();
  EXPECT_EQ(ran, 1);
}

TEST(WorkQueue, WorkersRunConcurrentlyWithDistinctIndices) {
  WorkQueue q(2, 10);
  std::promise<int> a, b;
  std::atomic<int> arrived{0};
  auto job = [&](std::promise<int>* p) {
    return [&, p](int worker) {
      ++arrived;
      while (arrived < 2) std::this_thread::yield();  // both must be running at once
      p->set_value(worker);
    };
  };
  ASSERT_TRUE(q.TryPush(job(&a)));
  ASSERT_TRUE(q.TryPush(job(&b)));
  auto fa = a.get_future(), fb = b.get_future();
  ASSERT_EQ(fa.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_EQ(fb.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_NE(fa.get(), fb.get());
}

}  // namespace
}  // namespace fusebox
