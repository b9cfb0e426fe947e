// Matmul+ReLU through cuBLASLt (see matmul.h for the contract).
//
// Row-major out[M,N] = A[M,K] B[K,N] is, read column-major, out^T[N,M] =
// B^T[N,K] A^T[K,M]: cuBLASLt gets (m', n', k') = (N, M, K) with B as its
// "A" (N x K, ld N) and A as its "B" (K x M, ld K), no transposes, and the
// epilogue's bias vector (length = rows of D = N) lands on our columns.
//
// Cost per call: descriptors live on the stack (the *Init forms, no heap);
// the algorithm is chosen once per key (shape, dtype, bias, tf32, alignments,
// workspace size, policy) and cached; then one cublasLtMatmul launch. The
// default policy (two picks) asks the heuristic twice on a miss (32 MiB and
// 1 MiB preference) and, only where the answers differ, times both: 2 warm-ups
// + 6 launches, each after a 64 MiB L2-flushing read, + one wait, once per
// key and device, i.e. ~8x the kernel's time
// (tf32 64x4096x4096: ~0.3 ms; fp32 exact 4096^3: ~20 ms; 8192^3: ~0.2 s).
// Optionally (kAutotune), problems of >= 8 GFLOP time the
// heuristic's first 8 candidates instead. The workspace (kDefaultWorkspaceBytes
// unless Create is given another size) is allocated once per runner. K = 0 is
// handed to the tiled kernel (relu(bias)), which cuBLASLt does not do.
#include <cublasLt.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_tuning.h"

namespace fusebox::cuda {
namespace {

absl::Status CublasStatus(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string msg =
      absl::StrCat("cuBLASLt ", what, ": ", cublasLtGetStatusName(st), " (",
                   cublasLtGetStatusString(st), ")");
  switch (st) {
    case CUBLAS_STATUS_ALLOC_FAILED: return absl::ResourceExhaustedError(msg);
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH: return absl::UnimplementedError(msg);
    case CUBLAS_STATUS_INVALID_VALUE: return absl::InvalidArgumentError(msg);
    default: return absl::InternalError(msg);
  }
}

#define FUSEBOX_LT(call, what)                                      \
  do {                                                              \
    if (absl::Status s_ = CublasStatus((call), what); !s_.ok()) return s_; \
  } while (0)

// Largest power of two (<= 256) dividing the address: what cuBLASLt's
// heuristic needs to know, and part of the cache key.
uint32_t Alignment(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && (v % a) != 0) a >>= 1;
  return a;
}

cudaDataType DataType(DType d) {
  switch (d) {
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

struct AlgoKey {
  int64_t m, n, k;
  int dtype;
  bool bias, tf32;
  uint32_t align_a, align_b, align_c, align_bias;
  // The workspace the runner offers: the heuristic only returns algorithms
  // that fit, so runners with different sizes must not share an entry.
  uint64_t workspace;
  // LtAlgoPolicy: runners with different policies never see each other's
  // choices (an autotuned entry is not a two-pick entry and vice versa).
  int policy;
  bool operator==(const AlgoKey& o) const {
    return m == o.m && n == o.n && k == o.k && dtype == o.dtype && bias == o.bias &&
           tf32 == o.tf32 && align_a == o.align_a && align_b == o.align_b &&
           align_c == o.align_c && align_bias == o.align_bias && workspace == o.workspace &&
           policy == o.policy;
  }
};

struct AlgoKeyHash {
  size_t operator()(const AlgoKey& k) const {
    size_t h = std::hash<int64_t>()(k.m);
    auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    mix(k.n); mix(k.k); mix(k.dtype); mix(k.bias); mix(k.tf32);
    mix(k.align_a); mix(k.align_b); mix(k.align_c); mix(k.align_bias); mix(k.workspace);
    mix(static_cast<uint64_t>(k.policy));
    return h;
  }
};

}  // namespace

class MatmulAlgoCache {
 public:
  static constexpr size_t kMaxEntries = 4096;

  struct Entry {
    cublasLtMatmulAlgo_t algo;
    LtAlgoChoice choice;
    size_t workspace_needed;  // what the algorithm uses of the runner's workspace
    size_t launch_workspace;  // the workspace size given to cublasLtMatmul (<= the runner's)
    uint64_t large_hash, small_hash;  // two picks: both heuristic answers (0: not asked)
    float large_ms, small_ms;         // two picks, timed: their medians
  };
  bool Find(const AlgoKey& key, Entry* e) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    *e = it->second;
    return true;
  }
  void Put(const AlgoKey& key, const Entry& e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.size() >= kMaxEntries) map_.clear();
    map_[key] = e;
  }

