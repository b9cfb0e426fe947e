// End to end: a real fusebox-server process (CPU backend, free port) called
// through the C++ client. Every op and dtype against the fp64 reference on fresh
// random inputs, health, bad inputs (INVALID_ARGUMENT, server keeps serving),
// deadlines, concurrency, a clean exit on SIGTERM, and the Router over three replicas.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <thread>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "client/cpp/fusebox_client.h"
#include "fusebox/v1/kernel_service.grpc.pb.h"
#include "tests/integration/server_process.h"
#include "tests/reference.h"

namespace fusebox {
namespace {

using client::Client;
using client::HostTensor;
using testing::ServerProcess;

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

uint64_t FreshSeed() {
  static std::random_device rd;
  return (uint64_t{rd()} << 32) | rd();
}

int64_t Product(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

HostTensor Random(DType dt, std::vector<int64_t> shape, uint64_t seed, float lo = -4, float hi = 4) {
  HostTensor t;
  t.dtype = dt;
  t.shape = std::move(shape);
  auto bytes = ref::RandomTensor(dt, Product(t.shape), lo, hi, seed);
  t.data.assign(bytes.begin(), bytes.end());
  return t;
}

std::string Describe(DType dt, const std::vector<int64_t>& shape, uint64_t seed) {
  std::string s = std::string(DTypeName(dt)) + " [";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "] seed " + std::to_string(seed);
}

class IntegrationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess();
    if (!server_->Start()) {
      start_error_ = server_->error();
      return;
    }
    client_ = Client::Create(server_->address()).release();
    if (!client_->WaitForReady(std::chrono::seconds(10))) start_error_ = "client cannot connect";
  }
  static void TearDownTestSuite() {
    delete client_;
    client_ = nullptr;
    if (server_) server_->Stop();
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(start_error_.empty()) << start_error_; }

  // The server still answers a good call.
  static void ExpectStillServing() {
    auto r = client_->Gelu(HostTensor::FromFloats(DType::kFloat32, {2}, {1.0f, -1.0f}));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NEAR(r->output.ToFloats()[0], 0.841192f, 1e-5);
  }

  static void ExpectInvalid(const absl::StatusOr<client::OpResult>& r, const std::string& what) {
    ASSERT_FALSE(r.ok()) << what << ": call succeeded";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << what << ": " << r.status();
    EXPECT_FALSE(r.status().message().empty()) << what;
    ExpectStillServing();
  }

  static ServerProcess* server_;
  static Client* client_;
  static std::string start_error_;
};
ServerProcess* IntegrationTest::server_ = nullptr;
Client* IntegrationTest::client_ = nullptr;
std::string IntegrationTest::start_error_;

TEST_F(IntegrationTest, ServerAnnouncesCpuBackendAndPort) {
  EXPECT_GT(server_->port(), 0);
  EXPECT_NE(server_->first_line().find("backend=cpu"), std::string::npos) << server_->first_line();
}

TEST_F(IntegrationTest, HealthCheckReportsServing) {
  auto h = client_->Health();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h, client::HealthStatus::kServing);
}

TEST_F(IntegrationTest, GeluMatchesReferenceForEveryDtype) {
  for (DType dt : kAllDTypes) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{1}, {3, 7}, {2, 3, 1000}, {65537}}) {
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE(Describe(dt, shape, seed));
      HostTensor in = Random(dt, shape, seed);
      auto r = client_->Gelu(in);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->output.dtype, dt);
      EXPECT_EQ(r->output.shape, shape);
      ASSERT_EQ(r->output.data.size(), in.data.size());
      auto c = ref::Compare(dt, r->output.data.data(), ref::Gelu(dt, in.data.data(), Product(shape)),
                            ref::DefaultTolerance(dt));
      EXPECT_TRUE(c.ok) << "rel error " << c.rel_error << " first bad " << c.first_bad;
    }
  }
}

