// Client pieces that need no server: the hand-written request encoder matches
// protobuf byte for byte, and .npy files parse / serialize / convert as documented.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <random>

#include "client/cpp/fusebox_client.h"
#include "client/cpp/npy.h"
#include "fusebox/v1/kernel_service.pb.h"

namespace fusebox::client {
namespace {

std::string Flatten(const grpc::ByteBuffer& bb) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(bb.Dump(&slices).ok());
  std::string out;
  for (auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

void Fill(const HostTensor& t, v1::TensorRef* ref) {
  auto* p = ref->mutable_tensor();
  p->set_dtype(static_cast<v1::DType>(static_cast<int>(t.dtype)));
  for (auto d : t.shape) p->add_shape(d);
  p->set_data(t.data);
}

TEST(RequestEncoderTest, UnaryRequestMatchesProtobufBytes) {
  for (HostTensor t : {HostTensor::FromFloats(DType::kFloat32, {2, 3}, {1, 2, 3, 4, 5, 6}),
                       HostTensor{DType::kFloat16, {0, 5}, ""},
                       HostTensor{DType::kBFloat16, {}, std::string(2, 'x')},
                       HostTensor{static_cast<DType>(0), {-3, 1 << 20}, std::string(300, 'y')}}) {
    v1::GeluRequest want;
    Fill(t, want.mutable_input());
    v1::GeluRequest got;
    ASSERT_TRUE(got.ParseFromString(Flatten(EncodeRequestForTest(false, {t}, {}))));
    EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString());
    EXPECT_EQ(Flatten(EncodeRequestForTest(false, {t}, {})), want.SerializeAsString());
  }
}

TEST(RequestEncoderTest, AViewOfTheCallersMemoryEncodesAsTheSameTensorWould) {
  // A TensorView sends the caller's bytes where they are: the same message as a HostTensor,
  // whose payload slice points into the caller's memory.
  for (HostTensor t : {HostTensor::FromFloats(DType::kFloat16, {3, 7}, std::vector<float>(21, 1.5f)),
                       HostTensor{DType::kFloat32, {0, 4}, ""},
                       HostTensor{static_cast<DType>(0), {-3, 1 << 20}, std::string(300, 'y')}}) {
    const TensorView v{t.dtype, t.shape, t.data.data(), t.data.size()};
    EXPECT_EQ(Flatten(EncodeRequestForTest(false, {v}, {})),
              Flatten(EncodeRequestForTest(false, {t}, {})));
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(EncodeRequestForTest(false, {v}, {}).Dump(&slices).ok());
    const bool points_in = std::any_of(slices.begin(), slices.end(), [&](const grpc::Slice& s) {
      return s.size() == t.data.size() && s.begin() == reinterpret_cast<const uint8_t*>(t.data.data());
    });
    EXPECT_EQ(points_in, !t.data.empty());
  }
  HostTensor b = HostTensor::FromFloats(DType::kFloat32, {2, 1}, {5, 6});
  const TensorView a{DType::kFloat32, {1, 2}, b.data.data(), b.data.size()};
  CallOptions opts;
  opts.keep_on_server = true;
  const HostTensor a_copy{DType::kFloat32, {1, 2}, b.data};
  EXPECT_EQ(Flatten(EncodeRequestForTest(true, {a, b}, opts)),
            Flatten(EncodeRequestForTest(true, {a_copy, b}, opts)));
}

TEST(RequestEncoderTest, MatmulRequestMatchesProtobufBytes) {
  HostTensor a = HostTensor::FromFloats(DType::kBFloat16, {2, 2}, {1, 2, 3, 4});
  HostTensor b = HostTensor::FromFloats(DType::kBFloat16, {2, 1}, {5, 6});
  HostTensor bias = HostTensor::FromFloats(DType::kBFloat16, {1}, {7});
  CallOptions opts;
  opts.allow_tf32 = true;
  opts.impl = MatmulImpl::kTiled;
  for (bool with_bias : {false, true}) {
    v1::MatmulReluRequest want;
    Fill(a, want.mutable_a());
    Fill(b, want.mutable_b());
    if (with_bias) Fill(bias, want.mutable_bias());
    want.set_allow_tf32(true);
    want.set_impl(v1::MATMUL_IMPL_TILED);
    std::vector<Arg> args = {a, b};
    if (with_bias) args.push_back(bias);
    EXPECT_EQ(Flatten(EncodeRequestForTest(true, args, opts)), want.SerializeAsString());
  }
}

TEST(RequestEncoderTest, HandlesAndKeepOnServerMatchProtobufBytes) {
  HostTensor b = HostTensor::FromFloats(DType::kFloat32, {2, 1}, {5, 6});
  CallOptions opts;
  opts.keep_on_server = true;
  v1::MatmulReluRequest want;
  want.mutable_a()->set_handle("tensor-a");
  Fill(b, want.mutable_b());
  want.mutable_bias()->set_handle(std::string(200, 'h'));  // multi-byte length
  want.mutable_output_options()->set_keep_on_server(true);
  EXPECT_EQ(Flatten(EncodeRequestForTest(
                true, {Arg::Handle("tensor-a"), b, Arg::Handle(std::string(200, 'h'))}, opts)),
            want.SerializeAsString());
  v1::GeluRequest g;
  g.mutable_input()->set_handle("x");
  g.mutable_output_options()->set_keep_on_server(true);
  EXPECT_EQ(Flatten(EncodeRequestForTest(false, {Arg::Handle("x")}, opts)), g.SerializeAsString());
}

// Splits bytes into slices of the given sizes (the rest in one last slice).
grpc::ByteBuffer Sliced(const std::string& bytes, std::vector<size_t> sizes) {
  std::vector<grpc::Slice> slices;
  size_t pos = 0;
  for (size_t n : sizes) {
    n = std::min(n, bytes.size() - pos);
    slices.emplace_back(bytes.data() + pos, n);
    pos += n;
  }
  slices.emplace_back(bytes.data() + pos, bytes.size() - pos);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST(ResponseParserTest, ReadsTensorAndTimingAcrossSliceBoundaries) {
  v1::MatmulReluResponse resp;
  auto* t = resp.mutable_output()->mutable_tensor();
  t->set_dtype(v1::FLOAT16);
  t->add_shape(3);
  t->add_shape(300);
  std::string data(1800, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  t->set_data(data);
  auto* tm = resp.mutable_timing();
  tm->set_queue_us(1.5);
  tm->set_copy_in_us(4.5);
  tm->set_launch_us(12.25);
  tm->set_kernel_us(2.5);
  tm->set_copy_out_us(3.75);
  tm->set_total_us(9);
  tm->set_backend("cpu");
  tm->set_device("cpu");
  tm->set_stream(3);
  const std::string bytes = resp.SerializeAsString();
  for (std::vector<size_t> cut : {std::vector<size_t>{}, {1}, {3, 1, 1, 1, 700}, {5, 1000, 1}}) {
    OpResult r;
    r.output.shape = {9, 9};  // stale values must not survive
    ASSERT_TRUE(ParseResponseForTest(Sliced(bytes, cut), &r).ok());
    EXPECT_EQ(r.output.dtype, DType::kFloat16);
    EXPECT_EQ(r.output.shape, (std::vector<int64_t>{3, 300}));
    EXPECT_EQ(r.output.data, data);
    EXPECT_EQ(r.timing.queue_us, 1.5);
    EXPECT_EQ(r.timing.copy_in_us, 4.5);
    EXPECT_EQ(r.timing.launch_us, 12.25);
    EXPECT_EQ(r.timing.kernel_us, 2.5);
    EXPECT_EQ(r.timing.copy_out_us, 3.75);
    EXPECT_EQ(r.timing.total_us, 9);
    EXPECT_EQ(r.timing.backend, "cpu");
    EXPECT_EQ(r.timing.stream, 3);
    EXPECT_TRUE(r.handle.empty());
  }
}

TEST(ResponseParserTest, ReusedResultKeepsItsBuffer) {
  v1::GeluResponse resp;
  auto* t = resp.mutable_output()->mutable_tensor();
  t->set_dtype(v1::FLOAT32);
  t->add_shape(1 << 16);
  t->set_data(std::string(1 << 18, 'z'));
  const std::string bytes = resp.SerializeAsString();
  OpResult r;
  ASSERT_TRUE(ParseResponseForTest(Sliced(bytes, {4096, 4096}), &r).ok());
  const char* buffer = r.output.data.data();
  ASSERT_TRUE(ParseResponseForTest(Sliced(bytes, {100}), &r).ok());
  EXPECT_EQ(r.output.data.data(), buffer);
  EXPECT_EQ(r.output.data.size(), size_t{1} << 18);
}

TEST(ResponseParserTest, ALargeResultIsGatheredOverSeveralThreadsFromManySlices) {
  // 5 MiB + 3 bytes: past the 2 MiB below which one thread copies, cut into receive-sized
  // slices at odd places, parsed into a fresh result, a larger one and one of the same size.
  std::mt19937 rng(7);
  std::string data((size_t{5} << 20) + 3, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  v1::GeluResponse resp;
  auto* t = resp.mutable_output()->mutable_tensor();
  t->set_dtype(v1::FLOAT16);
  t->add_shape(static_cast<int64_t>(data.size() / 2));
  t->set_data(data);
  const std::string bytes = resp.SerializeAsString();
  std::vector<size_t> cut = {7};
  while (cut.size() < 90) cut.push_back(65536 - 13 + cut.size() % 29);
  for (int threads : {1, 4}) {
    OpResult fresh, larger, same;
    larger.output.data.assign(data.size() + 4096, 'x');
    same.output.data.assign(data.size(), 'x');
    const char* same_buffer = same.output.data.data();
    for (OpResult* r : {&fresh, &larger, &same}) {
      ASSERT_TRUE(ParseResponseForTest(Sliced(bytes, cut), r, threads).ok()) << threads;
      EXPECT_TRUE(r->output.data == data) << threads;
    }
    EXPECT_EQ(same.output.data.data(), same_buffer) << threads;
  }
}

TEST(ResponseParserTest, AHandleAnswerLeavesNoStaleBytesOfAReusedResult) {
  v1::GeluResponse with_tensor;
  with_tensor.mutable_output()->mutable_tensor()->set_dtype(v1::FLOAT32);
  with_tensor.mutable_output()->mutable_tensor()->add_shape(4);
  with_tensor.mutable_output()->mutable_tensor()->set_data(std::string(16, 'a'));
  v1::GeluResponse with_handle;
  with_handle.mutable_output()->set_handle("t-7");
  OpResult r;
  ASSERT_TRUE(ParseResponseForTest(Sliced(with_tensor.SerializeAsString(), {}), &r).ok());
  ASSERT_EQ(r.output.data.size(), 16u);
  ASSERT_TRUE(ParseResponseForTest(Sliced(with_handle.SerializeAsString(), {}), &r).ok());
  EXPECT_EQ(r.handle, "t-7");
  EXPECT_TRUE(r.output.data.empty());
  EXPECT_FALSE(ParseResponseForTest(Sliced(std::string("\x0a\x05\x0a\x7f", 4), {}), &r).ok());
  EXPECT_TRUE(r.output.data.empty());
}

TEST(ResponseParserTest, ReadsHandleAndRejectsGarbageAndMissingOutput) {
  v1::SoftmaxResponse resp;
  resp.mutable_output()->set_handle("t-42");
  OpResult r;
  ASSERT_TRUE(ParseResponseForTest(Sliced(resp.SerializeAsString(), {2}), &r).ok());
  EXPECT_EQ(r.handle, "t-42");
  EXPECT_FALSE(ParseResponseForTest(Sliced(std::string("\x0a\x05\x0a\x7f", 4), {}), &r).ok());
  v1::SoftmaxResponse empty;
  empty.mutable_timing()->set_total_us(1);
  EXPECT_FALSE(ParseResponseForTest(Sliced(empty.SerializeAsString(), {}), &r).ok());
}

std::string Varint(uint64_t v) {
  std::string s;
  for (; v >= 0x80; v >>= 7) s.push_back(static_cast<char>(v | 0x80));
  s.push_back(static_cast<char>(v));
  return s;
}

// A length field (key, varint length) claiming `len` bytes, followed by `body`.
std::string Field(char key, uint64_t len, const std::string& body) {
  return std::string(1, key) + Varint(len) + body;
}

// Lengths a hostile or broken server sends past the end of its reply are parse errors: no
// allocation of the claimed size, no offset that wraps.
TEST(ResponseParserTest, LengthsPastTheEndAreErrorsNotAllocations) {
  const std::string tensor = std::string("\x08\x01") + Field('\x1a', uint64_t{1} << 62, "");
  const std::string ref = Field('\x0a', tensor.size(), tensor);
  OpResult r;
  EXPECT_FALSE(ParseResponseForTest(Sliced(Field('\x0a', ref.size(), ref), {3}), &r).ok());
  for (uint64_t huge : {uint64_t{1} << 40, ~uint64_t{0} - 10}) {
    EXPECT_FALSE(ParseResponseForTest(Sliced(Field('\x0a', huge, ref), {}), &r).ok()) << huge;
    EXPECT_FALSE(ParseResponseForTest(Sliced(Field('\x12', huge, ""), {}), &r).ok()) << huge;
  }
}

TEST(ResponseParserTest, UnknownDtypeIsAnError) {
  v1::GeluResponse resp;
  auto* t = resp.mutable_output()->mutable_tensor();
  t->set_dtype(static_cast<v1::DType>(7));
  t->add_shape(1);
  t->set_data(std::string(4, '\0'));
  OpResult r;
  absl::Status s = ParseResponseForTest(Sliced(resp.SerializeAsString(), {}), &r);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("dtype 7"), absl::string_view::npos) << s;
}

TEST(HealthParserTest, ReadsTheStatusSkipsOtherFieldsAndRejectsLengthsPastTheEnd) {
  auto parse = [](const std::string& bytes) { return ParseHealthForTest(Sliced(bytes, {1})); };
  EXPECT_EQ(*parse(std::string("\x08\x01", 2)), HealthStatus::kServing);
  EXPECT_EQ(*parse(Field('\x12', 3, "abc") + std::string("\x08\x02", 2)), HealthStatus::kNotServing);
  EXPECT_EQ(*parse(""), HealthStatus::kUnknown);
  // 2^64 - 11: an offset that used to wrap to the start and loop for ever.
  EXPECT_FALSE(parse(Field('\x12', ~uint64_t{0} - 10, "")).ok());
  EXPECT_FALSE(parse(std::string("\x08", 1)).ok());
}

TEST(NpyTest, RoundTripsEveryRankThroughV1Header) {
  for (std::vector<int64_t> shape : {std::vector<int64_t>{}, {5}, {2, 3}, {2, 0, 4}}) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    NpyArray a{"<f4", shape, std::string(static_cast<size_t>(n) * 4, '\x01')};
    const std::string bytes = SerializeNpy(a);
    EXPECT_EQ(bytes[6], 1);                       // version 1.0
    const size_t hl = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    EXPECT_EQ((10 + hl) % 64, 0u);                // data aligned to 64 bytes
    auto back = ParseNpy(bytes);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->descr, "<f4");
    EXPECT_EQ(back->shape, shape);
    EXPECT_EQ(back->data, a.data);
  }
}

TEST(NpyTest, ReadsVersion2HeaderAsNumpyWritesIt) {
  std::string dict = "{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }";
  dict.append(64 - (12 + dict.size() + 1) % 64, ' ');
  dict += '\n';
  std::string f = std::string("\x93NUMPY\x02\x00", 8);
  const uint32_t hl = static_cast<uint32_t>(dict.size());
  f.append(reinterpret_cast<const char*>(&hl), 4);
  f += dict + std::string("\x00\x3c\x00\xc0", 4);  // 1.0, -2.0 in float16
  auto a = ParseNpy(f);
  ASSERT_TRUE(a.ok()) << a.status();
  auto t = NpyToTensor(*a, std::nullopt);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->dtype, DType::kFloat16);
  EXPECT_EQ(t->ToFloats(), (std::vector<float>{1.0f, -2.0f}));
}

TEST(NpyTest, RejectsBadMagicFortranOrderBigEndianAndShortData) {
  EXPECT_FALSE(ParseNpy("not an npy file at all").ok());
  NpyArray a{"<f4", {2}, std::string(8, '\0')};
  std::string good = SerializeNpy(a);
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  EXPECT_FALSE(ParseNpy(fortran).ok());
  std::string big = good;
  big.replace(big.find("<f4"), 3, ">f4");
  EXPECT_FALSE(ParseNpy(big).ok());
  EXPECT_FALSE(ParseNpy(good.substr(0, good.size() - 1)).ok());
}

TEST(NpyTest, Float64IsNarrowedAndUint16MeansBfloat16Bits) {
  double d[2] = {1.5, -3.25};
  NpyArray f8{"<f8", {2}, std::string(reinterpret_cast<char*>(d), 16)};
  auto t = NpyToTensor(f8, std::nullopt);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->dtype, DType::kFloat32);
  EXPECT_EQ(t->ToFloats(), (std::vector<float>{1.5f, -3.25f}));

