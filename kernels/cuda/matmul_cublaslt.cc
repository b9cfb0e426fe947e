// Matmul+ReLU through cuBLASLt (see matmul.h for the contract).
//
// Row-major out[M,N] = A[M,K] B[K,N] is, read column-major, out^T[N,M] =
// B^T[N,K] A^T[K,M]: cuBLASLt gets (m', n', k') = (N, M, K) with B as its
// "A" (N x K, ld N) and A as its "B" (K x M, ld K), no transposes, and the
// epilogue's bias vector (length = rows of D = N) lands on our columns.
//
// Cost per call: descriptors live on the stack (the *Init forms, no heap);
// the heuristic runs once per (shape, dtype, bias, tf32, alignments, workspace
// size) and is cached; then one cublasLtMatmul launch. Optionally (Create's autotune),
// problems of >= 8 GFLOP are tuned once: the heuristic's first 8 candidates
// are timed on the first call's data and the fastest is cached. The workspace
// (kDefaultWorkspaceBytes unless Create is given another size) is allocated
// once per runner. K = 0 is handed to the tiled kernel (relu(bias)),
// which cuBLASLt does not do.
#include <cublasLt.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/matmul.h"

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
  bool operator==(const AlgoKey& o) const {
    return m == o.m && n == o.n && k == o.k && dtype == o.dtype && bias == o.bias &&
           tf32 == o.tf32 && align_a == o.align_a && align_b == o.align_b &&
           align_c == o.align_c && align_bias == o.align_bias && workspace == o.workspace;
  }
};

struct AlgoKeyHash {
  size_t operator()(const AlgoKey& k) const {
    size_t h = std::hash<int64_t>()(k.m);
    auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    mix(k.n); mix(k.k); mix(k.dtype); mix(k.bias); mix(k.tf32);
    mix(k.align_a); mix(k.align_b); mix(k.align_c); mix(k.align_bias); mix(k.workspace);
    return h;
  }
};

}  // namespace

class MatmulAlgoCache {
 public:
  static constexpr size_t kMaxEntries = 4096;

  struct Entry {
    cublasLtMatmulAlgo_t algo;
    bool tuned;  // chosen by timing the heuristic's candidates, not just its first pick
    size_t workspace_needed;  // what the algorithm uses of the runner's workspace
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

struct CublasLtMatmul::Impl {
  std::shared_ptr<MatmulAlgoCache> cache;
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaEvent_t tune_start = nullptr, tune_end = nullptr;
  bool autotune = true;

