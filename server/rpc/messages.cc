// ParseRequest and SerializeReply (see messages.h). A large op request is walked once more than a
// small one (CheckWire, then the strip walk below, both skipping the tensor bytes without touching
// them); what protobuf then parses is only the request's small fields.
#include "server/rpc/messages.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "server/core/wire_check.h"

namespace fusebox {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::internal::WireFormatLite;

// Whether a message of type `d` can hold a fusebox.v1.Tensor through singular message fields
// (Tensor itself included): the only fields the strip walk descends into.
bool HoldsTensor(const Descriptor* d) {
  static const auto* holders = [] {
    auto* set = new absl::flat_hash_set<const Descriptor*>{v1::Tensor::descriptor()};
    const auto* file = v1::Tensor::descriptor()->file();
    for (bool grew = true; grew;) {  // a fixed point over the file's messages
      grew = false;
      for (int i = 0; i < file->message_type_count(); ++i) {
        const Descriptor* m = file->message_type(i);
        for (int f = 0; f < m->field_count() && !set->contains(m); ++f) {
          const FieldDescriptor* fd = m->field(f);
          if (fd->type() == FieldDescriptor::TYPE_MESSAGE && !fd->is_repeated() &&
              set->contains(fd->message_type())) {
            set->insert(m);
            grew = true;
          }
        }
      }
    }
    return set;
  }();
  return holders->contains(d);
}

// A Tensor.data left on the wire: the field numbers from the request down to its Tensor, and
// where its bytes lie in the request.
struct Found {
  std::vector<int> path;
  int64_t pos, len;
};

bool StartsWith(const std::vector<int>& path, const std::vector<int>& prefix) {
  return path.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), path.begin());
}

// Copies the fields of a message of type `d` from `in` (up to its limit) into *out, leaving out
// every Tensor.data within, whose place goes into *found instead. Follows parsing's rules on
// repeats (the last Tensor.data of a Tensor wins: Find looks from the back) and on oneofs (setting
// one member drops what was found under another). False: not well-formed (the caller then lets
// protobuf parse the request, which reports why).
bool Strip(CodedInputStream* in, const Descriptor* d, std::vector<int>* path, std::string* out,
           std::vector<Found>* found, int depth) {
  if (depth > 8) return false;  // no fusebox request nests deeper
  google::protobuf::io::StringOutputStream sink(out);
  CodedOutputStream os(&sink);
  const bool tensor = d == v1::Tensor::descriptor();
  for (;;) {
    const uint32_t tag = in->ReadTag();
    if (tag == 0) return in->ConsumedEntireMessage();
    const int number = static_cast<int>(tag >> 3);
    const FieldDescriptor* fd = d->FindFieldByNumber(number);
    if (fd != nullptr && fd->containing_oneof() != nullptr) {
      const auto* oneof = fd->containing_oneof();
      for (int i = 0; i < oneof->field_count(); ++i) {
        if (oneof->field(i) == fd) continue;
        path->push_back(oneof->field(i)->number());
        found->erase(std::remove_if(found->begin(), found->end(),
                                    [&](const Found& f) { return StartsWith(f.path, *path); }),
                     found->end());
        path->pop_back();
      }
    }
    const bool delimited = (tag & 7) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    if (fd != nullptr && delimited && tensor && number == v1::Tensor::kDataFieldNumber) {
      uint64_t len;
      if (!in->ReadVarint64(&len) || len > INT_MAX) return false;
      found->push_back({*path, in->CurrentPosition(), static_cast<int64_t>(len)});
      if (!in->Skip(static_cast<int>(len))) return false;
      continue;
    }
    if (fd != nullptr && delimited && fd->type() == FieldDescriptor::TYPE_MESSAGE &&
        !fd->is_repeated() && HoldsTensor(fd->message_type())) {
      uint64_t len;
      if (!in->ReadVarint64(&len) || len > INT_MAX) return false;
      const auto limit = in->PushLimit(static_cast<int>(len));
      std::string sub;
      path->push_back(number);
      const bool ok = Strip(in, fd->message_type(), path, &sub, found, depth + 1);
      path->pop_back();
      in->PopLimit(limit);
      if (!ok) return false;
      os.WriteTag(tag);
      os.WriteVarint64(sub.size());
      os.WriteString(sub);
      continue;
    }
    if (!WireFormatLite::SkipField(in, tag, &os)) return false;
  }
}