 private:
  std::mutex mu_;
  std::unordered_map<AlgoKey, Entry, AlgoKeyHash> map_;
};

std::shared_ptr<MatmulAlgoCache> NewMatmulAlgoCache() {
  return std::make_shared<MatmulAlgoCache>();
}

absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string msg =
      absl::StrCat("CUDA ", what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

absl::Status ValidateMatmul(const MatmulArgs& a) {
  constexpr int64_t kMax = int64_t{1} << 31;
  if (a.m < 0 || a.n < 0 || a.k < 0 || a.m >= kMax || a.n >= kMax || a.k >= kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul shape ", a.m, "x", a.n, "x", a.k, " out of range [0, 2^31)"));
  }
  if (a.m > 0 && a.n > 0 && a.out == nullptr) return absl::InvalidArgumentError("matmul: null output");
  if (a.m > 0 && a.n > 0 && a.k > 0 && (a.a == nullptr || a.b == nullptr)) {
    return absl::InvalidArgumentError("matmul: null input");
  }
  return absl::OkStatus();
}

namespace {
// kAutotune: problems of at least this many flops (2 x 2048^3 / 2) time the
// heuristic's first candidates once; smaller ones get the two picks.
constexpr double kTuneFlops = 8e9;
constexpr int kTuneCandidates = 8;
constexpr int kTuneReps = 2;
// Two picks: timed rounds (each times the large pick, then the small one) and
// the margin the small-workspace pick must win by to replace the large one.
constexpr int kPickRounds = 3;
constexpr float kSmallPickMinGain = 0.02f;
// Events: a start and an end around each of the 2 x kPickRounds timed launches of
// the two picks; autotune uses 2.
constexpr int kNumEvents = 4 * kPickRounds;
// Two picks: bytes read before each timed launch to push the operands out of
// L2 (50 MB on the H100 / H200), so that the picks are compared as the
// benchmarks compare them: on operands read from HBM (measured: on
// 64x4096x4096 TF32 a warm-L2 timing kept the pick that is 4% slower cold).
// Read, not written: a memset leaves up to 50 MB of dirty lines that the timed
// launch then writes back (measured: that made the 1 MiB pick "win" on
// 64x4096x4096 TF32 without bias, though 8% slower in the benchmark). The read
// is FlushL2, into a small tail of the same buffer.
constexpr size_t kPickFlushBytes = size_t{64} << 20;

// FNV-1a over the opaque algorithm: equal hashes mean the same configuration.
uint64_t AlgoHash(const cublasLtMatmulAlgo_t& algo) {
  uint64_t h = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(&algo);
  for (size_t i = 0; i < sizeof algo; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

bool SameAlgo(const cublasLtMatmulAlgo_t& x, const cublasLtMatmulAlgo_t& y) {
  return std::memcmp(&x, &y, sizeof x) == 0;
}

float Median3(float a, float b, float c) {
  return std::max(std::min(a, b), std::min(std::max(a, b), c));
}
}  // namespace

const char* LtAlgoChoiceName(LtAlgoChoice c) {
  switch (c) {
    case LtAlgoChoice::kFirstPick: return "first-pick";
    case LtAlgoChoice::kPicksAgree: return "picks-agree";
    case LtAlgoChoice::kNoSecondPick: return "no-small-pick";
    case LtAlgoChoice::kTimedLargeKept: return "timed:large-kept";
    case LtAlgoChoice::kTimedSmallWon: return "timed:small-won";
    case LtAlgoChoice::kTimingFailed: return "timing-failed:large";
    case LtAlgoChoice::kAutotuned: return "autotuned";
  }
  return "?";
}

struct CublasLtMatmul::Impl {
  std::shared_ptr<MatmulAlgoCache> cache;
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaEvent_t events[kNumEvents] = {};
  LtAlgoPolicy policy = LtAlgoPolicy::kTwoPicks;
  cudaMemPool_t scratch_pool = nullptr;  // TimePicks' flush buffer; null: the default pool
  LtStats stats;
  // The runner's latest choice, its own copy: a Run right after its Prepare finds it even
  // if the shared cache was cleared in between by another runner's Put.
  bool has_last = false;
  AlgoKey last_key{};
  MatmulAlgoCache::Entry last_entry{};

  ~Impl() {
    for (cudaEvent_t ev : events) {
      if (ev) cudaEventDestroy(ev);
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (handle) cublasLtDestroy(handle);
    if (workspace) cudaFree(workspace);
  }
};

CublasLtMatmul::CublasLtMatmul(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CublasLtMatmul::~CublasLtMatmul() = default;

absl::StatusOr<std::unique_ptr<CublasLtMatmul>> CublasLtMatmul::Create(
    std::shared_ptr<MatmulAlgoCache> cache, size_t workspace_bytes, LtAlgoPolicy policy,
    cudaMemPool_t scratch_pool) {
  auto impl = std::make_unique<Impl>();
  impl->policy = policy;
  impl->scratch_pool = scratch_pool;
  impl->cache = cache ? std::move(cache) : NewMatmulAlgoCache();
  // cublasLtCreate queries the device through the driver API (cuCtxGetLimit),
  // which needs a current context. On a thread that has not made a runtime
  // call yet none is current (the runtime binds its primary context lazily),
  // so the query fails inside cuBLASLt -- harmlessly, but compute-sanitizer
  // reports it as CUDA_ERROR_INVALID_CONTEXT (for instance, a runner created
  // on a fresh std::thread). cudaFree(nullptr) frees nothing and makes the current
  // device's primary context current on this thread.
  if (absl::Status s = CudaStatus(cudaFree(nullptr), "context init (cudaFree(nullptr))"); !s.ok()) {
    cudaGetLastError();
    return s;
  }
  FUSEBOX_LT(cublasLtCreate(&impl->handle), "create");
  FUSEBOX_LT(cublasLtMatmulPreferenceCreate(&impl->pref), "preference create");
  if (workspace_bytes > 0) {
    if (absl::Status s = CudaStatus(cudaMalloc(&impl->workspace, workspace_bytes),
                                    "cudaMalloc(cuBLASLt workspace)");
        !s.ok()) {
      cudaGetLastError();
      return s;
    }
  }
  impl->workspace_bytes = workspace_bytes;
  for (cudaEvent_t& ev : impl->events) {
    if (absl::Status s = CudaStatus(cudaEventCreate(&ev), "cudaEventCreate"); !s.ok()) return s;
  }
  return std::unique_ptr<CublasLtMatmul>(new CublasLtMatmul(std::move(impl)));
}

// Descriptors (on the stack: the *Init forms allocate nothing), the key, and
// the chosen entry.
struct CublasLtMatmul::Plan {
  cublasLtMatmulDescOpaque_t desc;
  cublasLtMatrixLayoutOpaque_t la, lb, lc;
  AlgoKey key;
  MatmulAlgoCache::Entry entry;
  bool cached = true;  // false: a choice made for one call only (inside a graph capture)
};

absl::Status CublasLtMatmul::MakePlan(const MatmulArgs& args, cudaStream_t stream, Plan* plan) {
  const cudaDataType type = DataType(args.dtype);
  const cublasComputeType_t compute = (args.dtype == DType::kFloat32 && args.allow_tf32)
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t desc = &plan->desc;
  FUSEBOX_LT(cublasLtMatmulDescInit(desc, compute, CUDA_R_32F), "matmul desc");
  const cublasLtEpilogue_t epi = args.bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  FUSEBOX_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
             "epilogue");
  if (args.bias) {
    // The bias has the output's type: cuBLASLt's default (BIAS_DATA_TYPE -1), left unset as
    // PyTorch leaves it.
    FUSEBOX_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &args.bias,
                                              sizeof args.bias),
               "bias pointer");
  }
  // Column-major view: D (N x M, ld N) = Bcm (N x K, ld N) * Acm (K x M, ld K).
  FUSEBOX_LT(cublasLtMatrixLayoutInit(&plan->la, type, args.n, args.k, args.n), "layout B");
  FUSEBOX_LT(cublasLtMatrixLayoutInit(&plan->lb, type, args.k, args.m, args.k), "layout A");
  FUSEBOX_LT(cublasLtMatrixLayoutInit(&plan->lc, type, args.n, args.m, args.n), "layout C");

  plan->key = AlgoKey{args.m, args.n, args.k, static_cast<int>(args.dtype), args.bias != nullptr,
                      compute == CUBLAS_COMPUTE_32F_FAST_TF32, Alignment(args.a),
                      Alignment(args.b), Alignment(args.out),
                      args.bias ? Alignment(args.bias) : 256u, impl_->workspace_bytes,
                      static_cast<int>(impl_->policy)};
  const bool mine = impl_->has_last && impl_->last_key == plan->key;
  if (mine) plan->entry = impl_->last_entry;
  if (mine || impl_->cache->Find(plan->key, &plan->entry)) {
    ++impl_->stats.cache_hits;
  } else {
    ++impl_->stats.cache_misses;
    if (absl::Status s = Choose(args, stream, plan); !s.ok()) return s;
  }
  // A choice that was not cached is not kept either: the next call chooses properly.
  impl_->has_last = plan->cached;
  impl_->last_key = plan->key;
  impl_->last_entry = plan->entry;
  return absl::OkStatus();
}

// The cache missed: choose by the runner's policy and cache the choice.
absl::Status CublasLtMatmul::Choose(const MatmulArgs& args, cudaStream_t stream, Plan* plan) {
  const LtAlgoPolicy policy = impl_->policy;
  if (policy == LtAlgoPolicy::kAutotune && 2.0 * args.m * args.n * args.k >= kTuneFlops) {
    return Tune(args, plan, stream);  // autotune replaces the two picks where it applies
  }
  const size_t large_ws = impl_->workspace_bytes;
  cublasLtMatmulHeuristicResult_t large;
  int found = 0;
  if (absl::Status s = Heuristic(plan, large_ws, 1, &large, &found); !s.ok()) return s;
  MatmulAlgoCache::Entry& e = plan->entry;
  e = MatmulAlgoCache::Entry{large.algo, LtAlgoChoice::kFirstPick, large.workspaceSize, large_ws,
                             0, 0, 0.f, 0.f};
  if (policy != LtAlgoPolicy::kFirstPick) {
    e.large_hash = AlgoHash(large.algo);
    const size_t small_ws = std::min(kSecondPickWorkspaceBytes, large_ws);
    cublasLtMatmulHeuristicResult_t small;
    if (small_ws == large_ws) {
      e.choice = LtAlgoChoice::kPicksAgree;  // one preference: one pick
      e.small_hash = e.large_hash;
    } else if (!Heuristic(plan, small_ws, 1, &small, &found).ok()) {
      e.choice = LtAlgoChoice::kNoSecondPick;  // nothing fits the small workspace
    } else if (SameAlgo(small.algo, large.algo)) {
      e.choice = LtAlgoChoice::kPicksAgree;  // e.g. fp16/bf16 on the H200: untimed, as kFirstPick
      e.small_hash = e.large_hash;
    } else {
      e.small_hash = AlgoHash(small.algo);
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
          capture != cudaStreamCaptureStatusNone) {
        // Cannot time inside a graph capture (no waiting on events there):
        // this call takes the large pick, and nothing is cached, so the first
        // uncaptured call times the two.
        cudaGetLastError();
        e.choice = LtAlgoChoice::kTimingFailed;
        plan->cached = false;
        return absl::OkStatus();
      }
      ++impl_->stats.timed_selections;
      float large_ms = 0, small_ms = 0;
      if (!TimePicks(args, *plan, large.algo, large_ws, small.algo, small_ws, stream, &large_ms,
                     &small_ms)) {
        ++impl_->stats.timing_failures;
        e.choice = LtAlgoChoice::kTimingFailed;
      } else {
        e.large_ms = large_ms;
        e.small_ms = small_ms;
        if (small_ms <= (1.0f - kSmallPickMinGain) * large_ms) {
          e.algo = small.algo;
          e.workspace_needed = small.workspaceSize;
          e.launch_workspace = small_ws;  // as PyTorch launches it
          e.choice = LtAlgoChoice::kTimedSmallWon;
        } else {
          e.choice = LtAlgoChoice::kTimedLargeKept;
        }
      }
    }
  }
  impl_->cache->Put(plan->key, e);
  return absl::OkStatus();
}

absl::Status CublasLtMatmul::Heuristic(Plan* plan, size_t workspace, int want,
                                       cublasLtMatmulHeuristicResult_t* results, int* found) {
  // cuBLASLt's "A" is the user's B and its "B" the user's A.
  const AlgoKey& key = plan->key;
  const uint32_t aligns[4] = {key.align_b, key.align_a, key.align_c, key.align_c};
  const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    FUSEBOX_LT(cublasLtMatmulPreferenceSetAttribute(impl_->pref, attrs[i], &aligns[i],
                                                    sizeof aligns[i]),
               "alignment preference");
  }
  const uint64_t ws = workspace;
  FUSEBOX_LT(cublasLtMatmulPreferenceSetAttribute(impl_->pref,
                                                  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                  sizeof ws),
             "workspace preference");
  std::memset(results, 0, sizeof(*results) * want);
  *found = 0;
  ++impl_->stats.heuristic_queries;
  FUSEBOX_LT(cublasLtMatmulAlgoGetHeuristic(impl_->handle, &plan->desc, &plan->la, &plan->lb,
                                            &plan->lc, &plan->lc, impl_->pref, want, results,
                                            found),
             "heuristic");
  if (*found == 0 || results[0].state != CUBLAS_STATUS_SUCCESS) {
    return absl::UnimplementedError(absl::StrCat(
        "cuBLASLt has no algorithm for matmul ", key.m, "x", key.n, "x", key.k, " ",
        DTypeName(static_cast<DType>(key.dtype)), key.bias ? " with bias" : "", " within ",
        workspace, " bytes of workspace"));
  }
  return absl::OkStatus();
}

