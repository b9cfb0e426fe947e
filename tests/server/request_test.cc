// Request validation: each bad input gets the right canonical code and a
// message naming the problem; good inputs become the right OpCall.
#include "server/core/request.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fusebox {
namespace {

v1::Tensor MakeTensor(v1::DType dt, std::initializer_list<int64_t> shape, size_t elem_size = 4) {
  v1::Tensor t;
  t.set_dtype(dt);
  size_t n = 1;
  for (int64_t d : shape) {
    t.add_shape(d);
    n *= static_cast<size_t>(d);
  }
  t.set_data(std::string(n * elem_size, '\0'));
  return t;
}

v1::GeluRequest Gelu(const v1::Tensor& t) {
  v1::GeluRequest r;
  *r.mutable_input()->mutable_tensor() = t;
  return r;
}

v1::MatmulReluRequest Matmul(const v1::Tensor& a, const v1::Tensor& b) {
  v1::MatmulReluRequest r;
  *r.mutable_a()->mutable_tensor() = a;
  *r.mutable_b()->mutable_tensor() = b;
  return r;
}

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& needle) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(std::string(s.message()).find(needle), std::string::npos)
      << "message '" << s.message() << "' should mention '" << needle << "'";
}

RequestContext MakeContext() { return RequestContext(); }
const RequestContext kLimits = MakeContext();

TEST(Request, ByteLengthNotMatchingShapeIsInvalid) {
  v1::Tensor t = MakeTensor(v1::FLOAT32, {2, 3});
  t.mutable_data()->pop_back();
  v1::Tensor out;
  ExpectError(PrepareGelu(Gelu(t), kLimits, &out).status(), absl::StatusCode::kInvalidArgument,
              "has 23 bytes but shape [2,3] of float32 needs 24");
}

TEST(Request, UnspecifiedDtypeIsInvalid) {
  v1::Tensor out;
  ExpectError(PrepareGelu(Gelu(MakeTensor(v1::DTYPE_UNSPECIFIED, {4})), kLimits, &out).status(),
              absl::StatusCode::kInvalidArgument, "input.dtype is unspecified");
}

TEST(Request, UnknownDtypeIsInvalid) {
  v1::Tensor out;
  ExpectError(PrepareGelu(Gelu(MakeTensor(static_cast<v1::DType>(42), {4})), kLimits, &out).status(),
              absl::StatusCode::kInvalidArgument, "dtype 42 is unknown");
}

TEST(Request, NegativeDimensionIsInvalid) {
  v1::Tensor t;
  t.set_dtype(v1::FLOAT32);
  t.add_shape(4);
  t.add_shape(-3);
  v1::Tensor out;
  ExpectError(PrepareGelu(Gelu(t), kLimits, &out).status(), absl::StatusCode::kInvalidArgument,
              "shape[1] = -3 is negative");
}

TEST(Request, ElementCountOverflowIsInvalid) {
  v1::Tensor t;
  t.set_dtype(v1::FLOAT32);
  for (int i = 0; i < 3; ++i) t.add_shape(int64_t{1} << 25);
  v1::Tensor out;
  ExpectError(PrepareGelu(Gelu(t), kLimits, &out).status(), absl::StatusCode::kInvalidArgument,
              "more elements than fit in 64 bits");
}

TEST(Request, ScalarForSoftmaxIsInvalid) {
  v1::SoftmaxRequest r;
  *r.mutable_input()->mutable_tensor() = MakeTensor(v1::FLOAT32, {});
  v1::Tensor out;
  ExpectError(PrepareSoftmax(r, kLimits, &out).status(), absl::StatusCode::kInvalidArgument,
              "needs rank >= 1");
}

TEST(Request, ScalarForRowSumIsInvalid) {
  v1::RowSumRequest r;
  *r.mutable_input()->mutable_tensor() = MakeTensor(v1::FLOAT32, {});
  v1::Tensor out;
  ExpectError(PrepareRowSum(r, kLimits, &out).status(), absl::StatusCode::kInvalidArgument,
              "needs rank >= 1");
}

TEST(Request, ScalarGeluIsOneElement) {
  v1::Tensor out;
  auto p = PrepareGelu(Gelu(MakeTensor(v1::FLOAT32, {})), kLimits, &out);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->call.rows * p->call.cols, 1);
  EXPECT_EQ(out.data().size(), 4u);
  EXPECT_EQ(out.shape_size(), 0);
}