// The bytes [pos, pos + len) of `slices` (laid end to end), as pieces.
HostPieces PiecesOf(const std::vector<grpc::Slice>& slices, int64_t pos, int64_t len) {
  HostPieces out;
  int64_t base = 0;
  for (const grpc::Slice& s : slices) {
    if (len == 0) break;
    const int64_t size = static_cast<int64_t>(s.size());
    if (pos < base + size) {
      const int64_t off = pos - base, k = std::min(len, size - off);
      out.push_back({s.begin() + off, static_cast<size_t>(k)});
      pos += k;
      len -= k;
    }
    base += size;
  }
  return out;
}

// The message `path` names within `msg`, or null where a field on the way is not set.
const Message* Follow(const Message& msg, const std::vector<int>& path) {
  const Message* m = &msg;
  for (int number : path) {
    const FieldDescriptor* fd = m->GetDescriptor()->FindFieldByNumber(number);
    const auto* r = m->GetReflection();
    if (fd == nullptr || !r->HasField(*m, fd)) return nullptr;
    m = &r->GetMessage(*m, fd);
  }
  return m;
}

// The set singular message fields that lead from `msg` down to `target`, outermost first.
bool ChainTo(const Message& msg, const Message* target,
             std::vector<std::pair<const Message*, const FieldDescriptor*>>* chain) {
  if (&msg == target) return true;
  const auto* r = msg.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(msg, &fields);
  for (const FieldDescriptor* fd : fields) {
    if (fd->type() != FieldDescriptor::TYPE_MESSAGE || fd->is_repeated()) continue;
    chain->push_back({&msg, fd});
    if (ChainTo(r->GetMessage(msg, fd), target, chain)) return true;
    chain->pop_back();
  }
  return false;
}