TEST_F(IntegrationTest, SoftmaxMatchesReferenceForEveryDtype) {
  for (DType dt : kAllDTypes) {
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{1}, {1, 3}, {5, 1000}, {2, 2, 33}, {2, 65537}}) {
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE(Describe(dt, shape, seed));
      HostTensor in = Random(dt, shape, seed);
      auto r = client_->Softmax(in);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->output.dtype, dt);
      EXPECT_EQ(r->output.shape, shape);
      ASSERT_EQ(r->output.data.size(), in.data.size());
      const int64_t cols = shape.back(), rows = Product(shape) / cols;
      auto c = ref::Compare(dt, r->output.data.data(), ref::Softmax(dt, in.data.data(), rows, cols),
                            ref::DefaultTolerance(dt));
      EXPECT_TRUE(c.ok) << "rel error " << c.rel_error << " first bad " << c.first_bad;
    }
  }
}

TEST_F(IntegrationTest, RowSumMatchesReferenceAndReturnsFloat32) {
  for (DType dt : kAllDTypes) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{7}, {1, 1}, {3, 1000}, {2, 3, 65537}}) {
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE(Describe(dt, shape, seed));
      HostTensor in = Random(dt, shape, seed);
      auto r = client_->RowSum(in);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->output.dtype, DType::kFloat32);
      const std::vector<int64_t> want_shape(shape.begin(), shape.end() - 1);
      EXPECT_EQ(r->output.shape, want_shape);
      const int64_t cols = shape.back(), rows = Product(shape) / cols;
      ASSERT_EQ(r->output.data.size(), static_cast<size_t>(rows) * 4);
      // Sums of uniform(-4, 4) values nearly cancel: compare against the sum of magnitudes.
      auto want = ref::RowSum(dt, in.data.data(), rows, cols);
      auto got = r->output.ToFloats();
      for (int64_t i = 0; i < rows; ++i) {
        double mag = 0;
        for (int64_t j = 0; j < cols; ++j) mag += std::abs(LoadAsFloat(dt, in.data.data(), i * cols + j));
        EXPECT_NEAR(got[i], want[i], 1e-5 * mag + 1e-6) << "row " << i;
      }
    }
  }
}

TEST_F(IntegrationTest, MatmulReluMatchesReferenceWithAndWithoutBias) {
  struct Case { int64_t m, k, n; bool bias; };
  for (DType dt : kAllDTypes) {
    // The last two send over 64 KiB of bias, which the server reads where it arrived (in
    // pieces): through the kernel, and for K = 0 while building the result itself.
    for (Case cs : {Case{1, 1, 1, false}, Case{17, 33, 9, true}, Case{64, 128, 32, false},
                    Case{5, 300, 70, true}, Case{3, 2, 40000, true}, Case{1, 0, 40000, true}}) {
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE(Describe(dt, {cs.m, cs.k, cs.n}, seed) + (cs.bias ? " +bias" : ""));
      HostTensor a = Random(dt, {cs.m, cs.k}, seed, -1, 1);
      HostTensor b = Random(dt, {cs.k, cs.n}, seed + 1, -1, 1);
      HostTensor bias = Random(dt, {cs.n}, seed + 2, -1, 1);
      auto r = client_->MatmulRelu(a, b, cs.bias ? &bias : nullptr);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->output.dtype, dt);
      EXPECT_EQ(r->output.shape, (std::vector<int64_t>{cs.m, cs.n}));
      ASSERT_EQ(r->output.data.size(), static_cast<size_t>(cs.m * cs.n) * ElementSize(dt));
      auto want = ref::MatmulRelu(dt, a.data.data(), b.data.data(), cs.bias ? bias.data.data() : nullptr,
                                  cs.m, cs.n, cs.k);
      auto c = ref::Compare(dt, r->output.data.data(), want, ref::DefaultTolerance(dt));
      EXPECT_TRUE(c.ok) << "rel error " << c.rel_error << " first bad " << c.first_bad;
    }
  }
}