TEST(Request, MatmulInnerDimensionsDifferIsInvalid) {
  v1::Tensor out;
  ExpectError(
      PrepareMatmulRelu(Matmul(MakeTensor(v1::FLOAT32, {2, 3}), MakeTensor(v1::FLOAT32, {4, 5})),
                        kLimits, &out)
          .status(),
      absl::StatusCode::kInvalidArgument, "inner dimensions differ: a is [2,3] and b is [4,5]");
}

TEST(Request, MatmulRankOtherThanTwoIsInvalid) {
  v1::Tensor out;
  ExpectError(
      PrepareMatmulRelu(Matmul(MakeTensor(v1::FLOAT32, {2, 3, 1}), MakeTensor(v1::FLOAT32, {3, 5})),
                        kLimits, &out)
          .status(),
      absl::StatusCode::kInvalidArgument, "rank 2");
}

TEST(Request, BiasOfWrongLengthIsInvalid) {
  auto r = Matmul(MakeTensor(v1::FLOAT32, {2, 3}), MakeTensor(v1::FLOAT32, {3, 5}));
  *r.mutable_bias()->mutable_tensor() = MakeTensor(v1::FLOAT32, {4});
  v1::Tensor out;
  ExpectError(PrepareMatmulRelu(r, kLimits, &out).status(), absl::StatusCode::kInvalidArgument,
              "bias must have shape [5]");
}

TEST(Request, OperandsOfDifferentDtypesAreInvalid) {
  v1::Tensor out;
  ExpectError(PrepareMatmulRelu(Matmul(MakeTensor(v1::FLOAT32, {2, 3}),
                                       MakeTensor(v1::BFLOAT16, {3, 5}, 2)),
                                kLimits, &out)
                  .status(),
              absl::StatusCode::kInvalidArgument, "a is float32 but b is bfloat16");
}

TEST(Request, BiasOfDifferentDtypeIsInvalid) {
  auto r = Matmul(MakeTensor(v1::FLOAT16, {2, 3}, 2), MakeTensor(v1::FLOAT16, {3, 5}, 2));
  *r.mutable_bias()->mutable_tensor() = MakeTensor(v1::FLOAT32, {5});
  v1::Tensor out;
  ExpectError(PrepareMatmulRelu(r, kLimits, &out).status(), absl::StatusCode::kInvalidArgument,
              "bias is float32 but a and b are float16");
}

TEST(Request, MissingTensorIsInvalid) {
  v1::Tensor out;
  ExpectError(PrepareGelu(v1::GeluRequest(), kLimits, &out).status(),
              absl::StatusCode::kInvalidArgument, "input is missing");
  v1::MatmulReluRequest r;
  *r.mutable_a()->mutable_tensor() = MakeTensor(v1::FLOAT32, {2, 3});
  ExpectError(PrepareMatmulRelu(r, kLimits, &out).status(), absl::StatusCode::kInvalidArgument,
              "b is missing");
}

TEST(Request, EmptyTensorRefIsInvalid) {
  v1::GeluRequest r;
  r.mutable_input();  // present but neither tensor nor handle
  v1::Tensor out;
  ExpectError(PrepareGelu(r, kLimits, &out).status(), absl::StatusCode::kInvalidArgument,
              "input is missing");
}

TEST(Request, HandleWithoutStoreIsUnimplemented) {
  v1::GeluRequest r;
  r.mutable_input()->set_handle("t-123");
  v1::Tensor out;
  ExpectError(PrepareGelu(r, kLimits, &out).status(), absl::StatusCode::kUnimplemented,
              "this server holds no tensors");
}

TEST(Request, OutputOverLimitIsResourceExhausted) {
  RequestContext small;
  small.limits.max_output_bytes = 1000;
  v1::Tensor out;
  // [1000,1] x [1,1000] is 8 KB in, 4 MB out.
  ExpectError(PrepareMatmulRelu(Matmul(MakeTensor(v1::FLOAT32, {1000, 1}),
                                       MakeTensor(v1::FLOAT32, {1, 1000})),
                                small, &out)
                  .status(),
              absl::StatusCode::kResourceExhausted, "over this server's limit of 1000");
}