  uint16_t bits[2] = {0x3fc0, 0xc050};  // 1.5, -3.25 in bfloat16
  NpyArray u2{"<u2", {2}, std::string(reinterpret_cast<char*>(bits), 4)};
  auto b = NpyToTensor(u2, std::nullopt);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->dtype, DType::kBFloat16);
  EXPECT_EQ(b->ToFloats(), (std::vector<float>{1.5f, -3.25f}));

  EXPECT_FALSE(NpyToTensor(NpyArray{"<i4", {1}, std::string(4, '\0')}, std::nullopt).ok());
}

// '<f8' to a half type rounds once, to nearest even, as if directly: through float32 it
// could round twice (1 + 2^-8 + 2^-30 landed on the tie 1 + 2^-8, then on 1.0).
TEST(NpyTest, Float64ToHalfTypesRoundsOnce) {
  struct Case {
    double x;
    DType to;
    uint16_t bits;
  };
  const double e8 = std::ldexp(1.0, -8), e11 = std::ldexp(1.0, -11), e30 = std::ldexp(1.0, -30);
  for (const Case& c : {Case{1 + e8 + e30, DType::kBFloat16, 0x3f81},
                        Case{-(1 + e8 + e30), DType::kBFloat16, 0xbf81},
                        Case{1 + e8, DType::kBFloat16, 0x3f80},      // a tie: to even
                        Case{1 + 3 * e8, DType::kBFloat16, 0x3f82},  // a tie: to even
                        Case{1 + e8 - e30, DType::kBFloat16, 0x3f80},
                        Case{1 + e11 + e30, DType::kFloat16, 0x3c01},
                        Case{1 + e11, DType::kFloat16, 0x3c00},
                        Case{1e300, DType::kBFloat16, 0x7f80},
                        Case{-1e300, DType::kFloat16, 0xfc00},
                        Case{1e-300, DType::kFloat16, 0x0000}}) {
    NpyArray f8{"<f8", {1}, std::string(reinterpret_cast<const char*>(&c.x), 8)};
    auto t = NpyToTensor(f8, c.to);
    ASSERT_TRUE(t.ok());
    uint16_t got;
    std::memcpy(&got, t->data.data(), 2);
    EXPECT_EQ(got, c.bits) << c.x << " to " << DTypeName(c.to);
  }
}

