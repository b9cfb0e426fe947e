// CheckWire: requests that would swell in parsing, or make protobuf log, are refused on the
// wire; every request a client library sends passes.
#include "server/core/wire_check.h"

#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <gtest/gtest.h>

#include <string>

#include "fusebox/v1/kernel_service.pb.h"

namespace fusebox {
namespace {

// CheckWire over `bytes` handed out `block` bytes at a time (gRPC hands a request over in
// slices; a field may span any number of them).
absl::Status Check(const std::string& bytes, const google::protobuf::Descriptor* type,
                   int block = -1) {
  google::protobuf::io::ArrayInputStream in(bytes.data(), static_cast<int>(bytes.size()), block);
  return CheckWire(&in, type);
}

std::string Varint(uint64_t v) {
  std::string out;
  do {
    out += static_cast<char>((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v > 0);
  return out;
}

std::string Len(int field, const std::string& body) {
  return Varint(static_cast<uint64_t>(field) << 3 | 2) + Varint(body.size()) + body;
}

const auto* const kGelu = v1::GeluRequest::descriptor();
const auto* const kFree = v1::FreeTensorRequest::descriptor();

TEST(WireCheck, WhatClientsSendPasses) {
  v1::MatmulReluRequest m;
  for (auto* t : {m.mutable_a()->mutable_tensor(), m.mutable_b()->mutable_tensor()}) {
    t->set_dtype(v1::BFLOAT16);
    t->add_shape(3);
    t->add_shape(3);
    t->set_data(std::string(18, '\x7f'));
  }
  m.mutable_bias()->set_handle("t-0123456789abcdef");
  m.set_allow_tf32(true);
  m.mutable_output_options()->set_keep_on_server(true);
  std::string bytes;
  ASSERT_TRUE(m.SerializeToString(&bytes));
  for (int block : {-1, 1, 2, 7}) {
    EXPECT_TRUE(Check(bytes, v1::MatmulReluRequest::descriptor(), block).ok()) << block;
  }
  v1::GeluRequest g;  // 64 axes of large sizes, packed, as protobuf writes them
  for (int i = 0; i < 64; ++i) g.mutable_input()->mutable_tensor()->add_shape(int64_t{1} << 62);
  ASSERT_TRUE(g.SerializeToString(&bytes));
  EXPECT_TRUE(Check(bytes, kGelu, 3).ok());
  EXPECT_TRUE(Check("", kGelu).ok());  // every field at its default
}

TEST(WireCheck, AShapeIsHeldTo64ValuesPackedOrNotAndAcrossMergedMessages) {
  auto tensor_with = [](const std::string& shape_fields) {
    return Len(1, Len(1, std::string("\x08\x01", 2) + shape_fields));  // input.tensor
  };
  const std::string packed65 = Len(2, std::string(65, '\x01'));
  const absl::Status s = Check(tensor_with(packed65), kGelu, 5);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "fusebox.v1.Tensor.shape has more than 64 values (a tensor has at most 64 axes); the "
            "request was not parsed");
  EXPECT_TRUE(Check(tensor_with(Len(2, std::string(64, '\x01'))), kGelu).ok());
  std::string unpacked;
  for (int i = 0; i < 65; ++i) unpacked += std::string("\x10\x01", 2);
  EXPECT_FALSE(Check(tensor_with(unpacked), kGelu).ok());
  // 40 packed and 40 unpacked in one message, or in two occurrences of it (they merge).
  const std::string packed40 = Len(2, std::string(40, '\x01'));
  const std::string unpacked40 = unpacked.substr(0, 80);
  EXPECT_FALSE(Check(tensor_with(packed40 + unpacked40), kGelu).ok());
  EXPECT_FALSE(Check(tensor_with(packed40) + tensor_with(packed40), kGelu).ok());
  // Each tensor of a request has its own 64.
  const std::string a = Len(1, Len(1, packed40)), b = Len(2, Len(1, packed40));
  EXPECT_TRUE(Check(a + b, v1::MatmulReluRequest::descriptor()).ok());
  // A packed run is refused at its 65th value, however long it goes on.
  EXPECT_FALSE(Check(tensor_with(Len(2, std::string(50 << 20, '\x01'))), kGelu).ok());
}

TEST(WireCheck, UnknownFieldsAreHeldTo1024AndGroupsRefused) {
  std::string few, many;
  for (int i = 0; i < 1024; ++i) few += std::string("\xa0\x01\x00", 3);  // field 20, empty
  many = few + std::string("\xa8\x01\x05", 3);                           // field 21, varint
  EXPECT_TRUE(Check(few, kGelu).ok());
  const absl::Status s = Check(many, kGelu);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("more than 1024 fields"), std::string::npos) << s.message();
  // A known field in the wrong wire type is an unknown field too.
  std::string wrong;
  for (int i = 0; i < 1025; ++i) wrong += std::string("\x7d\x00\x00\x00\x00", 5);  // 15, fixed32
  EXPECT_FALSE(Check(Len(15, wrong), kGelu).ok());
  EXPECT_FALSE(Check(std::string("\xa3\x01\xa4\x01", 4), kGelu).ok());  // an empty group
}

TEST(WireCheck, StringsMustBeUtf8AsProtobufChecksThem) {
  const std::string valid[] = {"", "plain", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                               "\xef\xbf\xbf", "\xf4\x8f\xbf\xbf", "\xed\x9f\xbf"};
  const std::string invalid[] = {"\xc3",             "\xc3\x28",         "\xc0\x80",
                                 "\xe0\x80\x80",     "\xed\xa0\x80",     "\xf4\x90\x80\x80",
                                 "\xf0\x80\x80\x80", "\xf8\x88\x80\x80", "\x80",
                                 "\xe2\x82"};
  for (int block : {-1, 1}) {
    for (const std::string& v : valid) {
      EXPECT_TRUE(Check(Len(1, "h" + v + "h"), kFree, block).ok()) << v;
    }
    for (const std::string& v : invalid) {
      const absl::Status s = Check(Len(1, "h" + v), kFree, block);
      EXPECT_EQ(s.message(),
                "fusebox.v1.FreeTensorRequest.handle is not valid UTF-8; the request was not "
                "parsed")
          << v;
    }
  }
  EXPECT_FALSE(Check(Len(1, Len(2, "\xff")), kGelu).ok());  // input.handle
  EXPECT_TRUE(Check(Len(1, Len(1, Len(3, "\xff\xfe"))), kGelu).ok());  // bytes are bytes
}

TEST(WireCheck, WhatIsNotProtobufIsRefused) {
  for (const std::string& bytes :
       {std::string("\x00", 1), std::string("\x0a\x05\x01", 3), std::string("\x0a", 1),
        std::string("\x08\xff\xff", 3), std::string("\x0e\x00", 2), std::string("\x0f", 1),
        Len(1, std::string("\x0a\x09", 2)), std::string(11, '\xff')}) {
    const absl::Status s = Check(bytes, kGelu);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << testing::PrintToString(bytes);
    EXPECT_NE(s.message().find("not a well-formed protobuf message"), std::string::npos)
        << s.message();
  }
  std::string deep = "";
  for (int i = 0; i < 40; ++i) deep = Len(1, deep);  // unknown past depth 2: skipped whole
  EXPECT_TRUE(Check(deep, kGelu).ok());
}

}  // namespace
}  // namespace fusebox