TEST(Request, EmptyTensorGivesEmptyOutputWithoutCompute) {
  v1::SoftmaxRequest r;
  *r.mutable_input()->mutable_tensor() = MakeTensor(v1::FLOAT32, {0, 7});
  v1::Tensor out;
  auto p = PrepareSoftmax(r, kLimits, &out);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->trivial);
  EXPECT_EQ(out.shape_size(), 2);
  EXPECT_EQ(out.shape(0), 0);
  EXPECT_EQ(out.shape(1), 7);
  EXPECT_TRUE(out.data().empty());
}

TEST(Request, RowSumOfZeroLengthRowsIsZeros) {
  v1::RowSumRequest r;
  *r.mutable_input()->mutable_tensor() = MakeTensor(v1::BFLOAT16, {3, 0}, 2);
  v1::Tensor out;
  out.set_data(std::string(12, 'x'));
  out.clear_data();
  auto p = PrepareRowSum(r, kLimits, &out);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->trivial);
  EXPECT_EQ(out.dtype(), v1::FLOAT32);
  ASSERT_EQ(out.data().size(), 12u);
  EXPECT_EQ(out.data(), std::string(12, '\0'));
}

// A zero-length last axis makes the input empty however long its other axes are; the
// output keeps those axes, so their product is checked on its own (it once wrapped to a
// negative size or to 1).
TEST(Request, RowSumWhoseOutputOverflowsIsInvalidAndAnEmptyOneIsNot) {
  using Shape = std::vector<int64_t>;
  for (const Shape& shape : {Shape{INT64_MAX, 2, 0}, Shape{7, 0x6DB6DB6DB6DB6DB7, 0},
                             Shape{int64_t{1} << 31, int64_t{1} << 31, 0}}) {
    v1::RowSumRequest r;
    auto* t = r.mutable_input()->mutable_tensor();
    t->set_dtype(v1::FLOAT32);
    for (int64_t d : shape) t->add_shape(d);
    v1::Tensor out;
    ExpectError(PrepareRowSum(r, kLimits, &out).status(), absl::StatusCode::kInvalidArgument,
                "more bytes than fit in 64 bits");
    EXPECT_TRUE(out.data().empty());
    EXPECT_EQ(out.shape_size(), 0);
  }
  // A zero among the leading axes makes the output empty wherever it stands.
  const int64_t big = int64_t{1} << 40;
  for (const Shape& shape : {Shape{big, big, 0, 5}, Shape{0, big, big, 5}, Shape{big, 0, big, 5}}) {
    v1::RowSumRequest r;
    auto* t = r.mutable_input()->mutable_tensor();
    t->set_dtype(v1::FLOAT32);
    for (int64_t d : shape) t->add_shape(d);
    v1::Tensor out;
    auto p = PrepareRowSum(r, kLimits, &out);
    EXPECT_TRUE(p.ok()) << p.status();
    if (p.ok()) {
      EXPECT_EQ(p->call.rows, 0);
    }
  }
}

// Shapes are held uncharged and echoed in messages: their rank is bounded (as NumPy's).
TEST(Request, RankOverTheLimitIsInvalidWhereverTheTensorComesFrom) {
  v1::GeluRequest r;
  auto* t = r.mutable_input()->mutable_tensor();
  t->set_dtype(v1::FLOAT32);
  for (int i = 0; i < kMaxRank; ++i) t->add_shape(1);
  t->set_data(std::string(4, '\0'));
  v1::Tensor out;
  EXPECT_TRUE(PrepareGelu(r, kLimits, &out).ok());
  t->add_shape(1);
  ExpectError(PrepareGelu(r, kLimits, &out).status(), absl::StatusCode::kInvalidArgument,
              "input.shape has 65 axes; at most 64");
  google::protobuf::RepeatedField<int64_t> shape;
  for (int i = 0; i < 1000000; ++i) shape.Add(1);
  const auto s = CheckedBytes(DType::kFloat32, shape, "upload");
  ExpectError(s.status(), absl::StatusCode::kInvalidArgument, "upload.shape has 1000000 axes");
  EXPECT_LT(s.status().message().size(), 100u);
}

// A reservation's token, or null when refused (the reason: Reserve(...).status()).
std::shared_ptr<void> Try(InflightBytes& f, int64_t bytes, const std::string& tenant = "") {
  absl::StatusOr<std::shared_ptr<void>> r = f.Reserve(bytes, tenant, "call");
  return r.ok() ? *std::move(r) : nullptr;
}

