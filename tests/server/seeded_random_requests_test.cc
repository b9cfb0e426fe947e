// A seeded random-request regression loop (not fuzzing: no coverage guidance; the
// libFuzzer harnesses are in tests/fuzz/): random and hostile requests never crash
// the server's request path; each one is either rejected with a canonical
// client-error code or is valid and then runs on the CPU backend to completion.
// Seeded, so a failure reproduces.
#include <gtest/gtest.h>

#include <cstdlib>
#include <future>
#include <random>

#include "server/backends/cpu/cpu_backend.h"
#include "server/core/request.h"
#include "server/core/tensor_store.h"

namespace fusebox {
namespace {

class SeededRandomRequests : public ::testing::Test {
 protected:
  std::mt19937_64 rng_{20261129};
  std::unique_ptr<Backend> backend_ = MakeCpuBackend(CpuBackendOptions{});
  StoreLimits StoreSize() {
    StoreLimits l;
    l.budget_bytes = l.tenant_quota_bytes = l.max_tensor_bytes = 1 << 20;
    return l;
  }
  TensorStore store_{backend_.get(), StoreSize()};

  int64_t Pick(std::initializer_list<int64_t> v) {
    return *(v.begin() + std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng_));
  }
  int64_t Dim() {
    return Pick({0, 1, 2, 3, 7, 16, 33, -1, -7, int64_t{1} << 20, int64_t{1} << 31, INT64_MAX,
                 INT64_MIN});
  }

  // A tensor that is usually almost right: small shapes, sometimes a wrong
  // dtype, a hostile dim, or a byte count off by a little.
  void FillTensor(v1::TensorRef* ref, bool allow_handle) {
    if (allow_handle && rng_() % 8 == 0) {
      ref->set_handle(rng_() % 2 ? "t0" : std::string(rng_() % 300, 'x'));
      return;
    }
    if (rng_() % 16 == 0) return;  // present but empty TensorRef
    v1::Tensor* t = ref->mutable_tensor();
    t->set_dtype(static_cast<v1::DType>(Pick({1, 2, 3, 1, 2, 3, 0, 4, -1, 1000})));
    const int rank = static_cast<int>(rng_() % 4);
    int64_t n = 1;
    bool hostile = false;
    for (int i = 0; i < rank; ++i) {
      const int64_t d = rng_() % 6 == 0 ? Dim() : static_cast<int64_t>(1 + rng_() % 9);
      t->add_shape(d);
      if (d < 0 || d > 64) hostile = true; else n *= d;
    }
    const int64_t es = t->dtype() == v1::FLOAT32 ? 4 : 2;
    int64_t bytes = hostile ? static_cast<int64_t>(rng_() % 64) : n * es;
    if (rng_() % 10 == 0) bytes += Pick({-1, 1, -es, es});
    if (bytes < 0) bytes = 0;
    std::string data(static_cast<size_t>(bytes), '\0');
    for (auto& c : data) c = static_cast<char>(rng_());
    t->set_data(data);
  }

  // Runs a prepared call (if valid) to completion on the CPU backend.
  void RunIfValid(absl::StatusOr<PreparedCall> p) {
    if (!p.ok()) {
      const auto code = p.status().code();
      EXPECT_TRUE(code == absl::StatusCode::kInvalidArgument ||
                  code == absl::StatusCode::kResourceExhausted ||
                  code == absl::StatusCode::kNotFound || code == absl::StatusCode::kUnimplemented)
          << p.status();
      EXPECT_FALSE(p.status().message().empty());
      return;
    }
    if (p->trivial) return;
    std::promise<absl::Status> done;
    backend_->Submit(p->call, SteadyNowNs(),
                     [&done](absl::Status s, const OpTiming&) { done.set_value(s); });
    EXPECT_TRUE(done.get_future().get().ok());
  }
};

TEST_F(SeededRandomRequests, TenThousandHostileRequestsAreRejectedOrRunCleanly) {
  RequestContext ctx;
  ctx.store = &store_;
  ctx.limits.max_output_bytes = 1 << 20;
  int valid = 0;
  // FUSEBOX_RANDOM_REQUESTS=N runs longer (and FUSEBOX_RANDOM_REQUESTS_SEED=S elsewhere).
  const char* env_n = std::getenv("FUSEBOX_RANDOM_REQUESTS");
  const char* env_seed = std::getenv("FUSEBOX_RANDOM_REQUESTS_SEED");
  const int iterations = env_n ? std::atoi(env_n) : 10000;
  if (env_seed) rng_.seed(std::strtoull(env_seed, nullptr, 10));
  for (int i = 0; i < iterations; ++i) {
    // Requests live until the call has run: the call reads their bytes.
    v1::Tensor out;
    v1::GeluRequest gelu;
    v1::SoftmaxRequest softmax;
    v1::RowSumRequest rowsum;
    v1::MatmulReluRequest matmul;
    absl::StatusOr<PreparedCall> p = absl::UnknownError("");
    switch (i % 4) {
      case 0: {
        v1::GeluRequest& r = gelu;
        if (rng_() % 20) FillTensor(r.mutable_input(), true);
        r.mutable_output_options()->set_keep_on_server(rng_() % 5 == 0);
        p = PrepareGelu(r, ctx, &out);
        break;
      }
      case 1: {
        v1::SoftmaxRequest& r = softmax;
        if (rng_() % 20) FillTensor(r.mutable_input(), true);
        r.mutable_output_options()->set_keep_on_server(rng_() % 5 == 0);
        p = PrepareSoftmax(r, ctx, &out);
        break;
      }
      case 2: {
        v1::RowSumRequest& r = rowsum;
        if (rng_() % 20) FillTensor(r.mutable_input(), true);
        p = PrepareRowSum(r, ctx, &out);
        break;
      }
      default: {
        v1::MatmulReluRequest& r = matmul;
        // Mostly consistent shapes so some get through to the kernel.
        const int64_t m = 1 + rng_() % 5, k = rng_() % 5, n = 1 + rng_() % 5;
        const v1::DType dt = static_cast<v1::DType>(1 + rng_() % 3);
        auto make = [&](v1::TensorRef* ref, std::vector<int64_t> shape) {
          if (rng_() % 6 == 0) return FillTensor(ref, true);
          v1::Tensor* t = ref->mutable_tensor();
          t->set_dtype(dt);
          int64_t cnt = 1;
          for (int64_t d : shape) {
            t->add_shape(d);
            cnt *= d;
          }
          t->set_data(std::string(static_cast<size_t>(cnt * (dt == v1::FLOAT32 ? 4 : 2)), '\1'));
        };
        make(r.mutable_a(), {m, k});
        make(r.mutable_b(), {k, n});
        if (rng_() % 2) make(r.mutable_bias(), {n});
        r.set_impl(static_cast<v1::MatmulImpl>(Pick({0, 1, 2, 3, -5})));
        p = PrepareMatmulRelu(r, ctx, &out);
        break;
      }
    }
    valid += p.ok();
    RunIfValid(std::move(p));
  }
  // Both sides of the boundary were exercised.
  EXPECT_GT(valid, iterations / 20);
  EXPECT_LT(valid, iterations - iterations / 20);
}

}  // namespace
}  // namespace fusebox
