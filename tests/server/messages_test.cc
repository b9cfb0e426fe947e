// The service's own parse and serialize (server/rpc/messages.h): a large op request's tensor
// bytes stay in the received slices and come out exactly as sent, whatever the slicing, with
// parsing's rules on repeats and oneofs; a reply sent with its result in place is the same
// message any protobuf parser reads.
#include "server/rpc/messages.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fusebox/v1/kernel_service.pb.h"

namespace fusebox {
namespace {

// `bytes` as gRPC might hand them over: slices of `block` bytes (the last one shorter).
grpc::ByteBuffer Sliced(const std::string& bytes, size_t block) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += block) {
    slices.emplace_back(bytes.data() + at, std::min(block, bytes.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

std::string Joined(const HostPieces& pieces) {
  std::string s;
  for (const HostPiece& p : pieces) s.append(static_cast<const char*>(p.data), p.bytes);
  return s;
}

v1::GeluRequest Gelu(const std::string& data) {
  v1::GeluRequest req;
  auto* t = req.mutable_input()->mutable_tensor();
  t->set_dtype(v1::FLOAT32);
  t->add_shape(static_cast<int64_t>(data.size() / 4));
  t->set_data(data);
  return req;
}

TEST(Messages, LargeRequestTensorBytesStayInTheSlicesExactlyAsSent) {
  const std::string data = RandomBytes(1 << 20, 1);
  const std::string wire = Gelu(data).SerializeAsString();
  for (size_t block : {size_t{1} << 20, size_t{8192}, size_t{4093}, wire.size()}) {
    grpc::ByteBuffer bb = Sliced(wire, block);
    v1::GeluRequest req;
    ReceivedPayloads payloads;
    ASSERT_TRUE(ParseRequest(&bb, &req, &payloads).ok()) << block;
    EXPECT_TRUE(req.input().tensor().data().empty());
    EXPECT_EQ(req.input().tensor().shape(0), (1 << 20) / 4);
    const HostPieces* pieces = payloads.by_tensor.Find(&req.input().tensor());
    ASSERT_NE(pieces, nullptr) << block;
    EXPECT_EQ(Joined(*pieces), data) << "slices of " << block;
    EXPECT_EQ(bb.Length(), 0u);  // the request buffer itself is given back
  }
}

TEST(Messages, SmallRequestsParseWholeAsBefore) {
  const std::string data = RandomBytes(4096, 2);
  grpc::ByteBuffer bb = Sliced(Gelu(data).SerializeAsString(), 1000);
  v1::GeluRequest req;
  ReceivedPayloads payloads;
  ASSERT_TRUE(ParseRequest(&bb, &req, &payloads).ok());
  EXPECT_EQ(req.input().tensor().data(), data);
  EXPECT_EQ(payloads.by_tensor.Find(&req.input().tensor()), nullptr);
}

TEST(Messages, EveryMatmulOperandAndAnExecuteRequestKeepTheirOwnBytes) {
  v1::MatmulReluRequest m;
  const std::string a = RandomBytes(300000, 3), b = RandomBytes(200000, 4), c = RandomBytes(8, 5);
  for (auto [ref, bytes] : {std::pair{m.mutable_a(), &a}, {m.mutable_b(), &b}, {m.mutable_bias(), &c}}) {
    ref->mutable_tensor()->set_dtype(v1::FLOAT32);
    ref->mutable_tensor()->set_data(*bytes);
  }
  m.set_allow_tf32(true);
  v1::ExecuteRequest e;
  e.set_id(77);
  *e.mutable_matmul_relu() = m;
  grpc::ByteBuffer bb = Sliced(e.SerializeAsString(), 65536);
  v1::ExecuteRequest got;
  ReceivedPayloads payloads;
  ASSERT_TRUE(ParseRequest(&bb, &got, &payloads).ok());
  EXPECT_EQ(got.id(), 77u);
  EXPECT_TRUE(got.matmul_relu().allow_tf32());
  const auto& g = got.matmul_relu();
  EXPECT_EQ(Joined(*payloads.by_tensor.Find(&g.a().tensor())), a);
  EXPECT_EQ(Joined(*payloads.by_tensor.Find(&g.b().tensor())), b);
  EXPECT_EQ(Joined(*payloads.by_tensor.Find(&g.bias().tensor())), c);
}

TEST(Messages, RepeatedAndOneofFieldsFollowParsingRules) {
  const std::string first = RandomBytes(100000, 6), second = RandomBytes(100000, 7);
  // input twice, each with data: the messages merge and the last data wins.
  {
    const std::string wire = Gelu(first).SerializeAsString() + Gelu(second).SerializeAsString();
    grpc::ByteBuffer bb = Sliced(wire, 5000);
    v1::GeluRequest req;
    ReceivedPayloads payloads;
    ASSERT_TRUE(ParseRequest(&bb, &req, &payloads).ok());
    EXPECT_EQ(Joined(*payloads.by_tensor.Find(&req.input().tensor())), second);
  }
  // a tensor, then a handle in the same oneof, then a tensor with no data: parsing leaves an
  // empty tensor, so no bytes may be attached to it.
  {
    v1::GeluRequest with_handle;
    with_handle.mutable_input()->set_handle("h");
    v1::GeluRequest bare;
    bare.mutable_input()->mutable_tensor()->set_dtype(v1::FLOAT32);
    const std::string wire = Gelu(first).SerializeAsString() + with_handle.SerializeAsString() +
                             bare.SerializeAsString();
    grpc::ByteBuffer bb = Sliced(wire, 4096);
    v1::GeluRequest req, plain;
    ReceivedPayloads payloads;
    ASSERT_TRUE(ParseRequest(&bb, &req, &payloads).ok());
    ASSERT_TRUE(plain.ParseFromString(wire));
    ASSERT_TRUE(req.input().has_tensor());
    EXPECT_TRUE(plain.input().tensor().data().empty());
    EXPECT_EQ(payloads.by_tensor.Find(&req.input().tensor()), nullptr);
  }
  // a tensor, then a handle: the handle is the input; the bytes are nobody's.
  {
    v1::GeluRequest with_handle;
    with_handle.mutable_input()->set_handle("h");
    const std::string wire = Gelu(first).SerializeAsString() + with_handle.SerializeAsString();
    grpc::ByteBuffer bb = Sliced(wire, 4096);
    v1::GeluRequest req;
    ReceivedPayloads payloads;
    ASSERT_TRUE(ParseRequest(&bb, &req, &payloads).ok());
    EXPECT_EQ(req.input().handle(), "h");
  }
}

TEST(Messages, MalformedLargeRequestsAreInvalidArgument) {
  std::string wire = Gelu(RandomBytes(100000, 8)).SerializeAsString();
  for (std::string bad : {wire.substr(0, wire.size() - 1), wire + "\x0a\xff"}) {
    grpc::ByteBuffer bb = Sliced(bad, 7000);
    v1::GeluRequest req;
    ReceivedPayloads payloads;
    const absl::Status s = ParseRequest(&bb, &req, &payloads);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(req.ByteSizeLong(), 0u);
  }
}

// The reply as gRPC would send it, read back by protobuf.
template <typename Msg>
Msg ReadBack(grpc::ByteBuffer* bb) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(bb->Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  Msg m;
  EXPECT_TRUE(m.ParseFromString(bytes));
  return m;
}

HostBytes Owned(const std::string& bytes) {
  HostBytes out(static_cast<char*>(std::malloc(bytes.size())));
  std::memcpy(out.get(), bytes.data(), bytes.size());
  return out;
}

TEST(Messages, ReplySentInPlaceReadsAsTheWholeMessage) {
  const std::string result = RandomBytes(200000, 9);
  v1::GeluResponse resp;
  auto* t = resp.mutable_output()->mutable_tensor();
  t->set_dtype(v1::BFLOAT16);
  t->add_shape(100000);
  resp.mutable_timing()->set_total_us(12.5);
  resp.mutable_timing()->set_backend("cpu");
  grpc::ByteBuffer bb;
  const int64_t n = SerializeReply(resp, t, Owned(result), result.size(), &bb);
  v1::GeluResponse expect = resp;
  expect.mutable_output()->mutable_tensor()->set_data(result);
  EXPECT_EQ(n, static_cast<int64_t>(expect.ByteSizeLong()));
  const auto got = ReadBack<v1::GeluResponse>(&bb);
  EXPECT_EQ(got.output().tensor().data(), result);
  EXPECT_EQ(got.output().tensor().dtype(), v1::BFLOAT16);
  EXPECT_EQ(got.output().tensor().shape(0), 100000);
  EXPECT_EQ(got.timing().total_us(), 12.5);
  EXPECT_EQ(got.timing().backend(), "cpu");

  v1::ExecuteResponse e;
  e.set_id(5);
  auto* et = e.mutable_softmax()->mutable_output()->mutable_tensor();
  et->set_dtype(v1::FLOAT32);
  et->add_shape(2);
  et->add_shape(25000);
  e.mutable_softmax()->mutable_timing()->set_kernel_us(3);
  grpc::ByteBuffer eb;
  SerializeReply(e, et, Owned(result), result.size(), &eb);
  const auto eg = ReadBack<v1::ExecuteResponse>(&eb);
  EXPECT_EQ(eg.id(), 5u);
  EXPECT_EQ(eg.softmax().output().tensor().data(), result);
  EXPECT_EQ(eg.softmax().output().tensor().shape(1), 25000);
  EXPECT_EQ(eg.softmax().timing().kernel_us(), 3);
}

}  // namespace
}  // namespace fusebox
