// CheckWire (see wire_check.h): one pass over the wire bytes with protobuf's own reader,
// guided by the message's descriptor; nothing is allocated per field.
#include "server/core/wire_check.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace fusebox {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::io::CodedInputStream;
using google::protobuf::internal::WireFormatLite;

// Schema-bounded nesting: requests are three messages deep.
constexpr int kMaxDepth = 32;

// UTF-8 as protobuf checks it (the Unicode standard's well-formed byte sequences: no
// overlong forms, no surrogates, nothing past U+10FFFF), fed piece by piece.
class Utf8Check {
 public:
  bool Feed(const uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const uint8_t c = p[i];
      if (need_ > 0) {
        if (c < lo_ || c > hi_) return false;
        lo_ = 0x80;
        hi_ = 0xBF;
        --need_;
        continue;
      }
      if (c < 0x80) continue;
      lo_ = 0x80;
      hi_ = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) {
        need_ = 1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        need_ = 2;
        if (c == 0xE0) lo_ = 0xA0;  // no overlong forms
        if (c == 0xED) hi_ = 0x9F;  // no surrogates
      } else if (c >= 0xF0 && c <= 0xF4) {
        need_ = 3;
        if (c == 0xF0) lo_ = 0x90;  // no overlong forms
        if (c == 0xF4) hi_ = 0x8F;  // nothing past U+10FFFF
      } else {
        return false;
      }
    }
    return true;
  }
  bool Complete() const { return need_ == 0; }

 private:
  int need_ = 0;  // continuation bytes still to come
  uint8_t lo_ = 0x80, hi_ = 0xBF;  // the range of the next one
};

class WireChecker {
 public:
  explicit WireChecker(CodedInputStream* in) : in_(in) {}

  absl::Status Message(const Descriptor* type, int depth) {
    if (depth > kMaxDepth) return Malformed("it nests messages too deeply");
    for (;;) {
      const int at = in_->CurrentPosition();
      const uint32_t tag = in_->ReadTag();
      if (tag == 0) {  // the end (of the bytes, or of this message), or no tag
        const void* rest;
        int size;
        return in_->CurrentPosition() == at && !in_->GetDirectBufferPointer(&rest, &size)
                   ? absl::OkStatus()
                   : Malformed("a tag is 0, or not a varint");
      }
      const int number = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
      const WireFormatLite::WireType wire = WireFormatLite::GetTagWireType(tag);
      const FieldDescriptor* f = type->FindFieldByNumber(number);
      const WireFormatLite::WireType expected =
          f == nullptr ? wire
                       : WireFormatLite::WireTypeForFieldType(
                             static_cast<WireFormatLite::FieldType>(f->type()));
      absl::Status s;
      if (f != nullptr && wire == expected && f->type() == FieldDescriptor::TYPE_MESSAGE) {
        s = Nested(f, depth);
      } else if (f != nullptr && wire == expected && f->type() == FieldDescriptor::TYPE_STRING) {
        s = Utf8(f);
      } else if (wire > WireFormatLite::WIRETYPE_FIXED32) {
        s = Malformed("a wire type is not 0..5");
      } else if (!WireFormatLite::SkipField(in_, tag)) {
        s = Malformed("it ends inside a field");
      }
      if (!s.ok()) return s;
    }
  }

 private:
  static absl::Status Malformed(const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request is not a well-formed protobuf message: ", why));
  }

  // The length of a length-delimited field, within what its message has left.
  bool Length(uint32_t* length) {
    if (!in_->ReadVarint32(length)) return false;
    const int left = in_->BytesUntilLimit();  // -1: the whole message, to its end
    return *length <= static_cast<uint32_t>(INT32_MAX) &&
           (left < 0 || *length <= static_cast<uint32_t>(left));
  }

  absl::Status Nested(const FieldDescriptor* f, int depth) {
    uint32_t length;
    if (!Length(&length)) return Malformed("a length runs past the end");
    const CodedInputStream::Limit limit = in_->PushLimit(static_cast<int>(length));
    absl::Status s = Message(f->message_type(), depth + 1);
    if (s.ok() && in_->BytesUntilLimit() != 0) s = Malformed("a message ends early");
    in_->PopLimit(limit);
    return s;
  }

  absl::Status Utf8(const FieldDescriptor* f) {
    uint32_t length;
    if (!Length(&length)) return Malformed("a length runs past the end");
    Utf8Check check;
    bool valid = true;
    for (int64_t left = length; left > 0 && valid;) {
      const void* data;
      int size;
      if (!in_->GetDirectBufferPointer(&data, &size)) {
        return Malformed("a length runs past the end");
      }
      const int n = static_cast<int>(std::min<int64_t>(size, left));
      valid = check.Feed(static_cast<const uint8_t*>(data), static_cast<size_t>(n));
      in_->Skip(n);
      left -= n;
    }
    if (valid && check.Complete()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(f->full_name(), " is not valid UTF-8; the request was not parsed"));
  }

  CodedInputStream* const in_;
};

}  // namespace

absl::Status CheckWire(google::protobuf::io::ZeroCopyInputStream* in, const Descriptor* type) {
  CodedInputStream coded(in);
  return WireChecker(&coded).Message(type, 0);
}

}  // namespace fusebox