TEST_F(IntegrationTest, ResponsesCarryCpuTiming) {
  auto r = client_->Gelu(Random(DType::kFloat32, {1000}, FreshSeed()));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->timing.backend, "cpu");
  EXPECT_GT(r->timing.total_us, 0);
  EXPECT_GE(r->timing.total_us, r->timing.kernel_us);
  EXPECT_GT(r->timing.rpc_us, 0);
  // No copies and no GPU launch on the CPU backend.
  EXPECT_EQ(r->timing.copy_in_us, 0);
  EXPECT_EQ(r->timing.launch_us, 0);
  EXPECT_EQ(r->timing.copy_out_us, 0);
}

TEST_F(IntegrationTest, EmptyTensorsGiveEmptyOutputsOfTheRightShape) {
  auto g = client_->Gelu(HostTensor{DType::kFloat16, {0, 5}, ""});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->output.shape, (std::vector<int64_t>{0, 5}));
  EXPECT_TRUE(g->output.data.empty());

  auto s = client_->Softmax(HostTensor{DType::kFloat32, {0, 4}, ""});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->output.shape, (std::vector<int64_t>{0, 4}));
  EXPECT_TRUE(s->output.data.empty());

  auto rs = client_->RowSum(HostTensor{DType::kBFloat16, {0, 4}, ""});
  ASSERT_TRUE(rs.ok()) << rs.status();
  EXPECT_EQ(rs->output.shape, (std::vector<int64_t>{0}));
  EXPECT_TRUE(rs->output.data.empty());

  auto m = client_->MatmulRelu(HostTensor{DType::kFloat32, {0, 3}, ""},
                               HostTensor::FromFloats(DType::kFloat32, {3, 2}, {1, 2, 3, 4, 5, 6}), nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->output.shape, (std::vector<int64_t>{0, 2}));
  EXPECT_TRUE(m->output.data.empty());
}

TEST_F(IntegrationTest, LargeMessageRoundTrips) {
  const uint64_t seed = FreshSeed();
  HostTensor in = Random(DType::kFloat32, {4096, 1024}, seed);  // 16 MiB each way
  auto r = client_->Gelu(in);
  ASSERT_TRUE(r.ok()) << r.status();
  auto c = ref::Compare(DType::kFloat32, r->output.data.data(),
                        ref::Gelu(DType::kFloat32, in.data.data(), 4096 * 1024), 1e-6);
  EXPECT_TRUE(c.ok) << "rel error " << c.rel_error << " seed " << seed;
}

TEST_F(IntegrationTest, ProtobufRequestPathGivesTheSameAnswer) {
  client::Client::Options o;
  o.request_path = client::RequestPath::kProtobuf;
  auto pc = Client::Create(server_->address(), o);
  HostTensor a = Random(DType::kBFloat16, {7, 5}, FreshSeed());
  HostTensor b = Random(DType::kBFloat16, {5, 3}, FreshSeed());
  HostTensor bias = Random(DType::kBFloat16, {3}, FreshSeed());
  auto r1 = client_->MatmulRelu(a, b, &bias);
  auto r2 = pc->MatmulRelu(a, b, &bias);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r1->output.data, r2->output.data);
}