  ~Impl() {
    if (tune_start) cudaEventDestroy(tune_start);
    if (tune_end) cudaEventDestroy(tune_end);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (handle) cublasLtDestroy(handle);
    if (workspace) cudaFree(workspace);
  }
};

CublasLtMatmul::CublasLtMatmul(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CublasLtMatmul::~CublasLtMatmul() = default;

absl::StatusOr<std::unique_ptr<CublasLtMatmul>> CublasLtMatmul::Create(
    std::shared_ptr<MatmulAlgoCache> cache, size_t workspace_bytes, bool autotune) {
  auto impl = std::make_unique<Impl>();
  impl->autotune = autotune;
  impl->cache = cache ? std::move(cache) : NewMatmulAlgoCache();
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
  if (absl::Status s = CudaStatus(cudaEventCreate(&impl->tune_start), "cudaEventCreate"); !s.ok()) {
    return s;
  }
  if (absl::Status s = CudaStatus(cudaEventCreate(&impl->tune_end), "cudaEventCreate"); !s.ok()) {
    return s;
  }
  FUSEBOX_LT(cublasLtMatmulPreferenceSetAttribute(impl->pref,
                                                  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &impl->workspace_bytes,
                                                  sizeof(impl->workspace_bytes)),
             "workspace preference");
  return std::unique_ptr<CublasLtMatmul>(new CublasLtMatmul(std::move(impl)));
}

// Descriptors (on the stack: the *Init forms allocate nothing), the algorithm,
// and whether it was chosen by timing.
struct CublasLtMatmul::Plan {
  cublasLtMatmulDescOpaque_t desc;
  cublasLtMatrixLayoutOpaque_t la, lb, lc;
  AlgoKey key;
  cublasLtMatmulAlgo_t algo;
  bool tuned = false;
  size_t workspace_needed = 0;
};

namespace {
// Problems of at least this many flops (2 x 2048^3 / 2) get their algorithm
// by timing the heuristic's candidates once; smaller ones take its first pick.
constexpr double kTuneFlops = 8e9;
constexpr int kTuneCandidates = 8;
constexpr int kTuneReps = 2;
}  // namespace

absl::Status CublasLtMatmul::MakePlan(const MatmulArgs& args, Plan* plan) {
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
                      args.bias ? Alignment(args.bias) : 256u, impl_->workspace_bytes};
  MatmulAlgoCache::Entry entry;
  if (impl_->cache->Find(plan->key, &entry)) {
    plan->algo = entry.algo;
    plan->tuned = entry.tuned;
    plan->workspace_needed = entry.workspace_needed;
    return absl::OkStatus();
  }
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  if (absl::Status s = Heuristic(plan, 1, &result, &found); !s.ok()) return s;
  plan->algo = result.algo;
  plan->tuned = 2.0 * args.m * args.n * args.k < kTuneFlops;  // small: nothing to tune
  plan->workspace_needed = result.workspaceSize;
  impl_->cache->Put(plan->key, {plan->algo, plan->tuned, plan->workspace_needed});
  return absl::OkStatus();
}

absl::Status CublasLtMatmul::Heuristic(Plan* plan, int want,
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
  std::memset(results, 0, sizeof(*results) * want);
  *found = 0;
  FUSEBOX_LT(cublasLtMatmulAlgoGetHeuristic(impl_->handle, &plan->desc, &plan->la, &plan->lb,
                                            &plan->lc, &plan->lc, impl_->pref, want, results,
                                            found),
             "heuristic");
  if (*found == 0 || results[0].state != CUBLAS_STATUS_SUCCESS) {
    return absl::UnimplementedError(absl::StrCat(
        "cuBLASLt has no algorithm for matmul ", key.m, "x", key.n, "x", key.k, " ",
        DTypeName(static_cast<DType>(key.dtype)), key.bias ? " with bias" : ""));
  }
  return absl::OkStatus();
}

absl::Status CublasLtMatmul::Launch(const MatmulArgs& args, Plan& plan,
                                    const cublasLtMatmulAlgo_t& algo, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  FUSEBOX_LT(cublasLtMatmul(impl_->handle, &plan.desc, &alpha, args.b, &plan.la, args.a, &plan.lb,
                            &beta, args.out, &plan.lc, args.out, &plan.lc, &algo,
                            impl_->workspace, impl_->workspace_bytes, stream),
             "matmul");
  return absl::OkStatus();
}

// Times each of the heuristic's first candidates on the caller's data (one
// warm-up, kTuneReps timed runs) and caches the fastest. Once per shape and
// device; blocks this thread on the stream meanwhile. The output is
// overwritten by every candidate and then by the real launch.
absl::Status CublasLtMatmul::Tune(const MatmulArgs& args, Plan* plan, cudaStream_t stream) {
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates];
  int found = 0;
  if (absl::Status s = Heuristic(plan, kTuneCandidates, results, &found); !s.ok()) return s;
  float best_ms = -1;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    if (!Launch(args, *plan, results[i].algo, stream).ok()) continue;  // candidate refused
    cudaEventRecord(impl_->tune_start, stream);
    bool ok = true;
    for (int r = 0; r < kTuneReps && ok; ++r) ok = Launch(args, *plan, results[i].algo, stream).ok();
    cudaEventRecord(impl_->tune_end, stream);
    if (absl::Status s = CudaStatus(cudaEventSynchronize(impl_->tune_end), "autotune"); !s.ok()) {
      return s;
    }
    float ms = 0;
    if (!ok || cudaEventElapsedTime(&ms, impl_->tune_start, impl_->tune_end) != cudaSuccess) continue;
    if (best_ms < 0 || ms < best_ms) {
      best_ms = ms;
      plan->algo = results[i].algo;
      plan->workspace_needed = results[i].workspaceSize;
    }
  }
  plan->tuned = true;
  impl_->cache->Put(plan->key, {plan->algo, true, plan->workspace_needed});
  return absl::OkStatus();
}

absl::Status CublasLtMatmul::Prepare(const MatmulArgs& args) {
  if (absl::Status s = ValidateMatmul(args); !s.ok()) return s;
  if (args.m == 0 || args.n == 0 || args.k == 0) return absl::OkStatus();
  Plan plan;
  return MakePlan(args, &plan);
}

size_t CublasLtMatmul::workspace_bytes() const { return impl_->workspace_bytes; }

absl::StatusOr<std::string> CublasLtMatmul::DescribeAlgo(const MatmulArgs& args) {
  if (absl::Status s = ValidateMatmul(args); !s.ok()) return s;
  if (args.m == 0 || args.n == 0 || args.k == 0) return std::string("none (empty or K=0: tiled)");
  Plan plan;
  if (absl::Status s = MakePlan(args, &plan); !s.ok()) return s;
  const cublasLtMatmulAlgo_t& algo = plan.algo;
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
  // FNV-1a over the opaque algorithm: equal hashes mean the same configuration.
  uint64_t h = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(&algo);
  for (size_t i = 0; i < sizeof algo; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "algo %lld tile %lld stages %lld splitk %lld reduction %lld swizzle %lld "
                "custom %lld inner %lld cluster %lld ws_needed %zu hash %016" PRIx64 "%s",
                get(CUBLASLT_ALGO_CONFIG_ID), get(CUBLASLT_ALGO_CONFIG_TILE_ID),
                get(CUBLASLT_ALGO_CONFIG_STAGES_ID), get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION), get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
                get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), plan.workspace_needed, h,
                plan.tuned && impl_->autotune ? " (timed)" : "");
  return std::string(buf);
}

absl::Status CublasLtMatmul::Run(const MatmulArgs& args, cudaStream_t stream) {
  if (absl::Status s = ValidateMatmul(args); !s.ok()) return s;
  if (args.m == 0 || args.n == 0) return absl::OkStatus();
  if (args.k == 0) return CudaStatus(LaunchMatmulReluTiled(args, stream), "tiled matmul (K=0)");
  Plan plan;
  if (absl::Status s = MakePlan(args, &plan); !s.ok()) return s;
  if (!plan.tuned && impl_->autotune) {
    if (absl::Status s = Tune(args, &plan, stream); !s.ok()) return s;
  }
  return Launch(args, plan, plan.algo, stream);
}

}  // namespace fusebox::cuda