absl::Status CublasLtMatmul::Launch(const MatmulArgs& args, Plan& plan,
                                    const cublasLtMatmulAlgo_t& algo, size_t workspace,
                                    cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  FUSEBOX_LT(cublasLtMatmul(impl_->handle, &plan.desc, &alpha, args.b, &plan.la, args.a, &plan.lb,
                            &beta, args.out, &plan.lc, args.out, &plan.lc, &algo,
                            impl_->workspace, workspace, stream),
             "matmul");
  return absl::OkStatus();
}

// Times the two picks on the call's buffers and stream: one warm-up each, then
// kPickRounds rounds of (large, small), each launch after a 64 MiB read of a
// scratch buffer (L2 flush; the scratch comes from the runner's scratch pool
// (Create), is zeroed once and goes back after; without it the picks are
// timed on a warm L2) and between its own start and end events; one wait at the end.
// args.out is written by every launch and then again by the real one. Any
// failure: false, and the error it left is cleared (a sticky error would still
// fail the real launch, which reports it).
bool CublasLtMatmul::TimePicks(const MatmulArgs& args, Plan& plan,
                               const cublasLtMatmulAlgo_t& large, size_t large_ws,
                               const cublasLtMatmulAlgo_t& small, size_t small_ws,
                               cudaStream_t stream, float* large_ms, float* small_ms) {
  cudaEvent_t* ev = impl_->events;
  void* scratch = nullptr;
  const size_t scratch_bytes = kPickFlushBytes + kPickFlushBytes / kFlushRowBytes * sizeof(float);
  const cudaError_t got =
      impl_->scratch_pool != nullptr
          ? cudaMallocFromPoolAsync(&scratch, scratch_bytes, impl_->scratch_pool, stream)
          : cudaMallocAsync(&scratch, scratch_bytes, stream);
  if (got != cudaSuccess ||
      cudaMemsetAsync(scratch, 0, scratch_bytes, stream) != cudaSuccess) {
    cudaGetLastError();
    if (scratch != nullptr) cudaFreeAsync(scratch, stream);
    scratch = nullptr;
  }
  float* sums = scratch ? reinterpret_cast<float*>(static_cast<char*>(scratch) + kPickFlushBytes) : nullptr;
  auto flush = [&] {
    return scratch == nullptr || FlushL2(scratch, kPickFlushBytes, sums, stream) == cudaSuccess;
  };
  // Launch i of the timed ones (even: large, odd: small) between ev[2i] and ev[2i + 1].
  auto timed = [&](int i, const cublasLtMatmulAlgo_t& algo, size_t ws) {
    return flush() &&
           cudaEventRecord(ev[2 * i], stream) == cudaSuccess && Launch(args, plan, algo, ws, stream).ok() &&
           cudaEventRecord(ev[2 * i + 1], stream) == cudaSuccess;
  };
  bool ok = Launch(args, plan, large, large_ws, stream).ok() &&
            Launch(args, plan, small, small_ws, stream).ok();
  for (int r = 0; r < kPickRounds && ok; ++r) {
    ok = timed(2 * r, large, large_ws) && timed(2 * r + 1, small, small_ws);
  }
  if (scratch != nullptr) cudaFreeAsync(scratch, stream);
  // Whatever was enqueued, wait for it: the events are reused by the next key.
  if (cudaStreamSynchronize(stream) != cudaSuccess) ok = false;
  float t[2 * kPickRounds] = {};
  for (int i = 0; i < 2 * kPickRounds && ok; ++i) {
    ok = cudaEventElapsedTime(&t[i], ev[2 * i], ev[2 * i + 1]) == cudaSuccess;
  }
  if (!ok) {
    cudaGetLastError();
    return false;
  }
  *large_ms = Median3(t[0], t[2], t[4]);
  *small_ms = Median3(t[1], t[3], t[5]);
  return true;
}