TEST_F(IntegrationTest, AnEncodedRequestInPiecesGetsTheReplyAnOrdinaryCallGets) {
  HostTensor in = Random(DType::kFloat16, {3, 4099}, FreshSeed());
  client::CallOptions opts;
  const grpc::ByteBuffer encoded = client::EncodeRequestForTest(false, {in}, opts);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(encoded.Dump(&slices).ok());
  std::string wire;
  for (const grpc::Slice& s : slices) wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // The same bytes cut anywhere, with an empty piece among them, are one message.
  HostPieces pieces = {{wire.data(), 7}, {wire.data() + 7, 0}, {wire.data() + 7, 1000},
                       {wire.data() + 1007, wire.size() - 1007}};
  grpc::ByteBuffer reply;
  ASSERT_TRUE(client_->CallEncoded("/fusebox.v1.KernelService/Softmax", pieces, &reply).ok());
  client::OpResult got;
  ASSERT_TRUE(client::ParseResponseForTest(reply, &got).ok());
  auto want = client_->Softmax(in);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(got.output.shape, want->output.shape);
  EXPECT_EQ(got.output.data, want->output.data);
  // An error comes back as the call's status, and the caller's bytes are released either way.
  wire[wire.size() - 1] ^= 0x5a;
  grpc::ByteBuffer bad_reply;
  const absl::Status st = client_->CallEncoded("/fusebox.v1.KernelService/MatmulRelu",
                                               {{wire.data(), wire.size()}}, &bad_reply);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  ExpectStillServing();
}

TEST_F(IntegrationTest, AViewOfTheCallersMemoryGetsTheAnswerItsTensorGets) {
  HostTensor in = Random(DType::kBFloat16, {5, 3001}, FreshSeed());
  const client::TensorView v{in.dtype, in.shape, in.data.data(), in.data.size()};
  auto want = client_->RowSum(in);
  auto got = client_->RowSum(v);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->output.shape, want->output.shape);
  EXPECT_EQ(got->output.data, want->output.data);
  // A view whose bytes do not match its shape is the server's INVALID_ARGUMENT, as for a tensor.
  const client::TensorView short_view{in.dtype, in.shape, in.data.data(), in.data.size() - 2};
  ExpectInvalid(client_->Gelu(short_view), "a view two bytes short");
}

