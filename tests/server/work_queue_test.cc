// WorkQueue: bounded, drains on shutdown, runs jobs concurrently on indexed workers; and the
// QueuedExecutor over it: timing from arrival, refusals that name the backend.
#include "server/exec/queued_executor.h"
#include "server/exec/work_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

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

namespace fusebox {
namespace {

TEST(WorkQueue, RunsAJobHereWhenASlotIsFreeAndNothingWaits) {
  WorkQueue q(2, 8);
  std::thread::id ran_on;
  int slot = -1;
  ASSERT_TRUE(q.TryRunHere([&](int s) {
    ran_on = std::this_thread::get_id();
    slot = s;
  }));
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_TRUE(slot == 0 || slot == 1);
}

TEST(WorkQueue, ARunHereNeverOvertakesAQueuedJobNorTakesABusySlot) {
  WorkQueue q(1, 8);
  std::promise<void> release;
  auto gate = release.get_future().share();
  std::atomic<int> started{0};
  ASSERT_TRUE(q.TryPush([&, gate](int) { ++started; gate.wait(); }));
  while (started == 0) std::this_thread::yield();  // the one slot is held
  EXPECT_FALSE(q.TryRunHere([](int) { ADD_FAILURE() << "ran on a busy slot"; }));
  ASSERT_TRUE(q.TryPush([](int) {}));  // queued behind it
  release.set_value();
  // Until the queued job has started, a run here would overtake it.
  while (q.queued() > 0) {
    std::atomic<bool> ran{false};
    if (q.TryRunHere([&](int) { ran = true; })) {
      EXPECT_EQ(q.queued(), 0u) << "overtook";
    }
  }
  q.Shutdown();
  EXPECT_FALSE(q.TryRunHere([](int) { ADD_FAILURE() << "ran while stopping"; }));
}

// Workers and callers running jobs here share the slots: no slot is ever held twice.
TEST(WorkQueue, JobsRunHereAndOnWorkersNeverShareASlot) {
  constexpr int kSlots = 3;
  WorkQueue q(kSlots, 1 << 16);
  std::atomic<int> holders[kSlots] = {};
  std::atomic<int> doubled{0}, ran{0};
  auto job = [&](int slot) {
    if (holders[slot].fetch_add(1) != 0) ++doubled;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    holders[slot].fetch_sub(1);
    ++ran;
  };
  std::vector<std::thread> callers;
  std::atomic<int> submitted{0};
  for (int c = 0; c < 6; ++c) {
    callers.emplace_back([&] {
      for (int i = 0; i < 300; ++i) {
        if (!q.TryRunHere(job)) {
          ASSERT_TRUE(q.TryPush(job));
        }
        ++submitted;
      }
    });
  }
  for (auto& t : callers) t.join();
  q.Shutdown();
  EXPECT_EQ(doubled.load(), 0);
  EXPECT_EQ(ran.load(), submitted.load());
}

TEST(QueuedExecutor, TimesEachJobFromArrivalAndNamesTheWorker) {
  QueuedExecutor exec("test", 1, 4);
  std::promise<std::pair<absl::Status, OpTiming>> got;
  const int64_t arrived = SteadyNowNs() - 2000000;  // 2 ms before the push
  exec.Run(arrived, [&](absl::Status s, const OpTiming& t) { got.set_value({s, t}); },
           [](int worker, OpTiming* t) {
             t->kernel_us = 5;
             return worker == 0 ? absl::OkStatus() : absl::InternalError("worker");
           });
  auto [status, t] = got.get_future().get();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(t.stream, 0);
  EXPECT_EQ(t.kernel_us, 5);
  EXPECT_GE(t.queue_us, 2000);
  EXPECT_GE(t.total_us, t.queue_us);
  exec.Shutdown();
}

TEST(QueuedExecutor, AFullQueueIsRefusedAtOnceNamingTheBackendAndItsCapacity) {
  QueuedExecutor exec("test", 1, 1);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> ran{0};
  auto block = [&](int, OpTiming*) {
    released.wait();
    ++ran;
    return absl::OkStatus();
  };
  exec.Run(SteadyNowNs(), [](absl::Status, const OpTiming&) {}, block);  // running
  BackendStats s;
  for (int i = 0; i < 1000; ++i) {  // until the first job has left the queue for the worker
    exec.FillStats(&s);
    if (s.busy == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(s.busy, 1);
  exec.Run(SteadyNowNs(), [](absl::Status, const OpTiming&) {}, block);  // queued
  absl::Status refused;
  exec.Run(SteadyNowNs(), [&](absl::Status st, const OpTiming&) { refused = st; }, block);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("the test backend's queue is full (1 calls)"),
            absl::string_view::npos)
      << refused;
  release.set_value();
  exec.Shutdown();
  EXPECT_EQ(ran.load(), 2);
  absl::Status after;
  exec.Run(SteadyNowNs(), [&](absl::Status st, const OpTiming&) { after = st; }, block);
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace fusebox