// kAutotune: times each of the heuristic's first candidates on the caller's
// data (one warm-up, kTuneReps timed runs) and caches the fastest. Once per
// shape and device; blocks this thread on the stream meanwhile. The output is
// overwritten by every candidate and then by the real launch.
absl::Status CublasLtMatmul::Tune(const MatmulArgs& args, Plan* plan, cudaStream_t stream) {
  const size_t ws = impl_->workspace_bytes;
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates];
  int found = 0;
  if (absl::Status s = Heuristic(plan, ws, kTuneCandidates, results, &found); !s.ok()) return s;
  ++impl_->stats.timed_selections;
  MatmulAlgoCache::Entry& e = plan->entry;
  e = MatmulAlgoCache::Entry{results[0].algo, LtAlgoChoice::kAutotuned, results[0].workspaceSize,
                             ws, 0, 0, 0.f, 0.f};
  cudaEvent_t start = impl_->events[0], end = impl_->events[1];
  float best_ms = -1;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    if (!Launch(args, *plan, results[i].algo, ws, stream).ok()) continue;  // candidate refused
    cudaEventRecord(start, stream);
    bool ok = true;
    for (int r = 0; r < kTuneReps && ok; ++r) {
      ok = Launch(args, *plan, results[i].algo, ws, stream).ok();
    }
    cudaEventRecord(end, stream);
    if (absl::Status s = CudaStatus(cudaEventSynchronize(end), "autotune"); !s.ok()) return s;
    float ms = 0;
    if (!ok || cudaEventElapsedTime(&ms, start, end) != cudaSuccess) continue;
    if (best_ms < 0 || ms < best_ms) {
      best_ms = ms;
      e.algo = results[i].algo;
      e.workspace_needed = results[i].workspaceSize;
    }
  }
  impl_->cache->Put(plan->key, e);
  return absl::OkStatus();
}

