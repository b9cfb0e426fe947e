// ParallelCopy, GatherPieces: see parallel_copy.h.
#include "kernels/cpu/parallel_copy.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

namespace fusebox {
namespace {

// One thread's share of a copy: n bytes from byte `offset` of pieces[piece] on, to dst.
struct Part {
  size_t piece = 0, offset = 0;
  uint8_t* dst = nullptr;
  size_t n = 0;
};

// One split copy. The caller and the helpers it asked for claim parts through `next`; the last
// part to finish wakes the caller. Queued helpers hold it by shared_ptr, so a helper that gets
// to it after the caller has returned finds nothing left to claim and lets it go.
struct Job {
  const HostPiece* pieces = nullptr;
  Part parts[kMaxCopyThreads];
  int count = 0;
  std::atomic<int> next{0};
  std::atomic<int> left{0};
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
};

void CopyPart(const HostPiece* pieces, const Part& part) {
  size_t p = part.piece, off = part.offset, n = part.n;
  uint8_t* dst = part.dst;
  while (n > 0) {
    const size_t k = std::min(n, pieces[p].bytes - off);
    if (k > 0) std::memcpy(dst, static_cast<const uint8_t*>(pieces[p].data) + off, k);
    dst += k;
    n -= k;
    ++p;
    off = 0;
  }
}

void RunParts(Job& job) {
  for (int i; (i = job.next.fetch_add(1, std::memory_order_relaxed)) < job.count;) {
    CopyPart(job.pieces, job.parts[i]);
    if (job.left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(job.mu);
      job.done = true;
      job.cv.notify_one();
    }
  }
}

// The helpers, shared by every copy in the process (the CUDA module has its own copy of this
// library, so its own pool). Grows to the most helpers one copy has asked for; never shrinks.
// Leaked on purpose: its threads run until the process ends, and nothing joins them at exit.
class CopyPool {
 public:
  static CopyPool& Get() {
    static CopyPool* pool = new CopyPool();
    return *pool;
  }

  void Post(const std::shared_ptr<Job>& job, int helpers) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      try {
        while (threads_ < helpers) {
          std::thread([this] { Loop(); }).detach();
          ++threads_;
        }
      } catch (const std::system_error&) {
        // No thread to be had (a limit on threads): the caller copies the parts no helper takes.
        helpers = threads_;
      }
      for (int i = 0; i < helpers; ++i) queue_.push_back(job);
    }
    if (helpers == 0) return;
    if (helpers == 1) {
      cv_.notify_one();
    } else {
      cv_.notify_all();
    }
  }

 private:
  void Loop() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      RunParts(*job);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  int threads_ = 0;
};

// Moves (*p, *off) k bytes on, past pieces that end there (and empty ones), so that it names a
// byte that exists or the end. False when the pieces end first.
bool Advance(const HostPiece* pieces, size_t count, size_t* p, size_t* off, size_t k) {
  for (;;) {
    while (*p < count && *off >= pieces[*p].bytes) {
      ++*p;
      *off = 0;
    }
    if (k == 0) return true;
    if (*p == count) return false;
    const size_t take = std::min(k, pieces[*p].bytes - *off);
    *off += take;
    k -= take;
  }
}

bool Gather(const HostPiece* pieces, size_t count, PiecePos* pos, void* dst, size_t n,
            int threads) {
  const int parts =
      static_cast<int>(std::min<size_t>(CopyThreads(threads), n / kCopyPartBytes));
  if (parts <= 1) {
    Part part{pos->piece, pos->offset, static_cast<uint8_t*>(dst), n};
    if (!Advance(pieces, count, &pos->piece, &pos->offset, n)) {
      *pos = PiecePos{part.piece, part.offset};
      return false;
    }
    CopyPart(pieces, part);
    return true;
  }
  // Equal parts, each a multiple of 64 bytes (whole cache lines of dst) but the last.
  auto job = std::make_shared<Job>();
  job->pieces = pieces;
  job->count = parts;
  job->left.store(parts, std::memory_order_relaxed);
  const size_t each = (n / parts) & ~size_t{63};
  size_t p = pos->piece, off = pos->offset;
  for (int i = 0; i < parts; ++i) {
    const size_t len = i + 1 < parts ? each : n - each * (parts - 1);
    if (!Advance(pieces, count, &p, &off, 0)) return false;  // cannot fail: k = 0
    job->parts[i] = Part{p, off, static_cast<uint8_t*>(dst) + each * i, len};
    if (!Advance(pieces, count, &p, &off, len)) return false;
  }
  *pos = PiecePos{p, off};
  CopyPool::Get().Post(job, parts - 1);
  RunParts(*job);
  std::unique_lock<std::mutex> lock(job->mu);
  job->cv.wait(lock, [&] { return job->done; });
  return true;
}

}  // namespace

int CopyThreads(int threads) {
  if (threads > 0) return std::min(threads, kMaxCopyThreads);
  const int half = static_cast<int>(std::thread::hardware_concurrency() / 2);
  return std::clamp(half, 1, 4);
}

void ParallelCopy(void* dst, const void* src, size_t n, int threads) {
  const HostPiece whole{src, n};
  PiecePos pos;
  Gather(&whole, 1, &pos, dst, n, threads);
}

bool GatherPieces(const HostPieces& pieces, PiecePos* pos, void* dst, size_t n, int threads) {
  return Gather(pieces.data(), pieces.size(), pos, dst, n, threads);
}

bool GatherPieces(const HostPieces& pieces, size_t offset, void* dst, size_t n, int threads) {
  PiecePos pos;
  return SeekPieces(pieces, offset, &pos) && Gather(pieces.data(), pieces.size(), &pos, dst, n, threads);
}

bool SeekPieces(const HostPieces& pieces, size_t offset, PiecePos* pos) {
  *pos = PiecePos{};
  return Advance(pieces.data(), pieces.size(), &pos->piece, &pos->offset, offset);
}

}  // namespace fusebox