TEST(InflightBytes, ACallAloneAlwaysFitsAndOneThatHoldsNothingAlwaysDoes) {
  InflightBytes f(100, 100);
  auto big = Try(f, 500);  // alone: let in past the limit
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(f.used(), 500);
  EXPECT_EQ(Try(f, 1), nullptr);
  EXPECT_NE(Try(f, 0), nullptr);  // all by handle, output kept: holds nothing here
  big.reset();
  EXPECT_EQ(f.used(), 0);
  auto a = Try(f, 60);
  auto b = Try(f, 40);
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(Try(f, 1), nullptr);
  a.reset();
  EXPECT_NE(Try(f, 60), nullptr);
}

TEST(InflightBytes, ATenantPastItsShareIsRefusedWhileOthersAreLetIn) {
  InflightBytes f(100, 0, 40);
  auto a = Try(f, 30, "a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(Try(f, 20, "a"), nullptr);  // 50 > its 40
  const absl::Status why = f.Reserve(20, "a", "call").status();
  EXPECT_EQ(why.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(why.message()).find("--tenant_inflight_share"), std::string::npos) << why;
  auto b = Try(f, 40, "b");  // another tenant's share is its own
  EXPECT_NE(b, nullptr);
  EXPECT_NE(Try(f, 10, "a"), nullptr);  // up to its share
  auto c = Try(f, 90, "c");  // holding nothing: one call of any size the server has room for
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(f.Reserve(90, "c", "call").status().message()).find("--inflight_mib"),
            std::string::npos);
  auto nothing = Try(f, 0, "a");  // outlives the tenant's other reservations
  a.reset();
  b.reset();
  nothing.reset();
  EXPECT_EQ(f.used(), 0);
  EXPECT_EQ(f.used_by("a"), 0);
  EXPECT_NE(Try(f, 90, "c"), nullptr);  // alone: past its share
}

// Replies handed to gRPC have a budget of their own: a call is kept out by them only once
// they are past it (clients not taking them), however near the limit the calls are.
TEST(InflightBytes, RepliesOnTheirWayKeepCallsOutOnlyPastTheirOwnBudget) {
  InflightBytes f(100, 300);
  auto replies = f.Sending(250);  // replies their clients may have taken already
  auto alone = Try(f, 90);
  ASSERT_NE(alone, nullptr);
  EXPECT_EQ(Try(f, 20), nullptr);  // beside it, past the limit
  EXPECT_NE(std::string(f.Reserve(20, "", "call").status().message()).find("calls in flight"), std::string::npos);
  alone.reset();
  auto more = f.Sending(100);            // two replies, past their budget together
  EXPECT_EQ(Try(f, 10), nullptr);  // nothing gets in
  EXPECT_NE(std::string(f.Reserve(10, "", "call").status().message()).find("have not taken yet"), std::string::npos);
  EXPECT_NE(Try(f, 0), nullptr);
  replies.reset();
  EXPECT_NE(Try(f, 10), nullptr);
  auto big = f.Sending(1000);
  EXPECT_EQ(Try(f, 10), nullptr);
  more.reset();                          // a reply alone may be larger than the budget
  EXPECT_NE(Try(f, 10), nullptr);
  EXPECT_EQ(f.used(), 1000);
  big.reset();
  EXPECT_EQ(f.used(), 0);
}

// A tenant's replies on their way count against its share of their budget as the server's count
// against the whole: past it, and more than one, they keep that tenant's calls out, not another's.
TEST(InflightBytes, ATenantsUntakenRepliesKeepOnlyItsOwnCallsOut) {
  InflightBytes f(100, 150, 40);  // a tenant's share of the replies' budget: 60
  auto r1 = f.Sending(50, "a");
  EXPECT_NE(Try(f, 40, "a"), nullptr);  // one reply: its next call still fits
  auto r2 = f.Sending(20, "a");
  EXPECT_EQ(Try(f, 1, "a"), nullptr);
  const absl::Status why = f.Reserve(1, "a", "call").status();
  EXPECT_NE(std::string(why.message()).find("replies not taken"), std::string::npos) << why;
  EXPECT_NE(Try(f, 40, "b"), nullptr);
  EXPECT_EQ(f.used_by("a"), 70);
  r1.reset();
  EXPECT_NE(Try(f, 40, "a"), nullptr);
  r2.reset();
  EXPECT_EQ(f.used(), 0);
  EXPECT_EQ(f.used_by("a"), 0);
}