absl::Status CublasLtMatmul::Prepare(const MatmulArgs& args, cudaStream_t stream) {
  if (absl::Status s = ValidateMatmul(args); !s.ok()) return s;
  if (args.m == 0 || args.n == 0 || args.k == 0) return absl::OkStatus();
  Plan plan;
  return MakePlan(args, stream, &plan);
}

// matmul_tuning.h's view of a runner: its policy, its counters and its choice for a key.
struct LtRunnerAccess {
  static LtAlgoPolicy Policy(const CublasLtMatmul& lt) { return lt.impl_->policy; }
  static LtStats Stats(const CublasLtMatmul& lt) { return lt.impl_->stats; }
  static absl::StatusOr<LtAlgoInfo> Info(CublasLtMatmul& lt, const MatmulArgs& args,
                                         cudaStream_t stream);
};

absl::StatusOr<LtAlgoInfo> LtRunnerAccess::Info(CublasLtMatmul& lt, const MatmulArgs& args,
                                                cudaStream_t stream) {
  if (absl::Status s = ValidateMatmul(args); !s.ok()) return s;
  LtAlgoInfo info;
  if (args.m == 0 || args.n == 0 || args.k == 0) {
    info.description = "none (empty or K=0: tiled)";
    return info;
  }
  CublasLtMatmul::Plan plan;
  if (absl::Status s = lt.MakePlan(args, stream, &plan); !s.ok()) return s;
  const MatmulAlgoCache::Entry& e = plan.entry;
  const cublasLtMatmulAlgo_t& algo = e.algo;
  info.choice = e.choice;
  info.timed = e.choice == LtAlgoChoice::kTimedLargeKept ||
               e.choice == LtAlgoChoice::kTimedSmallWon || e.choice == LtAlgoChoice::kAutotuned;
  info.hash = AlgoHash(algo);
  info.large_hash = e.large_hash;
  info.small_hash = e.small_hash;
  info.large_ms = e.large_ms;
  info.small_ms = e.small_ms;
  info.workspace_needed = e.workspace_needed;
  info.launch_workspace = e.launch_workspace;
  // Each attribute has its own width in cuBLASLt (int32, uint32, uint16);
  // read into a zeroed 8-byte slot with the exact size cuBLASLt reports.
  auto get = [&algo](cublasLtMatmulAlgoConfigAttributes_t attr) -> long long {
    uint64_t v = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, nullptr, 0, &written) !=
            CUBLAS_STATUS_SUCCESS ||
        written == 0 || written > sizeof v ||
        cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, written, &written) !=
            CUBLAS_STATUS_SUCCESS) {
      return -1;
    }
    if (written == 4) return static_cast<long long>(static_cast<int32_t>(v & 0xffffffffu));
    if (written == 2) return static_cast<long long>(v & 0xffffu);
    return static_cast<long long>(v);
  };
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "algo %lld tile %lld stages %lld splitk %lld reduction %lld swizzle %lld "
                "custom %lld inner %lld cluster %lld ws_needed %zu hash %016" PRIx64
                " choice %s picks %016" PRIx64 "/%016" PRIx64 " timed_ms %.4f/%.4f launch_ws %zu",
                get(CUBLASLT_ALGO_CONFIG_ID), get(CUBLASLT_ALGO_CONFIG_TILE_ID),
                get(CUBLASLT_ALGO_CONFIG_STAGES_ID), get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION), get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
                get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), e.workspace_needed, info.hash,
                LtAlgoChoiceName(e.choice), e.large_hash, e.small_hash,
                static_cast<double>(e.large_ms), static_cast<double>(e.small_ms),
                e.launch_workspace);
  info.description = buf;
  return info;
}