TEST(NpyTest, ShapesThatOverflowOrCarryJunkAreRejected) {
  NpyArray a{"<f4", {2}, std::string(8, '\0')};
  const std::string good = SerializeNpy(a);
  ASSERT_TRUE(ParseNpy(good).ok());
  for (const char* shape : {"(4611686018427387904,)", "(2 3,)", "(2x,)"}) {
    std::string bad = good;
    bad.replace(bad.find("(2,)"), 4, shape);
    // Keep the header length: pad or trim the spaces before its newline.
    const size_t nl = bad.find('\n');
    const int diff = static_cast<int>(bad.size()) - static_cast<int>(good.size());
    if (diff > 0) bad.erase(nl - diff, diff);
    if (diff < 0) bad.insert(nl, -diff, ' ');
    ASSERT_EQ(bad.size(), good.size()) << shape;
    EXPECT_FALSE(ParseNpy(bad).ok()) << shape;
  }
}

TEST(NpyTest, RequestedDtypeConvertsAndBfloat16IsWrittenAsFloat32OrBits) {
  NpyArray f4 = TensorToNpy(HostTensor::FromFloats(DType::kFloat32, {3}, {1.0f, 1.00390625f, -2.0f}));
  auto t = NpyToTensor(f4, DType::kBFloat16);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->dtype, DType::kBFloat16);
  EXPECT_EQ(t->data.size(), 6u);
  EXPECT_EQ(t->ToFloats(), (std::vector<float>{1.0f, 1.0f, -2.0f}));  // ties to even

  NpyArray as_f4 = TensorToNpy(*t);
  EXPECT_EQ(as_f4.descr, "<f4");
  EXPECT_EQ(as_f4.data.size(), 12u);
  NpyArray as_bits = TensorToNpy(*t, /*bf16_bits=*/true);
  EXPECT_EQ(as_bits.descr, "<u2");
  EXPECT_EQ(as_bits.data, t->data);
}

TEST(HostTensorTest, NumElementsFlagsNegativeAndOverflowingShapes) {
  EXPECT_EQ((HostTensor{DType::kFloat32, {}, ""}.NumElements()), 1);
  EXPECT_EQ((HostTensor{DType::kFloat32, {3, 0}, ""}.NumElements()), 0);
  EXPECT_EQ((HostTensor{DType::kFloat32, {-1, 2}, ""}.NumElements()), -1);
  EXPECT_EQ((HostTensor{DType::kFloat32, {int64_t{1} << 40, int64_t{1} << 40}, ""}.NumElements()), -1);
}

TEST(DTypeNameTest, ParsesCanonicalNamesAndAliases) {
  DType d;
  EXPECT_TRUE(ParseDType("bfloat16", &d));
  EXPECT_EQ(d, DType::kBFloat16);
  EXPECT_TRUE(ParseDType("fp16", &d));
  EXPECT_EQ(d, DType::kFloat16);
  EXPECT_FALSE(ParseDType("int8", &d));
}

}  // namespace
}  // namespace fusebox::client