TEST_F(IntegrationTest, ConcurrentCallersAllGetTheirOwnAnswers) {
  constexpr int kThreads = 8, kCalls = 20;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &failures] {
      for (int i = 0; i < kCalls; ++i) {
        const float v = static_cast<float>(t * 100 + i);
        auto r = client_->RowSum(HostTensor::FromFloats(DType::kFloat32, {1, 2}, {v, 1.0f}));
        if (!r.ok() || r->output.ToFloats().at(0) != v + 1.0f) ++failures[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

TEST_F(IntegrationTest, TinyDeadlineGivesDeadlineExceeded) {
  HostTensor in = Random(DType::kFloat32, {16, 1024, 1024}, 1);  // 64 MiB
  client::CallOptions o;
  o.timeout = std::chrono::milliseconds(1);
  auto r = client_->Gelu(in, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  ExpectStillServing();
}

// --- tensors held by the server -------------------------------------------------------------

TEST_F(IntegrationTest, UploadThenDownloadReturnsTheSameBytesAcrossChunks) {
  HostTensor in = Random(DType::kBFloat16, {3, 1000, 1000}, FreshSeed());  // 6 MB
  auto info = client_->Upload(in, /*chunk_bytes=*/1 << 20);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->handle.empty());
  EXPECT_EQ(info->dtype, DType::kBFloat16);
  EXPECT_EQ(info->shape, in.shape);
  EXPECT_EQ(info->size_bytes, static_cast<int64_t>(in.data.size()));
  auto back = client_->Download(info->handle);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->dtype, DType::kBFloat16);
  EXPECT_EQ(back->shape, in.shape);
  EXPECT_TRUE(back->data == in.data);
  auto freed = client_->FreeTensor(info->handle);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, static_cast<int64_t>(in.data.size()));
  EXPECT_EQ(client_->Download(info->handle).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(IntegrationTest, OpsTakeHandlesAndKeepOutputsOnTheServer) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  HostTensor a = Random(DType::kFloat32, {8, 16}, seed, -1, 1);
  HostTensor b = Random(DType::kFloat32, {16, 4}, seed + 1, -1, 1);
  auto ha = client_->Upload(a);
  ASSERT_TRUE(ha.ok()) << ha.status();
  client::CallOptions keep;
  keep.keep_on_server = true;
  // matmul(handle, inline) kept -> softmax(handle) inline.
  auto m = client_->MatmulRelu(client::Arg::Handle(ha->handle), b, nullptr, keep);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_FALSE(m->handle.empty());
  EXPECT_TRUE(m->output.data.empty());
  auto stat = client_->StatTensor(m->handle);
  ASSERT_TRUE(stat.ok()) << stat.status();
  EXPECT_EQ(stat->shape, (std::vector<int64_t>{8, 4}));
  auto s = client_->Softmax(client::Arg::Handle(m->handle));
  ASSERT_TRUE(s.ok()) << s.status();

  auto mm = ref::MatmulRelu(DType::kFloat32, a.data.data(), b.data.data(), nullptr, 8, 4, 16);
  std::vector<float> mm32(mm.begin(), mm.end());
  auto want = ref::Softmax(DType::kFloat32, mm32.data(), 8, 4);
  auto c = ref::Compare(DType::kFloat32, s->output.data.data(), want, 1e-5);
  EXPECT_TRUE(c.ok) << "rel error " << c.rel_error;

  auto list = client_->ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  int found = 0;
  for (const auto& t : list->tensors) found += t.handle == ha->handle || t.handle == m->handle;
  EXPECT_EQ(found, 2);
  EXPECT_TRUE(client_->FreeTensor(ha->handle).ok());
  EXPECT_TRUE(client_->FreeTensor(m->handle).ok());
}

// --- bad input: INVALID_ARGUMENT and the server keeps serving ------------------------------

TEST_F(IntegrationTest, ByteLengthNotMatchingShapeIsInvalidArgument) {
  ExpectInvalid(client_->Gelu(HostTensor{DType::kFloat32, {2, 3}, std::string(20, '\0')}),
                "byte length");
}

TEST_F(IntegrationTest, UnspecifiedDtypeIsInvalidArgument) {
  ExpectInvalid(client_->Gelu(HostTensor{static_cast<DType>(0), {2}, std::string(8, '\0')}),
                "dtype unspecified");
}

TEST_F(IntegrationTest, UnknownDtypeIsInvalidArgument) {
  ExpectInvalid(client_->Softmax(HostTensor{static_cast<DType>(42), {2}, std::string(8, '\0')}),
                "dtype unknown");
}

TEST_F(IntegrationTest, NegativeDimIsInvalidArgument) {
  ExpectInvalid(client_->Gelu(HostTensor{DType::kFloat32, {-2, 3}, std::string(24, '\0')}),
                "negative dim");
}

TEST_F(IntegrationTest, OverflowingShapeIsInvalidArgument) {
  const int64_t big = int64_t{1} << 40;
  auto r = client_->Gelu(HostTensor{DType::kFloat32, {big, big}, std::string(16, '\0')});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().code() == absl::StatusCode::kInvalidArgument ||
              r.status().code() == absl::StatusCode::kResourceExhausted)
      << r.status();
  ExpectStillServing();
}

TEST_F(IntegrationTest, RankZeroSoftmaxIsInvalidArgument) {
  ExpectInvalid(client_->Softmax(HostTensor{DType::kFloat32, {}, std::string(4, '\0')}),
                "rank 0 softmax");
}

TEST_F(IntegrationTest, RankZeroRowSumIsInvalidArgument) {
  ExpectInvalid(client_->RowSum(HostTensor{DType::kFloat32, {}, std::string(4, '\0')}),
                "rank 0 rowsum");
}

TEST_F(IntegrationTest, MatmulOfRankOneOperandIsInvalidArgument) {
  ExpectInvalid(client_->MatmulRelu(HostTensor::FromFloats(DType::kFloat32, {3}, {1, 2, 3}),
                                    HostTensor::FromFloats(DType::kFloat32, {3, 1}, {1, 2, 3}), nullptr),
                "matmul rank 1");
}

TEST_F(IntegrationTest, MatmulInnerDimsThatDifferAreInvalidArgument) {
  ExpectInvalid(client_->MatmulRelu(Random(DType::kFloat32, {2, 3}, 1), Random(DType::kFloat32, {4, 2}, 2),
                                    nullptr),
                "inner dims");
}

TEST_F(IntegrationTest, MatmulBiasOfWrongLengthIsInvalidArgument) {
  HostTensor bias = Random(DType::kFloat32, {3}, 3);
  ExpectInvalid(client_->MatmulRelu(Random(DType::kFloat32, {2, 3}, 1), Random(DType::kFloat32, {3, 2}, 2),
                                    &bias),
                "bias length");
}

TEST_F(IntegrationTest, MatmulOperandsOfMixedDtypesAreInvalidArgument) {
  ExpectInvalid(client_->MatmulRelu(Random(DType::kFloat32, {2, 3}, 1), Random(DType::kFloat16, {3, 2}, 2),
                                    nullptr),
                "mixed dtypes");
}

TEST_F(IntegrationTest, MissingTensorIsInvalidArgument) {
  auto stub = v1::KernelService::NewStub(client_->channel());
  {
    grpc::ClientContext ctx;
    v1::GeluRequest req;  // no input at all
    v1::GeluResponse resp;
    grpc::Status s = stub->Gelu(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    v1::MatmulReluRequest req;  // b missing
    auto* a = req.mutable_a()->mutable_tensor();
    a->set_dtype(v1::FLOAT32);
    a->add_shape(1);
    a->add_shape(1);
    a->set_data(std::string(4, '\0'));
    v1::MatmulReluResponse resp;
    grpc::Status s = stub->MatmulRelu(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  ExpectStillServing();
}

TEST_F(IntegrationTest, UnknownHandleIsRejected) {
  auto stub = v1::KernelService::NewStub(client_->channel());
  grpc::ClientContext ctx;
  v1::GeluRequest req;
  req.mutable_input()->set_handle("no-such-handle");
  v1::GeluResponse resp;
  grpc::Status s = stub->Gelu(&ctx, req, &resp);
  EXPECT_TRUE(s.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
              s.error_code() == grpc::StatusCode::NOT_FOUND)
      << s.error_code() << " " << s.error_message();
  ExpectStillServing();
}

// Uses its own server so the shared one is not disturbed. A call under way when SIGTERM
// arrives (an Upload with half its bytes sent) completes during the drain, while new calls are
// refused; then the server exits 0.
TEST(ServerLifecycleTest, SigtermDrainsACallUnderWayRefusesNewOnesAndExitsZero) {
  ServerProcess server;
  ASSERT_TRUE(server.Start()) << server.error();
  auto stub = v1::KernelService::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  auto list = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListTensorsResponse resp;
    return stub->ListTensors(&ctx, v1::ListTensorsRequest(), &resp);
  };
  ASSERT_TRUE(list().ok());
  const std::string bytes(4 << 20, '\x01');
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::UploadResponse resp;
  auto w = stub->Upload(&ctx, &resp);
  v1::UploadRequest m;
  m.set_dtype(v1::FLOAT32);
  m.add_shape(1 << 20);
  m.set_data(bytes.substr(0, 2 << 20));
  ASSERT_TRUE(w->Write(m));
  // A later call on the same connection has its answer: the server has started the upload.
  ASSERT_TRUE(list().ok());
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  grpc::Status refused;
  for (int i = 0; i < 200 && (refused = list()).ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  // gRPC refuses them: UNAVAILABLE, or CANCELLED for one that crosses the server's GOAWAY.
  EXPECT_TRUE(refused.error_code() == grpc::StatusCode::UNAVAILABLE ||
              refused.error_code() == grpc::StatusCode::CANCELLED)
      << refused.error_code() << " " << refused.error_message();
  v1::UploadRequest rest;
  rest.set_data(bytes.substr(2 << 20));
  EXPECT_TRUE(w->Write(rest));
  w->WritesDone();
  const grpc::Status s = w->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.tensor().size_bytes(), 4 << 20);
  EXPECT_EQ(server.Stop(std::chrono::seconds(30)), 0);
}


// Three replicas without a proxy: the Router sends uploads to each in turn and every call
// naming a handle to the replica that minted it (a handle elsewhere would be NOT_FOUND).
// Batching end to end: a server that waits 2 ms for company batches nearly every call; 32
// callers of mixed ops, dtypes and row lengths (some of 80 KiB, which arrive in gRPC's receive
// slices and are batched as pieces) each get their own answer.
TEST(BatchingEndToEndTest, ConcurrentCallersOfMixedKindsGetTheirOwnAnswers) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--batch_wait_us=2000", "--batch_max_kib=256"})) << server.error();
  auto c = Client::Create(server.address());
  ASSERT_TRUE(c->WaitForReady(std::chrono::seconds(10)));
  constexpr int kThreads = 32, kCalls = 6;
  std::vector<std::thread> threads;
  std::vector<std::string> failures(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls && failures[t].empty(); ++i) {
        const DType dt = kAllDTypes[(t + i) % 3];
        const int64_t cols = (t % 2) ? 64 : 96;
        const int64_t rows = (i == 0 && t % 4 == 0) ? 80 * 1024 / (cols * ElementSize(dt)) : 1 + i;
        const uint64_t seed = FreshSeed();
        const HostTensor x = Random(dt, {rows, cols}, seed);
        absl::StatusOr<client::OpResult> r;
        std::vector<double> want;
        double tol = ref::DefaultTolerance(dt);
        DType out_dt = dt;
        switch ((t + 2 * i) % 3) {
          case 0:
            r = c->Gelu(x);
            want = ref::Gelu(dt, x.data.data(), rows * cols);
            break;
          case 1:
            r = c->Softmax(x);
            want = ref::Softmax(dt, x.data.data(), rows, cols);
            break;
          default:
            r = c->RowSum(x);
            want = ref::RowSum(dt, x.data.data(), rows, cols);
            tol = ref::RowSumTolerance(dt, x.data.data(), rows, cols, want);
            out_dt = DType::kFloat32;
            break;
        }
        if (!r.ok()) {
          failures[t] = std::string(r.status().message());
        } else if (!ref::Compare(out_dt, r->output.data.data(), want, tol).ok) {
          failures[t] = "wrong result for " + Describe(dt, {rows, cols}, seed);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
  server.Stop();
}

TEST(RouterTest, CallsNamingAHandleReachTheReplicaHoldingIt) {
  ServerProcess servers[3];
  std::vector<std::string> targets;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(servers[i].Start({"--replica_id=r" + std::to_string(i)})) << servers[i].error();
    targets.push_back(servers[i].address());
  }
  auto router = client::Router::Create(targets, Client::Options());
  std::set<std::string> replicas;
  client::CallOptions keep;
  keep.keep_on_server = true;
  for (int i = 0; i < 6; ++i) {
    HostTensor x = Random(DType::kFloat32, {4, 8}, FreshSeed());
    auto up = router->Upload(x);
    ASSERT_TRUE(up.ok()) << up.status();
    replicas.insert(client::ReplicaOf(up->handle));
    client::OpResult kept, sums;
    ASSERT_TRUE(router->Call(client::Op::kSoftmax, {client::Arg::Handle(up->handle)}, &kept, keep)
                    .ok());
    EXPECT_EQ(client::ReplicaOf(kept.handle), client::ReplicaOf(up->handle));
    absl::Status st = router->Call(client::Op::kRowSum, {client::Arg::Handle(kept.handle)}, &sums);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(sums.output.data.size(), 4 * sizeof(float));
    auto back = router->Download(up->handle);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->data, x.data);
    EXPECT_TRUE(router->FreeTensor(kept.handle).ok());
  }
  EXPECT_EQ(replicas, (std::set<std::string>{"r0", "r1", "r2"}));
  EXPECT_EQ(router->Download("r7.t0").status().code(), absl::StatusCode::kNotFound);

  // A target named with its replica id routes that replica's handles before any call.
  auto held = router->Upload(Random(DType::kFloat32, {3}, FreshSeed()));
  ASSERT_TRUE(held.ok()) << held.status();
  const int owner = client::ReplicaOf(held->handle).back() - '0';
  auto named = client::Router::Create(
      {"r" + std::to_string(owner) + "=" + servers[owner].address()}, Client::Options());
  EXPECT_TRUE(named->Download(held->handle).ok());
}


// The C++ client's shared memory on a server with --allow_shared_memory: a POSIX segment made
// by ShmSegment, registered, a GeLU read from it and written into it (the same bits as inline),
// matmul operands read from it into an inline result, Upload from it, listing and unregister.
TEST(SharedMemoryClientTest, ClientReadsAndWritesRegionsThroughTheServer) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--allow_shared_memory"})) << server.error();
  auto c = Client::Create(server.address());
  const int64_t n = 4099;
  const HostTensor x = Random(DType::kFloat32, {n}, 7);
  auto seg = client::ShmSegment::Create("fusebox-cc-test-" + std::to_string(getpid()), 3 * n * 4);
  ASSERT_TRUE(seg.ok()) << seg.status();
  std::memcpy((*seg)->data(), x.data.data(), x.data.size());
  auto info = c->RegisterSharedMemory("io", (*seg)->key(), 0, 3 * n * 4);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->size, 3 * n * 4);
  EXPECT_FALSE(info->pinned);  // nothing to pin on the CPU backend
  client::CallOptions opts;
  opts.shared_output_region = "io";
  opts.shared_output_offset = n * 4;
  client::OpResult r;
  ASSERT_TRUE(c->Call(client::Op::kGelu,
                      {client::Arg::Shared({"io", 0, DType::kFloat32, {n}})}, &r, opts)
                  .ok());
  EXPECT_TRUE(r.shared);
  EXPECT_EQ(r.output.shape, std::vector<int64_t>{n});
  EXPECT_TRUE(r.output.data.empty());
  auto inline_result = c->Gelu(x);
  ASSERT_TRUE(inline_result.ok());
  EXPECT_EQ(std::memcmp(static_cast<char*>((*seg)->data()) + n * 4,
                        inline_result->output.data.data(), n * 4),
            0);
  // Operands from the region, the result inline.
  auto mm = c->MatmulRelu(client::Arg::Shared({"io", 0, DType::kFloat32, {1, n}}),
                          client::Arg::Shared({"io", 0, DType::kFloat32, {n, 1}}), nullptr);
  ASSERT_TRUE(mm.ok()) << mm.status();
  double dot = 0;
  const std::vector<float> xf = x.ToFloats();
  for (float v : xf) dot += double{v} * v;
  EXPECT_NEAR(mm->output.ToFloats()[0], dot, 1e-3 * dot);
  auto up = c->UploadShared({"io", n * 4, DType::kFloat32, {n}});
  ASSERT_TRUE(up.ok()) << up.status();
  auto down = c->Download(up->handle);
  ASSERT_TRUE(down.ok());
  EXPECT_EQ(down->data, inline_result->output.data);
  auto list = c->ListSharedMemory();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->regions.size(), 1u);
  EXPECT_EQ(list->regions[0].key, (*seg)->key());
  EXPECT_EQ(list->used_bytes, 3 * n * 4);
  // Past the region's end: INVALID_ARGUMENT, and the output bytes are untouched.
  EXPECT_EQ(c->Call(client::Op::kGelu,
                    {client::Arg::Shared({"io", 2 * n * 4 + 4, DType::kFloat32, {n}})}, &r, opts)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(c->UnregisterSharedMemory("io").ok());
  EXPECT_EQ(c->UnregisterSharedMemory("io").code(), absl::StatusCode::kNotFound);
  server.Stop();
}

}  // namespace
}  // namespace fusebox
