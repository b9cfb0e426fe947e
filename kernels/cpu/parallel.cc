// The CPU kernels' thread pool (see parallel.h). Persistent workers sleep on a
// condition variable; a ParallelFor publishes one job (fn, n, chunk), wakes them,
// takes chunks itself from a shared atomic counter, then waits for every worker
// to check in. Chunks are dynamic (about 4 per thread) so a core that another
// process steals does not hold up the whole call.
#include "kernels/cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

// OpenBLAS's thread setter, when the BLAS linked in is OpenBLAS (weak: absent
// from other BLAS libraries, then it stays null).
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace fusebox::cpu {
namespace {

using Fn = absl::FunctionRef<void(int64_t, int64_t)>;

class Pool {
 public:
  explicit Pool(int threads) : threads_(threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int threads() const { return threads_; }

  // Runs the job on the pool; false (nothing run) when the pool is busy.
  bool TryRun(int64_t n, int64_t chunk, Fn fn) {
    bool expected = false;
    if (workers_.empty() || !busy_.compare_exchange_strong(expected, true)) return false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      n_ = n;
      chunk_ = chunk;
      next_.store(0, std::memory_order_relaxed);
      pending_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    RunChunks(fn, n, chunk);
    {
      std::unique_lock<std::mutex> lk(mu_);
      done_.wait(lk, [this] { return pending_ == 0; });
      fn_ = nullptr;
    }
    busy_.store(false);
    return true;
  }

 private:
  void RunChunks(Fn fn, int64_t n, int64_t chunk) {
    for (;;) {
      const int64_t b = next_.fetch_add(chunk, std::memory_order_relaxed);
      if (b >= n) return;
      fn(b, std::min(n, b + chunk));
    }
  }

  void WorkerLoop() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const Fn fn = *fn_;
      const int64_t n = n_, chunk = chunk_;
      lk.unlock();
      RunChunks(fn, n, chunk);
      lk.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  const int threads_;
  std::atomic<bool> busy_{false};
  std::mutex mu_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  const Fn* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 0;
  std::atomic<int64_t> next_{0};
  std::vector<std::thread> workers_;
};

int DefaultThreads() {
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

std::mutex g_pool_mu;
std::shared_ptr<Pool>* g_pool = nullptr;  // leaked on purpose: no exit-time join

std::shared_ptr<Pool> GetPool() {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (g_pool == nullptr) g_pool = new std::shared_ptr<Pool>(std::make_shared<Pool>(DefaultThreads()));
  return *g_pool;
}

}  // namespace

void SetCpuThreads(int n) {
  if (n <= 0) n = DefaultThreads();
  std::shared_ptr<Pool> old;
  {
    std::lock_guard<std::mutex> lk(g_pool_mu);
    if (g_pool == nullptr) g_pool = new std::shared_ptr<Pool>();
    old = std::move(*g_pool);
    *g_pool = std::make_shared<Pool>(n);
  }
  // `old` is destroyed here or by the last ParallelFor still using it; either
  // joins its workers after their current job.
  old.reset();
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(n);
}

int CpuThreads() { return GetPool()->threads(); }

void ParallelFor(int64_t n, int64_t grain, Fn fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (n <= grain) {
    fn(0, n);
    return;
  }
  const std::shared_ptr<Pool> pool = GetPool();
  const int64_t threads = pool->threads();
  // About four chunks per thread, none below the grain.
  const int64_t chunk = std::max(grain, (n + 4 * threads - 1) / (4 * threads));
  if (threads <= 1 || chunk >= n || !pool->TryRun(n, chunk, fn)) fn(0, n);
}

}  // namespace fusebox::cpu
