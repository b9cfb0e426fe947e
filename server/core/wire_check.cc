// CheckWire (see wire_check.h): one pass over the wire bytes with protobuf's own reader,
// guided by the message's descriptor; nothing is allocated per field.
#include "server/core/wire_check.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/request.h"

namespace fusebox {
namespace {

static_assert(kMaxRepeated == kMaxRank, "a shape's axes are a repeated field's values");

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
      if (f != nullptr && wire == expected) {
        if (f->is_repeated()) {
          if (auto c = Count(f, 1); !c.ok()) return c;
        }
        if (f->type() == FieldDescriptor::TYPE_GROUP) {
          s = Malformed("it has a group, which this API never uses");
        } else if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
          s = Nested(f, depth);
        } else if (f->type() == FieldDescriptor::TYPE_STRING) {
          s = Utf8(f);
        } else if (!WireFormatLite::SkipField(in_, tag)) {
          s = Malformed("it ends inside a field");
        }
      } else if (f != nullptr && f->is_packable() &&
                 wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        s = Packed(f);
      } else {
        s = Unknown(tag);
      }
      if (!s.ok()) return s;
    }
  }

 private:
  static absl::Status Malformed(const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request is not a well-formed protobuf message: ", why));
  }

  // Adds `n` values to repeated field `f` at the current path (singular messages merge when
  // they occur again, so their fields' values add up).
  absl::Status Count(const FieldDescriptor* f, int64_t n) {
    path_.push_back(f);
    auto it = std::find_if(counts_.begin(), counts_.end(),
                           [&](const auto& c) { return c.first == path_; });
    if (it == counts_.end()) it = counts_.insert(counts_.end(), {path_, 0});
    path_.pop_back();
    it->second += n;
    if (it->second > kMaxRepeated) {
      return absl::InvalidArgumentError(absl::StrCat(
          f->full_name(), " has more than ", kMaxRepeated, " values",
          f->name() == "shape" ? absl::StrCat(" (a tensor has at most ", kMaxRank, " axes)") : "",
          "; the request was not parsed"));
    }
    return absl::OkStatus();
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
    path_.push_back(f);
    absl::Status s = Message(f->message_type(), depth + 1);
    path_.pop_back();
    if (s.ok() && in_->BytesUntilLimit() != 0) s = Malformed("a message ends early");
    in_->PopLimit(limit);
    return s;
  }

  // A packed run of scalars: counted without being read when their size is fixed.
  absl::Status Packed(const FieldDescriptor* f) {
    uint32_t length;
    if (!Length(&length)) return Malformed("a length runs past the end");
    const WireFormatLite::WireType one =
        WireFormatLite::WireTypeForFieldType(static_cast<WireFormatLite::FieldType>(f->type()));
    const int fixed = one == WireFormatLite::WIRETYPE_FIXED32   ? 4
                      : one == WireFormatLite::WIRETYPE_FIXED64 ? 8
                                                                : 0;
    if (fixed > 0) {
      if (length % fixed != 0) return Malformed("a packed field's length is not whole values");
      if (auto s = Count(f, length / fixed); !s.ok()) return s;
      return in_->Skip(static_cast<int>(length)) ? absl::OkStatus()
                                                  : Malformed("a length runs past the end");
    }
    const CodedInputStream::Limit limit = in_->PushLimit(static_cast<int>(length));
    absl::Status s;
    while (s.ok() && in_->BytesUntilLimit() > 0) {
      uint64_t v;
      s = in_->ReadVarint64(&v) ? Count(f, 1) : Malformed("it ends inside a varint");
    }
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

  absl::Status Unknown(uint32_t tag) {
    const WireFormatLite::WireType wire = WireFormatLite::GetTagWireType(tag);
    if (wire == WireFormatLite::WIRETYPE_START_GROUP ||
        wire == WireFormatLite::WIRETYPE_END_GROUP) {
      return Malformed("it has a group, which this API never uses");
    }
    if (wire > WireFormatLite::WIRETYPE_FIXED32) return Malformed("a wire type is not 0..5");
    if (++unknown_ > kMaxUnknownFields) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the request has more than ", kMaxUnknownFields,
          " fields this server does not know (or of the wrong wire type); it was not parsed"));
    }
    return WireFormatLite::SkipField(in_, tag) ? absl::OkStatus()
                                               : Malformed("it ends inside a field");
  }

  CodedInputStream* const in_;
  std::vector<const FieldDescriptor*> path_;  // the message fields walked into
  std::vector<std::pair<std::vector<const FieldDescriptor*>, int64_t>> counts_;
  int unknown_ = 0;
};

}  // namespace

absl::Status CheckWire(google::protobuf::io::ZeroCopyInputStream* in, const Descriptor* type) {
  CodedInputStream coded(in);
  return WireChecker(&coded).Message(type, 0);
}

}  // namespace fusebox