// A result that needs no kernel costs the client nothing to ask for: it may be no larger
// than the request's inline tensors, or 64 KiB.
TEST(Request, ResultsThatNeedNoKernelAreHeldToTheRequestsSizeOr64KiB) {
  auto row_sum = [](int64_t rows) {
    v1::RowSumRequest r;
    *r.mutable_input()->mutable_tensor() = MakeTensor(v1::FLOAT32, {rows, 0});
    return r;
  };
  v1::Tensor out;
  // 14 bytes on the wire, 1 GiB of zeros.
  ExpectError(PrepareRowSum(row_sum(int64_t{1} << 28), kLimits, &out).status(),
              absl::StatusCode::kResourceExhausted, "need no kernel");
  EXPECT_TRUE(out.data().empty());
  EXPECT_TRUE(PrepareRowSum(row_sum(16384), kLimits, &out).ok());  // 64 KiB
  out.Clear();
  ExpectError(PrepareRowSum(row_sum(16385), kLimits, &out).status(),
              absl::StatusCode::kResourceExhausted, "or 65536 bytes");
  // K = 0: relu(bias) in every row, as large as the bias at most (past 64 KiB).
  auto matmul = [](int64_t m, int64_t n, bool bias) {
    auto r = Matmul(MakeTensor(v1::FLOAT32, {m, 0}), MakeTensor(v1::FLOAT32, {0, n}));
    if (bias) *r.mutable_bias()->mutable_tensor() = MakeTensor(v1::FLOAT32, {n});
    return r;
  };
  out.Clear();
  ExpectError(PrepareMatmulRelu(matmul(1 << 14, 1 << 14, true), kLimits, &out).status(),
              absl::StatusCode::kResourceExhausted, "need no kernel");
  out.Clear();
  EXPECT_TRUE(PrepareMatmulRelu(matmul(1, 1 << 20, true), kLimits, &out).ok());  // 4 MiB of bias
  out.Clear();
  ExpectError(PrepareMatmulRelu(matmul(2, 1 << 20, true), kLimits, &out).status(),
              absl::StatusCode::kResourceExhausted, "(4194304 bytes)");
  out.Clear();
  EXPECT_TRUE(PrepareMatmulRelu(matmul(128, 128, false), kLimits, &out).ok());  // 64 KiB
}

TEST(Request, MatmulDimensionsOf2Pow31AreInvalid) {
  const int64_t big = int64_t{1} << 31;
  for (auto [m, n] : {std::pair<int64_t, int64_t>{big, 1}, std::pair<int64_t, int64_t>{1, big}}) {
    auto r = Matmul(MakeTensor(v1::FLOAT16, {m, 0}, 2), MakeTensor(v1::FLOAT16, {0, n}, 2));
    v1::Tensor out;
    ExpectError(PrepareMatmulRelu(r, kLimits, &out).status(), absl::StatusCode::kInvalidArgument,
                "dimensions must be below 2^31");
  }
}

TEST(Request, MatmulWithEmptyInnerDimensionIsReluOfBias) {
  auto r = Matmul(MakeTensor(v1::FLOAT32, {2, 0}), MakeTensor(v1::FLOAT32, {0, 2}));
  v1::Tensor bias;
  bias.set_dtype(v1::FLOAT32);
  bias.add_shape(2);
  const float b[2] = {-1.5f, 2.5f};
  bias.set_data(std::string(reinterpret_cast<const char*>(b), 8));
  *r.mutable_bias()->mutable_tensor() = bias;
  v1::Tensor out;
  auto p = PrepareMatmulRelu(r, kLimits, &out);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->trivial);
  const float* o = reinterpret_cast<const float*>(out.data().data());
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_EQ(o[1], 2.5f);
  EXPECT_EQ(o[2], 0.0f);
  EXPECT_EQ(o[3], 2.5f);
}

TEST(Request, RowSumOutputIsFloat32WithoutLastAxis) {
  v1::RowSumRequest r;
  *r.mutable_input()->mutable_tensor() = MakeTensor(v1::FLOAT16, {2, 3, 5}, 2);
  v1::Tensor out;
  auto p = PrepareRowSum(r, kLimits, &out);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(out.dtype(), v1::FLOAT32);
  ASSERT_EQ(out.shape_size(), 2);
  EXPECT_EQ(out.shape(1), 3);
  EXPECT_EQ(p->call.rows, 6);
  EXPECT_EQ(p->call.cols, 5);
  EXPECT_EQ(out.data().size(), 24u);
}

}  // namespace
}  // namespace fusebox