LtAlgoPolicy PolicyOf(const CublasLtMatmul& lt) { return LtRunnerAccess::Policy(lt); }
LtStats StatsOf(const CublasLtMatmul& lt) { return LtRunnerAccess::Stats(lt); }

absl::StatusOr<LtAlgoInfo> AlgoInfoOf(CublasLtMatmul& lt, const MatmulArgs& args,
                                      cudaStream_t stream) {
  return LtRunnerAccess::Info(lt, args, stream);
}

absl::StatusOr<std::string> DescribeAlgo(CublasLtMatmul& lt, const MatmulArgs& args,
                                         cudaStream_t stream) {
  absl::StatusOr<LtAlgoInfo> info = AlgoInfoOf(lt, args, stream);
  if (!info.ok()) return info.status();
  return std::move(info->description);
}

absl::Status CublasLtMatmul::Run(const MatmulArgs& args, cudaStream_t stream) {
  if (absl::Status s = ValidateMatmul(args); !s.ok()) return s;
  if (args.m == 0 || args.n == 0) return absl::OkStatus();
  if (args.k == 0) return CudaStatus(LaunchMatmulReluTiled(args, stream), "tiled matmul (K=0)");
  Plan plan;
  if (absl::Status s = MakePlan(args, stream, &plan); !s.ok()) return s;
  return Launch(args, plan, plan.entry.algo, plan.entry.launch_workspace, stream);
}

}  // namespace fusebox::cuda