void AppendVarint(std::string* s, uint64_t v) {
  while (v >= 0x80) {
    s->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  s->push_back(static_cast<char>(v));
}

void AppendDelimitedKey(std::string* s, int number, uint64_t len) {
  AppendVarint(s, (static_cast<uint64_t>(number) << 3) | WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
  AppendVarint(s, len);
}

}  // namespace

absl::Status ParseRequest(const grpc::ByteBuffer* wire, google::protobuf::Message* msg) {
  // The handler's request buffer is gRPC's, made for this call alone: emptying it early is ours
  // to do, and frees the request's bytes while the call computes.
  auto* bytes = const_cast<grpc::ByteBuffer*>(wire);
  absl::Status s;
  {
    grpc::ByteBuffer view(*bytes);  // shares the slices
    grpc::ProtoBufferReader reader(&view);
    s = reader.status().ok() ? CheckWire(&reader, msg->GetDescriptor())
                             : absl::InvalidArgumentError("the request body cannot be read");
  }
  if (s.ok()) {
    grpc::ByteBuffer view(*bytes);
    grpc::ProtoBufferReader reader(&view);
    if (!msg->ParseFromZeroCopyStream(&reader)) {
      s = absl::InvalidArgumentError(absl::StrCat("the request is not a valid ",
                                                  msg->GetDescriptor()->full_name()));
    }
  }
  bytes->Clear();
  if (!s.ok()) msg->Clear();
  return s;
}

absl::Status ParseRequest(const grpc::ByteBuffer* wire, google::protobuf::Message* msg,
                          ReceivedPayloads* payloads) {
  if (static_cast<int64_t>(wire->Length()) < kSentInPlaceBytes) return ParseRequest(wire, msg);
  auto* bytes = const_cast<grpc::ByteBuffer*>(wire);
  {
    grpc::ByteBuffer view(*bytes);
    grpc::ProtoBufferReader reader(&view);
    absl::Status s = reader.status().ok()
                         ? CheckWire(&reader, msg->GetDescriptor())
                         : absl::InvalidArgumentError("the request body cannot be read");
    if (!s.ok()) {
      bytes->Clear();
      return s;
    }
  }
  std::string stripped;
  std::vector<Found> found;
  bool walked;
  {
    grpc::ByteBuffer view(*bytes);
    grpc::ProtoBufferReader reader(&view);
    CodedInputStream in(&reader);
    std::vector<int> path;
    walked = Strip(&in, msg->GetDescriptor(), &path, &stripped, &found, 0);
  }
  if (!walked) return ParseRequest(wire, msg);  // protobuf says what is wrong
  if (!msg->ParseFromString(stripped)) {
    bytes->Clear();
    msg->Clear();
    return absl::InvalidArgumentError(
        absl::StrCat("the request is not a valid ", msg->GetDescriptor()->full_name()));
  }
  if (!found.empty() && !bytes->Dump(&payloads->slices).ok()) {
    bytes->Clear();
    msg->Clear();
    return absl::InvalidArgumentError("the request body cannot be read");
  }
  bytes->Clear();  // the slices that hold tensor bytes live on in payloads->slices
  for (const Found& f : found) {
    const Message* tensor = Follow(*msg, f.path);
    if (tensor == nullptr) continue;  // replaced by another member of its oneof
    payloads->by_tensor.Add(static_cast<const v1::Tensor*>(tensor),
                            PiecesOf(payloads->slices, f.pos, f.len));
  }
  return absl::OkStatus();
}

int64_t SerializeReply(const google::protobuf::Message& msg, grpc::ByteBuffer* wire) {
  wire->Clear();  // gRPC's serializer writes only into an empty buffer
  bool own = false;
  grpc::SerializationTraits<google::protobuf::Message>::Serialize(msg, wire, &own);
  return static_cast<int64_t>(wire->Length());
}

int64_t SerializeReply(const google::protobuf::Message& msg,
                       const google::protobuf::Message* holder, int field, HostBytes data,
                       size_t bytes, grpc::ByteBuffer* wire) {
  std::vector<std::pair<const Message*, const FieldDescriptor*>> chain;
  const FieldDescriptor* fd = holder->GetDescriptor()->FindFieldByNumber(field);
  if (fd == nullptr || fd->type() != FieldDescriptor::TYPE_BYTES || fd->is_repeated() ||
      !holder->GetReflection()->GetString(*holder, fd).empty() || !ChainTo(msg, holder, &chain)) {
    wire->Clear();  // a reply the service built wrongly: a bug, never the client's doing
    return -1;
  }
  // Fields may come in any order and a message field's pieces merge, so each level is its other
  // fields, then the field leading down; the innermost ends with data's key and length, and the
  // bytes follow as a slice of their own.
  std::string head = holder->SerializeAsString();
  AppendDelimitedKey(&head, field, bytes);
  for (auto level = chain.rbegin(); level != chain.rend(); ++level) {
    std::unique_ptr<Message> rest(level->first->New());
    rest->CopyFrom(*level->first);
    rest->GetReflection()->ClearField(rest.get(), level->second);
    std::string outer = rest->SerializeAsString();
    AppendDelimitedKey(&outer, level->second->number(), head.size() + bytes);
    head = std::move(outer) + head;
  }
  // The bytes' owner travels with the slice: gRPC drops it (and so frees them) once sent.
  char* at = data.get();
  auto* owner = new HostBytes(std::move(data));
  grpc::Slice slices[2] = {
      grpc::Slice(head),
      grpc::Slice(at, bytes, [](void* o) { delete static_cast<HostBytes*>(o); }, owner)};
  grpc::ByteBuffer out(slices, bytes > 0 ? 2 : 1);
  wire->Swap(&out);
  return static_cast<int64_t>(wire->Length());
}

}  // namespace fusebox
