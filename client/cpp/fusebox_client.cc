// fusebox C++ client (see fusebox_client.h): hand-encoded zero-copy requests over
// a generic stub, responses parsed by hand from the received slices (only Timing
// through protobuf), one completion queue per thread.
#include "client/cpp/fusebox_client.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpcpp/client_context.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/parallel_copy.h"

namespace fusebox::client {
namespace {

namespace pb = ::fusebox::v1;
using Clock = std::chrono::steady_clock;

void PutVarint(std::string* s, uint64_t v) {
  while (v >= 0x80) {
    s->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  s->push_back(static_cast<char>(v));
}
size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) { v >>= 7; ++n; }
  return n;
}

// Waits until grpc has dropped every reference to the caller's payload slices,
// so the caller may free its tensors as soon as a call returns.
class SliceRefs {
 public:
  static void Release(void* self) {
    auto* r = static_cast<SliceRefs*>(self);
    std::lock_guard<std::mutex> lock(r->mu_);
    if (--r->live_ == 0) r->cv_.notify_all();
  }
  grpc::Slice Wrap(const std::string& bytes) { return Wrap(bytes.data(), bytes.size()); }
  grpc::Slice Wrap(const void* data, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++live_;
    }
    return grpc::Slice(const_cast<void*>(data), bytes, &SliceRefs::Release, this);
  }
  void WaitAllReleased() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return live_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int live_ = 0;
};

void FillShared(const SharedRef& s, pb::SharedTensor* out) {
  out->set_region(s.region);
  out->set_offset(s.offset);
  out->set_dtype(static_cast<pb::DType>(static_cast<int>(s.dtype)));
  for (int64_t d : s.shape) out->add_shape(d);
}

pb::OutputOptions OutputOptionsOf(const CallOptions& opts) {
  pb::OutputOptions o;
  o.set_keep_on_server(opts.keep_on_server);
  if (!opts.shared_output_region.empty()) {
    o.mutable_shared()->set_region(opts.shared_output_region);
    o.mutable_shared()->set_offset(opts.shared_output_offset);
  }
  return o;
}

// Request fields: input = 1 (or a = 1, b = 2, bias = 3), allow_tf32 = 4,
// impl = 5, output_options = 15. A field's bytes: TensorRef { tensor = 1 | handle = 2 }.
// An inline input's bytes, from a HostTensor or a TensorView; none for a handle or shared ref.
struct InlineBytes {
  DType dtype;
  const std::vector<int64_t>* shape;
  const void* data;
  size_t size;
};
std::optional<InlineBytes> InlineOf(const Arg& a) {
  if (const HostTensor* t = a.tensor()) {
    return InlineBytes{t->dtype, &t->shape, t->data.data(), t->data.size()};
  }
  if (const TensorView* v = a.view()) return InlineBytes{v->dtype, &v->shape, v->data, v->bytes};
  return std::nullopt;
}

grpc::ByteBuffer Encode(bool matmul, const std::vector<Arg>& inputs, const CallOptions& opts,
                        SliceRefs* refs) {
  std::vector<grpc::Slice> slices;
  std::string head;
  for (size_t i = 0; i < inputs.size(); ++i) {
    head.push_back(static_cast<char>(((i + 1) << 3) | 2));  // request field i+1, LEN
    if (const SharedRef* s = inputs[i].shared(); s != nullptr) {  // small: protobuf encodes it
      pb::TensorRef ref;
      FillShared(*s, ref.mutable_shared());
      const std::string bytes = ref.SerializeAsString();
      PutVarint(&head, bytes.size());
      head += bytes;
      continue;
    }
    const std::optional<InlineBytes> t = InlineOf(inputs[i]);
    if (!t) {
      const std::string& h = inputs[i].handle();
      PutVarint(&head, 1 + VarintSize(h.size()) + h.size());
      head.push_back(0x12);  // TensorRef.handle
      PutVarint(&head, h.size());
      head += h;
      continue;
    }
    std::string hdr;  // Tensor fields before the payload
    if (static_cast<int>(t->dtype) != 0) {
      hdr.push_back(0x08);
      PutVarint(&hdr, static_cast<uint64_t>(static_cast<int64_t>(t->dtype)));
    }
    if (!t->shape->empty()) {
      std::string packed;
      for (int64_t d : *t->shape) PutVarint(&packed, static_cast<uint64_t>(d));
      hdr.push_back(0x12);
      PutVarint(&hdr, packed.size());
      hdr += packed;
    }
    if (t->size > 0) {
      hdr.push_back(0x1a);
      PutVarint(&hdr, t->size);
    }
    const uint64_t tensor_len = hdr.size() + t->size;
    PutVarint(&head, 1 + VarintSize(tensor_len) + tensor_len);
    head.push_back(0x0a);  // TensorRef.tensor
    PutVarint(&head, tensor_len);
    head += hdr;
    if (t->size > 0) {
      slices.emplace_back(head);
      head.clear();
      slices.push_back(refs ? refs->Wrap(t->data, t->size)
                            : grpc::Slice(t->data, t->size, grpc::Slice::STATIC_SLICE));
    }
  }
  if (matmul && opts.allow_tf32) head += std::string("\x20\x01", 2);
  if (matmul && opts.impl != MatmulImpl::kDefault) {
    head.push_back(0x28);
    PutVarint(&head, static_cast<uint64_t>(opts.impl));
  }
  if (opts.keep_on_server || !opts.shared_output_region.empty()) {  // OutputOptions = 15
    const std::string bytes = OutputOptionsOf(opts).SerializeAsString();
    head.push_back(0x7a);
    PutVarint(&head, bytes.size());
    head += bytes;
  }
  if (!head.empty() || slices.empty()) slices.emplace_back(head);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

void FillRef(const Arg& arg, pb::TensorRef* ref) {
  if (arg.shared() != nullptr) {
    FillShared(*arg.shared(), ref->mutable_shared());
    return;
  }
  const std::optional<InlineBytes> t = InlineOf(arg);
  if (!t) {
    ref->set_handle(arg.handle());
    return;
  }
  pb::Tensor* out = ref->mutable_tensor();
  out->set_dtype(static_cast<pb::DType>(static_cast<int>(t->dtype)));
  for (int64_t d : *t->shape) out->add_shape(d);
  out->set_data(static_cast<const char*>(t->data), t->size);
}

template <typename Req>
grpc::ByteBuffer Serialize(const Req& req) {
  grpc::ByteBuffer bb;
  bool own = false;
  grpc::SerializationTraits<Req>::Serialize(req, &bb, &own);
  return bb;
}

grpc::ByteBuffer EncodeProtobuf(bool matmul, const std::vector<Arg>& inputs, const CallOptions& opts) {
  if (!matmul) {
    pb::GeluRequest req;  // Gelu/Softmax/RowSum requests share one wire layout
    FillRef(inputs[0], req.mutable_input());
    *req.mutable_output_options() = OutputOptionsOf(opts);
    return Serialize(req);
  }
  pb::MatmulReluRequest req;
  FillRef(inputs[0], req.mutable_a());
  FillRef(inputs[1], req.mutable_b());
  if (inputs.size() > 2) FillRef(inputs[2], req.mutable_bias());
  req.set_allow_tf32(opts.allow_tf32);
  req.set_impl(static_cast<pb::MatmulImpl>(opts.impl));
  *req.mutable_output_options() = OutputOptionsOf(opts);
  return Serialize(req);
}

// A dtype the server sent: one this client knows, else an error naming it.
absl::Status CheckServerDType(DType d) {
  if (d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("the server sent dtype ", static_cast<int>(d),
                                          ", which this client does not know"));
}

// Reads protobuf wire data straight out of a response's slices (no flattening).
// Lengths read with Length() are at most what is left, so a hostile length never
// becomes an allocation or an offset past the end.
class SliceReader {
 public:
  // copy_threads: as Client::Options::copy_threads, for Gather.
  explicit SliceReader(const std::vector<grpc::Slice>& slices, int copy_threads = 0)
      : s_(slices), copy_threads_(copy_threads) {
    for (const auto& s : slices) total_ += s.size();
    Normalize();
  }
  size_t pos() const { return pos_; }
  size_t total() const { return total_; }
  bool Length(uint64_t* v) { return Varint(v) && *v <= total_ - pos_; }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (i_ >= s_.size()) return false;
      const uint8_t b = s_[i_].begin()[off_];
      Advance(1);
      *v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  // Appends the next n bytes to *out, or skips them when out is null.
  bool Take(uint64_t n, std::string* out) {
    while (n > 0) {
      if (i_ >= s_.size()) return false;
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, s_[i_].size() - off_));
      if (out) out->append(reinterpret_cast<const char*>(s_[i_].begin()) + off_, k);
      Advance(k);
      n -= k;
    }
    return true;
  }
  // Copies the next n bytes to out.
  bool CopyTo(uint64_t n, char* out) {
    while (n > 0) {
      if (i_ >= s_.size()) return false;
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, s_[i_].size() - off_));
      std::memcpy(out, s_[i_].begin() + off_, k);
      out += k;
      Advance(k);
      n -= k;
    }
    return true;
  }
  // Copies the next n bytes to out, a large run split over copy_threads_ threads
  // (kernels/cpu/parallel_copy.h).
  bool Gather(uint64_t n, char* out) {
    if (n > total_ - pos_) return false;
    HostPieces pieces;
    pieces.reserve(s_.size() - i_);
    for (size_t j = i_; j < s_.size(); ++j) pieces.push_back({s_[j].begin(), s_[j].size()});
    return GatherPieces(pieces, off_, out, static_cast<size_t>(n), copy_threads_) &&
           Take(n, nullptr);
  }
  // True when Gather would split n bytes over more than one thread.
  bool GathersInParallel(uint64_t n) const {
    return CopyThreads(copy_threads_) > 1 && n >= 2 * kCopyPartBytes;
  }
  bool Skip(int wire) {
    uint64_t v;
    switch (wire) {
      case 0: return Varint(&v);
      case 1: return Take(8, nullptr);
      case 2: return Length(&v) && Take(v, nullptr);
      case 5: return Take(4, nullptr);
      default: return false;
    }
  }

 private:
  void Advance(size_t k) {
    off_ += k;
    pos_ += k;
    Normalize();
  }
  void Normalize() {
    while (i_ < s_.size() && off_ >= s_[i_].size()) {
      off_ = 0;
      ++i_;
    }
  }
  const std::vector<grpc::Slice>& s_;
  const int copy_threads_;
  size_t i_ = 0, off_ = 0, pos_ = 0, total_ = 0;
};

// Tensor { dtype = 1; repeated int64 shape = 2; bytes data = 3; }
bool ParseTensor(SliceReader& r, size_t end, HostTensor* t) {
  while (r.pos() < end) {
    uint64_t key, v;
    if (!r.Varint(&key)) return false;
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (field == 1 && wire == 0) {
      if (!r.Varint(&v)) return false;
      t->dtype = static_cast<DType>(static_cast<int>(v));
    } else if (field == 2 && wire == 2) {  // packed
      if (!r.Length(&v)) return false;
      const size_t e = r.pos() + v;
      while (r.pos() < e) {
        uint64_t d;
        if (!r.Varint(&d)) return false;
        t->shape.push_back(static_cast<int64_t>(d));
      }
    } else if (field == 2 && wire == 0) {  // unpacked
      if (!r.Varint(&v)) return false;
      t->shape.push_back(static_cast<int64_t>(v));
    } else if (field == 3 && wire == 2) {
      if (!r.Length(&v)) return false;
      if (r.GathersInParallel(v)) {
        // resize fills only bytes the string did not have: none for a result reused for the
        // same shape, which is overwritten in place.
        t->data.resize(v);
        if (!r.Gather(v, t->data.data())) return false;
      } else if (t->data.size() == v) {
        if (!r.CopyTo(v, t->data.data())) return false;
      } else {
        // clear() keeps the capacity; append touches each new page once.
        t->data.clear();
        t->data.reserve(v);
        if (!r.Take(v, &t->data)) return false;
      }
    } else if (!r.Skip(wire)) {
      return false;
    }
  }
  return r.pos() == end;
}

// Every op response: { TensorRef output = 1; Timing timing = 2; }, with
// TensorRef { oneof { Tensor tensor = 1; string handle = 2; } }: its fields from r's position to
// `end` (a whole response, or one inside an ExecuteResponse).
absl::Status ParseOpResponse(SliceReader& r, size_t end, OpResult* result) {
  HostTensor& out = result->output;
  out.dtype = static_cast<DType>(0);
  out.shape.clear();
  // out.data keeps its bytes until the tensor's arrive (ParseTensor overwrites them in place).
  result->handle.clear();
  result->shared = false;
  result->timing = Timing();
  bool has_tensor = false;
  auto bad = [&out] {
    out.data.clear();
    return absl::InternalError("cannot parse the server's response");
  };
  while (r.pos() < end) {
    uint64_t key, len;
    if (!r.Varint(&key)) return bad();
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (field == 1 && wire == 2) {
      if (!r.Length(&len)) return bad();
      const size_t ref_end = r.pos() + len;
      while (r.pos() < ref_end) {
        uint64_t k2, l2;
        if (!r.Varint(&k2)) return bad();
        if (k2 == ((1 << 3) | 2)) {
          if (!r.Length(&l2) || !ParseTensor(r, r.pos() + l2, &out)) return bad();
          has_tensor = true;
        } else if (k2 == ((2 << 3) | 2)) {
          if (!r.Length(&l2)) return bad();
          result->handle.clear();
          if (!r.Take(l2, &result->handle)) return bad();
        } else if (k2 == ((3 << 3) | 2)) {  // TensorRef.shared: the output went into a region
          std::string bytes;
          pb::SharedTensor st;
          if (!r.Length(&l2) || !r.Take(l2, &bytes) || !st.ParseFromString(bytes)) return bad();
          out.dtype = static_cast<DType>(st.dtype());
          out.shape.assign(st.shape().begin(), st.shape().end());
          result->shared = true;
        } else if (!r.Skip(static_cast<int>(k2 & 7))) {
          return bad();
        }
      }
    } else if (field == 2 && wire == 2) {
      std::string bytes;
      pb::Timing tm;
      if (!r.Length(&len) || !r.Take(len, &bytes) || !tm.ParseFromString(bytes)) return bad();
      Timing& o = result->timing;
      o.queue_us = tm.queue_us();
      o.copy_in_us = tm.copy_in_us();
      o.launch_us = tm.launch_us();
      o.kernel_us = tm.kernel_us();
      o.copy_out_us = tm.copy_out_us();
      o.total_us = tm.total_us();
      o.backend = tm.backend();
      o.device = tm.device();
      o.stream = tm.stream();
    } else if (!r.Skip(wire)) {
      return bad();
    }
  }
  if (r.pos() != end) return bad();
  if (!has_tensor) out.data.clear();
  if (!has_tensor && result->handle.empty() && !result->shared) {
    return absl::InternalError("server response has no output tensor");
  }
  return has_tensor || result->shared ? CheckServerDType(out.dtype) : absl::OkStatus();
}

absl::Status ParseResponse(const grpc::ByteBuffer& bb, OpResult* result, int copy_threads) {
  std::vector<grpc::Slice> slices;
  if (!bb.Dump(&slices).ok()) return absl::InternalError("cannot read the server's response");
  SliceReader r(slices, copy_threads);
  return ParseOpResponse(r, r.total(), result);
}

// ExecuteResponse { uint64 id = 1; oneof { the four op responses = 2..5; Status error = 6; } },
// Status { int32 code = 1; string message = 2; }.
absl::Status ParseExecuteResponse(const grpc::ByteBuffer& bb, ExecuteResult* out) {
  std::vector<grpc::Slice> slices;
  if (!bb.Dump(&slices).ok()) return absl::InternalError("cannot read the server's response");
  SliceReader r(slices);
  auto bad = [] { return absl::InternalError("cannot parse the server's Execute response"); };
  out->id = 0;
  out->status = absl::InternalError("the server's Execute response has no result");
  while (r.pos() < r.total()) {
    uint64_t key, v;
    if (!r.Varint(&key)) return bad();
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (field == 1 && wire == 0) {
      if (!r.Varint(&out->id)) return bad();
    } else if (field >= 2 && field <= 5 && wire == 2) {
      if (!r.Length(&v)) return bad();
      out->status = ParseOpResponse(r, r.pos() + v, &out->result);
    } else if (field == 6 && wire == 2) {
      if (!r.Length(&v)) return bad();
      const size_t end = r.pos() + v;
      uint64_t code = static_cast<uint64_t>(absl::StatusCode::kUnknown);
      std::string message;
      while (r.pos() < end) {
        uint64_t k2;
        if (!r.Varint(&k2)) return bad();
        if (k2 == ((1 << 3) | 0)) {
          if (!r.Varint(&code)) return bad();
        } else if (k2 == ((2 << 3) | 2)) {
          uint64_t n;
          message.clear();
          if (!r.Length(&n) || !r.Take(n, &message)) return bad();
        } else if (!r.Skip(static_cast<int>(k2 & 7))) {
          return bad();
        }
      }
      // A code outside gRPC's is UNKNOWN, and an error is never OK.
      const int c = static_cast<int>(static_cast<uint32_t>(code));
      out->status = absl::Status(
          c > 0 && c <= 16 ? static_cast<absl::StatusCode>(c) : absl::StatusCode::kUnknown,
          message);
    } else if (!r.Skip(wire)) {
      return bad();
    }
  }
  return absl::OkStatus();
}

// HealthCheckResponse { ServingStatus status = 1; }: reads field 1, skips others.
absl::StatusOr<HealthStatus> ParseHealth(const grpc::ByteBuffer& response) {
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("cannot read the health response");
  SliceReader r(slices);
  uint64_t status = 0;
  while (r.pos() < r.total()) {
    uint64_t key;
    if (!r.Varint(&key)) return absl::InternalError("cannot parse the health response");
    const bool ok = key == ((1 << 3) | 0) ? r.Varint(&status) : r.Skip(static_cast<int>(key & 7));
    if (!ok) return absl::InternalError("cannot parse the health response");
  }
  return static_cast<HealthStatus>(status <= 3 ? status : 0);
}

// One completion queue per calling thread, reused by its synchronous calls.
struct ThreadCq {
  grpc::CompletionQueue cq;
  ~ThreadCq() {
    cq.Shutdown();
    void* tag;
    bool ok;
    while (cq.Next(&tag, &ok)) {
    }
  }
};

}  // namespace

int64_t HostTensor::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

HostTensor HostTensor::FromFloats(DType dtype, std::vector<int64_t> shape,
                                  const std::vector<float>& values) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(values.size() * ElementSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) StoreFromFloat(dtype, t.data.data(), i, values[i]);
  return t;
}

std::vector<float> HostTensor::ToFloats() const {
  const size_t n = data.size() / ElementSize(dtype);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = LoadAsFloat(dtype, data.data(), i);
  return out;
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

bool ParseDType(const std::string& name, DType* out) {
  if (name == "float32" || name == "f32" || name == "fp32") *out = DType::kFloat32;
  else if (name == "float16" || name == "f16" || name == "fp16" || name == "half") *out = DType::kFloat16;
  else if (name == "bfloat16" || name == "bf16") *out = DType::kBFloat16;
  else return false;
  return true;
}

absl::Status ParseResponseForTest(const grpc::ByteBuffer& response, OpResult* result,
                                  int copy_threads) {
  return ParseResponse(response, result, copy_threads);
}

absl::StatusOr<HealthStatus> ParseHealthForTest(const grpc::ByteBuffer& response) {
  return ParseHealth(response);
}

grpc::ByteBuffer EncodeRequestForTest(bool matmul, const std::vector<Arg>& inputs,
                                      const CallOptions& opts) {
  return Encode(matmul, inputs, opts, nullptr);
}

Client::Client(std::shared_ptr<grpc::Channel> channel, Options options)
    : channel_(std::move(channel)),
      stub_(std::make_unique<grpc::GenericStub>(channel_)),
      kernel_stub_(v1::KernelService::NewStub(channel_)),
      options_(options) {}

absl::Status LoadTlsFiles(const std::string& ca_file, const std::string& cert_file,
                          const std::string& key_file, TlsOptions* tls) {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate and its key come together (both for mTLS, or neither)");
  }
  const std::pair<const std::string*, std::string*> files[] = {
      {&ca_file, &tls->root_certs}, {&cert_file, &tls->cert_chain}, {&key_file, &tls->private_key}};
  for (const auto& [path, pem] : files) {
    if (path->empty()) continue;
    errno = 0;
    std::ifstream f(*path, std::ios::binary);
    std::ostringstream text;
    if (!(f && text << f.rdbuf())) {
      const int err = errno != 0 ? errno : EIO;
      return absl::ErrnoToStatus(err, *path);
    }
    *pem = text.str();
  }
  tls->enabled = true;
  return absl::OkStatus();
}

namespace {

// A channel to `target`; transfer >= 0 makes one for parallel transfers, on a connection of its
// own (a subchannel pool of its own, and an argument no other channel has).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const Client::Options& options, int transfer) {
  grpc::ChannelArguments args;
  if (transfer >= 0) {
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("fusebox.transfer_connection", transfer);
  }
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  // No transparent retries: they would hold (and may copy) large payloads.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  for (const auto& [key, value] : options.channel_args) args.SetInt(key, value);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls.on()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls.root_certs;
    ssl.pem_cert_chain = options.tls.cert_chain;
    ssl.pem_private_key = options.tls.private_key;
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls.server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls.server_name);
    }
  }
  return grpc::CreateCustomChannel(target, credentials, args);
}

}  // namespace

std::unique_ptr<Client> Client::Create(const std::string& target, Options options) {
  std::unique_ptr<Client> c(new Client(MakeChannel(target, options, -1), options));
  c->target_ = target;
  return c;
}

std::vector<grpc::Channel*> Client::TransferChannels(int n) {
  std::vector<grpc::Channel*> out = {channel_.get()};
  std::lock_guard<std::mutex> lock(transfer_mu_);
  while (static_cast<int>(transfer_channels_.size()) < n - 1) {
    const int i = static_cast<int>(transfer_channels_.size());
    transfer_channels_.push_back(MakeChannel(target_, options_, i));
  }
  for (int i = 0; i + 1 < n; ++i) out.push_back(transfer_channels_[i].get());
  return out;
}

bool Client::WaitForReady(std::chrono::milliseconds timeout) {
  return channel_->WaitForConnected(std::chrono::system_clock::now() + timeout);
}

absl::Status Client::UnaryCall(const std::string& method, const grpc::ByteBuffer& request,
                               grpc::ByteBuffer* response, std::chrono::milliseconds timeout,
                               const std::string& handle) {
  thread_local ThreadCq tcq;
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout, handle);
  grpc::Status status;
  {
    auto call = stub_->PrepareUnaryCall(&ctx, method, request, &tcq.cq);
    call->StartCall();
    call->Finish(response, &status, call.get());
    void* tag = nullptr;
    bool ok = false;
    if (!tcq.cq.Next(&tag, &ok)) return absl::InternalError("completion queue shut down");
  }
  return FromGrpc(status);
}

absl::Status Client::Call(Op op, const std::vector<Arg>& inputs, OpResult* result,
                          const CallOptions& opts) {
  static const char* kMethods[] = {"/fusebox.v1.KernelService/Gelu",
                                   "/fusebox.v1.KernelService/Softmax",
                                   "/fusebox.v1.KernelService/RowSum",
                                   "/fusebox.v1.KernelService/MatmulRelu"};
  const bool matmul = op == Op::kMatmulRelu;
  const int count = static_cast<int>(inputs.size());
  if (count != (matmul ? 2 : 1) && !(matmul && count == 3)) {
    return absl::InvalidArgumentError(matmul ? "matmul_relu takes a, b and an optional bias"
                                             : "this op takes one input");
  }
  const auto start = Clock::now();
  grpc::ByteBuffer response;
  absl::Status st;
  {
    SliceRefs refs;
    {
      grpc::ByteBuffer request =
          options_.request_path == RequestPath::kZeroCopy
              ? Encode(matmul, inputs, opts, &refs)
              : EncodeProtobuf(matmul, inputs, opts);
      // The first input given by handle says which replica the call must reach.
      std::string routed;
      for (const Arg& a : inputs) {
        if (!a.handle().empty()) {
          routed = a.handle();
          break;
        }
      }
      st = UnaryCall(kMethods[static_cast<int>(op)], request, &response, opts.timeout, routed);
    }
    refs.WaitAllReleased();
  }
  if (!st.ok()) return st;
  st = ParseResponse(response, result, options_.copy_threads);
  if (!st.ok()) return st;
  result->timing.rpc_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  return absl::OkStatus();
}

absl::Status Client::CallEncoded(const std::string& method, const HostPieces& request,
                                 grpc::ByteBuffer* response, std::chrono::milliseconds timeout,
                                 const std::string& handle) {
  absl::Status st;
  SliceRefs refs;
  {
    std::vector<grpc::Slice> slices;
    slices.reserve(request.size());
    for (const HostPiece& p : request) {
      if (p.bytes > 0) slices.push_back(refs.Wrap(p.data, p.bytes));
    }
    grpc::ByteBuffer buffer(slices.data(), slices.size());
    slices.clear();
    st = UnaryCall(method, buffer, response, timeout, handle);
  }
  refs.WaitAllReleased();  // gRPC holds no reference to the caller's bytes past here
  return st;
}

absl::StatusOr<OpResult> Client::Run(Op op, std::vector<Arg> inputs, const CallOptions& opts) {
  OpResult result;
  absl::Status st = Call(op, inputs, &result, opts);
  if (!st.ok()) return st;
  return result;
}

absl::StatusOr<OpResult> Client::Gelu(const Arg& input, const CallOptions& opts) {
  return Run(Op::kGelu, {input}, opts);
}
absl::StatusOr<OpResult> Client::Softmax(const Arg& input, const CallOptions& opts) {
  return Run(Op::kSoftmax, {input}, opts);
}
absl::StatusOr<OpResult> Client::RowSum(const Arg& input, const CallOptions& opts) {
  return Run(Op::kRowSum, {input}, opts);
}
absl::StatusOr<OpResult> Client::MatmulRelu(const Arg& a, const Arg& b, const HostTensor* bias,
                                            const CallOptions& opts) {
  if (bias) return Run(Op::kMatmulRelu, {a, b, *bias}, opts);
  return Run(Op::kMatmulRelu, {a, b}, opts);
}
absl::StatusOr<OpResult> Client::MatmulRelu(const Arg& a, const Arg& b, const Arg& bias,
                                            const CallOptions& opts) {
  return Run(Op::kMatmulRelu, {a, b, bias}, opts);
}

std::string ReplicaOf(const std::string& handle) {
  const size_t dot = handle.find('.');
  return dot == std::string::npos ? std::string() : handle.substr(0, dot);
}

void Client::PrepareTransfer(grpc::ClientContext* ctx, const grpc::Channel* channel) const {
  // A connection opened for this transfer that fails its first connect (seen under load in
  // CI: one of 8 fresh connections refused) retries until the call's deadline instead of
  // failing the whole transfer; the server was reached on the client's own channel already.
  if (channel != channel_.get()) ctx->set_wait_for_ready(true);
}

void Client::Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds timeout,
                     const std::string& handle) const {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    (timeout.count() > 0 ? timeout : options_.default_timeout));
  if (!options_.auth_token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.auth_token);
  if (const std::string replica = ReplicaOf(handle); !replica.empty()) {
    ctx->AddMetadata(kReplicaHeader, replica);
  }
}

namespace {
TensorInfo FromProto(const pb::TensorInfo& p) {
  TensorInfo t;
  t.handle = p.handle();
  t.dtype = static_cast<DType>(static_cast<int>(p.dtype()));
  t.shape.assign(p.shape().begin(), p.shape().end());
  t.size_bytes = p.size_bytes();
  t.created_unix_ms = p.created_unix_ms();
  t.last_used_unix_ms = p.last_used_unix_ms();
  return t;
}
}  // namespace

absl::StatusOr<TensorInfo> Client::Upload(const HostTensor& tensor, int64_t chunk_bytes,
                                          std::chrono::milliseconds timeout,
                                          const TransferProgress& progress) {
  if (chunk_bytes <= 0) return absl::InvalidArgumentError("chunk_bytes must be > 0");
  if (options_.transfer_connections > 1 &&
      static_cast<int64_t>(tensor.data.size()) >= options_.parallel_min_bytes) {
    return UploadRanged(tensor, 0, timeout, progress);
  }
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  pb::UploadResponse resp;
  auto writer = kernel_stub_->Upload(&ctx, &resp);
  pb::UploadRequest msg;
  msg.set_dtype(static_cast<pb::DType>(static_cast<int>(tensor.dtype)));
  for (int64_t d : tensor.shape) msg.add_shape(d);
  size_t sent = 0;
  do {  // the header goes with the first chunk; an empty tensor is one message
    const size_t n = std::min(tensor.data.size() - sent, static_cast<size_t>(chunk_bytes));
    msg.set_data(tensor.data.data() + sent, n);
    sent += n;
    if (!writer->Write(msg)) break;  // the server ended the call; Finish says why
    if (progress) progress(static_cast<int64_t>(sent), static_cast<int64_t>(tensor.data.size()));
    msg.clear_dtype();
    msg.clear_shape();
  } while (sent < tensor.data.size());
  writer->WritesDone();
  absl::Status st = FromGrpc(writer->Finish());
  if (!st.ok()) return st;
  return FromProto(resp.tensor());
}

absl::StatusOr<HostTensor> Client::Download(const std::string& handle,
                                            std::chrono::milliseconds timeout,
                                            const TransferProgress& progress) {
  if (options_.transfer_connections > 1) {
    // The size decides, so ask for it first: one small call, against a transfer worth splitting.
    auto info = StatTensor(handle);
    if (!info.ok()) return info.status();
    if (info->size_bytes >= options_.parallel_min_bytes) {
      return DownloadRanged(handle, 0, timeout, progress);
    }
  }
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout, handle);
  pb::DownloadRequest req;
  req.set_handle(handle);
  auto reader = kernel_stub_->Download(&ctx, req);
  pb::DownloadResponse msg;
  HostTensor out;
  bool header = false;
  int64_t size_bytes = 0;
  while (reader->Read(&msg)) {
    if (msg.has_tensor() && !header) {
      header = true;
      out.dtype = static_cast<DType>(static_cast<int>(msg.tensor().dtype()));
      out.shape.assign(msg.tensor().shape().begin(), msg.tensor().shape().end());
      size_bytes = std::max<int64_t>(0, msg.tensor().size_bytes());
      // The size is the server's word: one this host cannot hold ends the call with an error.
      try {
        out.data.reserve(static_cast<size_t>(size_bytes));
      } catch (const std::exception&) {
        ctx.TryCancel();
        reader->Finish();
        return absl::ResourceExhaustedError(absl::StrCat(
            "the tensor is ", size_bytes, " bytes: more than this client can allocate"));
      }
    }
    out.data += msg.data();
    if (progress) progress(static_cast<int64_t>(out.data.size()), size_bytes);
  }
  absl::Status st = FromGrpc(reader->Finish());
  if (!st.ok()) return st;
  if (!header) return absl::InternalError("download stream carried no tensor header");
  if (absl::Status d = CheckServerDType(out.dtype); !d.ok()) return d;
  if (static_cast<int64_t>(out.data.size()) != size_bytes) {
    return absl::InternalError(absl::StrCat("the download carried ", out.data.size(),
                                            " bytes of a tensor of ", size_bytes));
  }
  return out;
}

namespace {

// Progress across a transfer's threads: one callback at a time, the count never going back.
class SharedProgress {
 public:
  SharedProgress(const TransferProgress& progress, int64_t total)
      : progress_(progress), total_(total) {}
  void Add(int64_t n) {
    if (!progress_) return;
    std::lock_guard<std::mutex> lock(mu_);
    done_ += n;
    progress_(done_, total_);
  }

 private:
  const TransferProgress& progress_;
  const int64_t total_;
  std::mutex mu_;
  int64_t done_ = 0;
};

// The first error of a transfer's threads; the others stop at their next range.
class FirstError {
 public:
  void Set(absl::Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = std::move(s);
    failed_ = true;
  }
  bool failed() const { return failed_.load(); }
  absl::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  std::mutex mu_;
  absl::Status status_;
  std::atomic<bool> failed_{false};
};

// A ranged transfer's fan-out over its connections: one worker a connection, taking the
// transfer's ranges in order (next) until none is left; the bytes moved (progress) and the
// first error, which stops every worker at its next range, are shared.
struct RangeFanOut {
  RangeFanOut(int64_t size, int64_t range, const TransferProgress& progress)
      : ranges((size + range - 1) / range), moved(progress, size) {}
  // As many connections as asked, but no more than there are ranges, and at least one.
  int Connections(int asked) const {
    return static_cast<int>(std::min<int64_t>(asked, std::max<int64_t>(1, ranges)));
  }
  // Runs work(channel) on every one of `channels` at once, the first on this thread and each
  // other on a thread of its own; returns the first error once all have ended.
  template <typename Work>
  absl::Status Run(const std::vector<grpc::Channel*>& channels, const Work& work) {
    std::vector<std::thread> threads;
    for (size_t i = 1; i < channels.size(); ++i) threads.emplace_back(work, channels[i]);
    work(channels[0]);
    for (auto& t : threads) t.join();
    return error.status();
  }

  const int64_t ranges;
  std::atomic<int64_t> next{0};
  SharedProgress moved;
  FirstError error;
};

}  // namespace

absl::StatusOr<TensorInfo> Client::UploadRanged(const HostTensor& tensor, int connections,
                                                std::chrono::milliseconds timeout,
                                                const TransferProgress& progress) {
  if (connections <= 0) connections = std::max(1, options_.transfer_connections);
  const int64_t range = std::max<int64_t>(1, options_.range_bytes);
  const int64_t size = static_cast<int64_t>(tensor.data.size());
  std::string id;
  {
    grpc::ClientContext ctx;
    Prepare(&ctx, timeout);
    pb::CreateUploadRequest req;
    req.set_dtype(static_cast<pb::DType>(static_cast<int>(tensor.dtype)));
    for (int64_t d : tensor.shape) req.add_shape(d);
    pb::CreateUploadResponse resp;
    absl::Status st = FromGrpc(kernel_stub_->CreateUpload(&ctx, req, &resp));
    if (!st.ok()) return st;
    if (resp.size_bytes() != size) {
      // The server sized it from dtype and shape; sending other bytes cannot succeed.
      grpc::ClientContext actx;
      Prepare(&actx, {}, resp.upload_id());
      pb::AbortUploadRequest areq;
      areq.set_upload_id(resp.upload_id());
      pb::AbortUploadResponse aresp;
      kernel_stub_->AbortUpload(&actx, areq, &aresp);
      return absl::InvalidArgumentError(absl::StrCat(
          "the tensor's data is ", size, " bytes; its dtype and shape make ", resp.size_bytes()));
    }
    id = resp.upload_id();
  }
  RangeFanOut fan(size, range, progress);
  const std::vector<grpc::Channel*> channels = TransferChannels(fan.Connections(connections));
  // Each thread: one WriteUpload stream on its connection, taking the next range until none is
  // left; each message is one chunk of at most 4 MiB (gRPC's default receive limit's size),
  // encoded by hand around a slice that points at the caller's bytes: no client-side copy.
  static const grpc::internal::RpcMethod kWrite("/fusebox.v1.KernelService/WriteUpload",
                                                grpc::internal::RpcMethod::CLIENT_STREAMING);
  auto work = [&](grpc::Channel* channel) {
    // The first range before the stream: one that would carry no message is never opened (the
    // server refuses a WriteUpload that names no upload).
    int64_t r = fan.next.fetch_add(1);
    if (r >= fan.ranges || fan.error.failed()) return;
    grpc::ClientContext ctx;
    Prepare(&ctx, timeout, id);
    PrepareTransfer(&ctx, channel);
    grpc::ByteBuffer resp;
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel, kWrite, &ctx,
                                                                      &resp));
    constexpr int64_t kChunk = int64_t{4} << 20;
    bool open = true, first = true;
    for (; open && !fan.error.failed() && r < fan.ranges; r = fan.next.fetch_add(1)) {
      for (int64_t off = r * range, end = std::min(size, off + range); off < end;) {
        const int64_t n = std::min(kChunk, end - off);
        // WriteUploadRequest { string upload_id = 1; int64 offset = 2; bytes data = 3; }
        std::string head;
        if (first) {
          head.push_back(0x0a);
          PutVarint(&head, id.size());
          head += id;
        }
        head.push_back(0x10);
        PutVarint(&head, static_cast<uint64_t>(off));
        head.push_back(0x1a);
        PutVarint(&head, static_cast<uint64_t>(n));
        grpc::Slice slices[2] = {
            grpc::Slice(head),
            grpc::Slice(tensor.data.data() + off, static_cast<size_t>(n),
                        grpc::Slice::STATIC_SLICE)};  // alive until the call has finished
        grpc::ByteBuffer msg(slices, 2);
        if (!writer->Write(msg)) {  // the server ended the call; Finish says why
          open = false;
          break;
        }
        first = false;
        fan.moved.Add(n);
        off += n;
      }
    }
    writer->WritesDone();
    absl::Status st = FromGrpc(writer->Finish());
    if (!st.ok()) fan.error.Set(st);
  };
  absl::Status st = fan.Run(channels, work);
  if (st.ok()) {
    grpc::ClientContext ctx;
    Prepare(&ctx, timeout, id);
    pb::CommitUploadRequest req;
    req.set_upload_id(id);
    pb::CommitUploadResponse resp;
    st = FromGrpc(kernel_stub_->CommitUpload(&ctx, req, &resp));
    if (st.ok()) return FromProto(resp.tensor());
  }
  // Give the reservation back now rather than after the server's idle timeout.
  grpc::ClientContext ctx;
  Prepare(&ctx, {}, id);
  pb::AbortUploadRequest req;
  req.set_upload_id(id);
  pb::AbortUploadResponse resp;
  kernel_stub_->AbortUpload(&ctx, req, &resp);
  return st;
}

absl::StatusOr<HostTensor> Client::DownloadRanged(const std::string& handle, int connections,
                                                  std::chrono::milliseconds timeout,
                                                  const TransferProgress& progress) {
  auto info = StatTensor(handle);
  if (!info.ok()) return info.status();
  HostTensor out;
  out.dtype = info->dtype;
  out.shape = info->shape;
  if (absl::Status d = CheckServerDType(out.dtype); !d.ok()) return d;
  const int64_t size = std::max<int64_t>(0, info->size_bytes);
  try {  // the size is the server's word: one this host cannot hold is an error
    out.data.resize(static_cast<size_t>(size));
  } catch (const std::exception&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the tensor is ", size, " bytes: more than this client can allocate"));
  }
  if (absl::Status st = DownloadRangesInto(handle, out.data.data(), size, connections, timeout,
                                           progress);
      !st.ok()) {
    return st;
  }
  return out;
}

absl::StatusOr<TensorInfo> Client::DownloadInto(const std::string& handle, void* dst,
                                                size_t capacity, int connections,
                                                std::chrono::milliseconds timeout,
                                                const TransferProgress& progress) {
  auto info = StatTensor(handle);
  if (!info.ok()) return info.status();
  if (absl::Status d = CheckServerDType(info->dtype); !d.ok()) return d;
  const int64_t size = std::max<int64_t>(0, info->size_bytes);
  if (static_cast<uint64_t>(size) > capacity) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", handle, "' is ", size,
                                                   " bytes; the destination holds ", capacity));
  }
  if (absl::Status st = DownloadRangesInto(handle, static_cast<char*>(dst), size, connections,
                                           timeout, progress);
      !st.ok()) {
    return st;
  }
  return *info;
}

absl::Status Client::DownloadRangesInto(const std::string& handle, char* dst, int64_t size,
                                        int connections, std::chrono::milliseconds timeout,
                                        const TransferProgress& progress) {
  if (connections <= 0) connections = std::max(1, options_.transfer_connections);
  const int64_t range = std::max<int64_t>(1, options_.range_bytes);
  RangeFanOut fan(size, range, progress);
  const std::vector<grpc::Channel*> channels = TransferChannels(fan.Connections(connections));
  // Each thread: one ranged Download at a time on its connection, each message's data copied
  // from gRPC's receive slices straight into place (no message parsed first).
  static const grpc::internal::RpcMethod kDownload("/fusebox.v1.KernelService/Download",
                                                   grpc::internal::RpcMethod::SERVER_STREAMING);
  auto work = [&](grpc::Channel* channel) {
    for (int64_t r; !fan.error.failed() && (r = fan.next.fetch_add(1)) < fan.ranges;) {
      const int64_t begin = r * range, len = std::min(range, size - begin);
      grpc::ClientContext ctx;
      Prepare(&ctx, timeout, handle);
      PrepareTransfer(&ctx, channel);
      pb::DownloadRequest req;
      req.set_handle(handle);
      req.set_offset(begin);
      req.set_length(len);
      std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
          grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel, kDownload, &ctx,
                                                                        Serialize(req)));
      grpc::ByteBuffer msg;
      int64_t got = 0;
      absl::Status bad;
      while (bad.ok() && reader->Read(&msg)) {
        // DownloadResponse { TensorInfo tensor = 1; bytes data = 2; }
        std::vector<grpc::Slice> slices;
        if (!msg.Dump(&slices).ok()) {
          bad = absl::InternalError("a download message could not be read");
          break;
        }
        SliceReader rd(slices);
        uint64_t tag = 0, n = 0;
        while (bad.ok() && rd.pos() < rd.total()) {
          if (!rd.Varint(&tag)) {
            bad = absl::InternalError("a download message is malformed");
          } else if (tag == 0x12) {
            if (!rd.Length(&n) || got + static_cast<int64_t>(n) > len ||
                !rd.CopyTo(n, dst + begin + got)) {
              bad = absl::InternalError(absl::StrCat(
                  "a ranged download of ", len, " bytes at ", begin, " sent more, or bad bytes"));
            } else {
              got += static_cast<int64_t>(n);
              fan.moved.Add(static_cast<int64_t>(n));
            }
          } else if (!rd.Skip(static_cast<int>(tag & 7))) {
            bad = absl::InternalError("a download message is malformed");
          }
        }
      }
      if (!bad.ok()) ctx.TryCancel();
      absl::Status st = FromGrpc(reader->Finish());
      if (!bad.ok()) st = bad;
      if (st.ok() && got != len) {
        st = absl::InternalError(absl::StrCat("a ranged download of ", len, " bytes at ", begin,
                                              " carried ", got));
      }
      if (!st.ok()) {
        fan.error.Set(st);
        return;
      }
    }
  };
  return fan.Run(channels, work);
}

absl::StatusOr<int64_t> Client::FreeTensor(const std::string& handle) {
  grpc::ClientContext ctx;
  Prepare(&ctx, {}, handle);
  pb::FreeTensorRequest req;
  req.set_handle(handle);
  pb::FreeTensorResponse resp;
  absl::Status st = FromGrpc(kernel_stub_->FreeTensor(&ctx, req, &resp));
  if (!st.ok()) return st;
  return resp.freed_bytes();
}

absl::StatusOr<TensorList> Client::ListTensors() {
  grpc::ClientContext ctx;
  Prepare(&ctx, {});
  pb::ListTensorsRequest req;
  pb::ListTensorsResponse resp;
  absl::Status st = FromGrpc(kernel_stub_->ListTensors(&ctx, req, &resp));
  if (!st.ok()) return st;
  TensorList out;
  for (const auto& t : resp.tensors()) out.tensors.push_back(FromProto(t));
  out.used_bytes = resp.used_bytes();
  out.quota_bytes = resp.quota_bytes();
  return out;
}

absl::StatusOr<TensorInfo> Client::StatTensor(const std::string& handle) {
  grpc::ClientContext ctx;
  Prepare(&ctx, {}, handle);
  pb::ListTensorsRequest req;
  req.set_handle(handle);
  pb::ListTensorsResponse resp;
  absl::Status st = FromGrpc(kernel_stub_->ListTensors(&ctx, req, &resp));
  if (!st.ok()) return st;
  if (resp.tensors_size() != 1) return absl::NotFoundError("no tensor " + handle);
  return FromProto(resp.tensors(0));
}

absl::StatusOr<TensorInfo> Client::UploadShared(const SharedRef& source,
                                                std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  pb::UploadResponse resp;
  auto writer = kernel_stub_->Upload(&ctx, &resp);
  pb::UploadRequest msg;
  FillShared(source, msg.mutable_shared());
  writer->Write(msg);  // a failure shows in Finish
  writer->WritesDone();
  absl::Status st = FromGrpc(writer->Finish());
  if (!st.ok()) return st;
  return FromProto(resp.tensor());
}

namespace {
SharedMemoryInfo FromProto(const pb::SharedMemoryInfo& m) {
  SharedMemoryInfo i;
  i.name = m.name();
  i.cuda = m.has_cuda();
  if (i.cuda) {
    i.device = m.cuda().device();
    i.size = m.cuda().size();
  } else {
    i.key = m.system().key();
    i.offset = m.system().offset();
    i.size = m.system().size();
  }
  i.pinned = m.pinned();
  i.registered_unix_ms = m.registered_unix_ms();
  i.last_used_unix_ms = m.last_used_unix_ms();
  return i;
}
}  // namespace

absl::StatusOr<SharedMemoryInfo> Client::RegisterSharedMemory(const std::string& name,
                                                              const std::string& key,
                                                              int64_t offset, int64_t size) {
  grpc::ClientContext ctx;
  Prepare(&ctx, {});
  pb::RegisterSharedMemoryRequest req;
  req.set_name(name);
  req.mutable_system()->set_key(key);
  req.mutable_system()->set_offset(offset);
  req.mutable_system()->set_size(size);
  pb::RegisterSharedMemoryResponse resp;
  absl::Status st = FromGrpc(kernel_stub_->RegisterSharedMemory(&ctx, req, &resp));
  if (!st.ok()) return st;
  return FromProto(resp.region());
}

absl::StatusOr<SharedMemoryInfo> Client::RegisterCudaIpc(const std::string& name,
                                                         const std::string& ipc_handle,
                                                         int device, int64_t size) {
  grpc::ClientContext ctx;
  Prepare(&ctx, {});
  pb::RegisterSharedMemoryRequest req;
  req.set_name(name);
  req.mutable_cuda()->set_ipc_handle(ipc_handle);
  req.mutable_cuda()->set_device(device);
  req.mutable_cuda()->set_size(size);
  pb::RegisterSharedMemoryResponse resp;
  absl::Status st = FromGrpc(kernel_stub_->RegisterSharedMemory(&ctx, req, &resp));
  if (!st.ok()) return st;
  return FromProto(resp.region());
}

absl::Status Client::UnregisterSharedMemory(const std::string& name) {
  grpc::ClientContext ctx;
  Prepare(&ctx, {});
  pb::UnregisterSharedMemoryRequest req;
  req.set_name(name);
  pb::UnregisterSharedMemoryResponse resp;
  return FromGrpc(kernel_stub_->UnregisterSharedMemory(&ctx, req, &resp));
}

absl::StatusOr<SharedMemoryList> Client::ListSharedMemory() {
  grpc::ClientContext ctx;
  Prepare(&ctx, {});
  pb::ListSharedMemoryRequest req;
  pb::ListSharedMemoryResponse resp;
  absl::Status st = FromGrpc(kernel_stub_->ListSharedMemory(&ctx, req, &resp));
  if (!st.ok()) return st;
  SharedMemoryList out;
  for (const auto& m : resp.regions()) out.regions.push_back(FromProto(m));
  out.used_bytes = resp.used_bytes();
  out.quota_bytes = resp.quota_bytes();
  out.max_regions = resp.max_regions();
  return out;
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name,
                                                               size_t bytes) {
  std::unique_ptr<ShmSegment> s(new ShmSegment);
  s->key_ = name.empty() || name[0] != '/' ? "/" + name : name;
  const int fd = shm_open(s->key_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return absl::ErrnoToStatus(errno, "shm_open " + s->key_);
  s->owner_ = true;  // unlinked by the destructor, whatever fails below
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    close(fd);
    return absl::ErrnoToStatus(e, "ftruncate " + s->key_);
  }
  void* p = bytes == 0 ? nullptr : mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  close(fd);  // the mapping keeps the object
  if (p == MAP_FAILED) return absl::ErrnoToStatus(e, "mmap " + s->key_);
  s->data_ = p;
  s->size_ = bytes;
  return s;
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(const std::string& name) {
  std::unique_ptr<ShmSegment> s(new ShmSegment);
  s->key_ = name.empty() || name[0] != '/' ? "/" + name : name;
  const int fd = shm_open(s->key_.c_str(), O_RDWR, 0);
  if (fd < 0) return absl::ErrnoToStatus(errno, "shm_open " + s->key_);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    return absl::ErrnoToStatus(e, "fstat " + s->key_);
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* p = bytes == 0 ? nullptr : mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  close(fd);
  if (p == MAP_FAILED) return absl::ErrnoToStatus(e, "mmap " + s->key_);
  s->data_ = p;
  s->size_ = bytes;
  return s;
}

ShmSegment::~ShmSegment() {
  if (data_ != nullptr) munmap(data_, size_);
  if (owner_) shm_unlink(key_.c_str());
}

absl::StatusOr<HealthStatus> Client::Health(const std::string& service,
                                            std::chrono::milliseconds timeout) {
  std::string req;  // HealthCheckRequest { string service = 1; }
  if (!service.empty()) {
    req.push_back(0x0a);
    PutVarint(&req, service.size());
    req += service;
  }
  grpc::Slice slice(req);
  grpc::ByteBuffer request(&slice, 1), response;
  absl::Status st = UnaryCall("/grpc.health.v1.Health/Check", request, &response, timeout);
  if (!st.ok()) return st;
  return ParseHealth(response);
}

std::unique_ptr<Router> Router::Create(const std::vector<std::string>& targets,
                                       Client::Options options) {
  std::unique_ptr<Router> r(new Router());
  for (const std::string& t : targets) {
    const size_t eq = t.find('=');
    r->clients_.push_back(Client::Create(eq == std::string::npos ? t : t.substr(eq + 1), options));
    if (eq != std::string::npos) r->by_replica_[t.substr(0, eq)] = r->clients_.back().get();
  }
  return r;
}

absl::StatusOr<Client*> Router::For(const std::string& handle) {
  if (clients_.empty()) return absl::FailedPreconditionError("the router has no targets");
  const std::string replica = ReplicaOf(handle);
  if (replica.empty()) return clients_[turn_.fetch_add(1) % clients_.size()].get();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_replica_.find(replica);
  if (it == by_replica_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "no target is known for replica '", replica,
        "' (the handle's replica is gone, or none of its handles has come through this router)"));
  }
  return it->second;
}

void Router::Learn(const std::string& handle, Client* client) {
  const std::string replica = ReplicaOf(handle);
  if (replica.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  by_replica_.emplace(replica, client);
}

absl::Status Router::Call(Op op, const std::vector<Arg>& inputs, OpResult* result,
                          const CallOptions& opts) {
  std::string routed;
  for (const Arg& a : inputs) {
    if (!a.handle().empty()) {
      routed = a.handle();
      break;
    }
  }
  absl::StatusOr<Client*> c = For(routed);
  if (!c.ok()) return c.status();
  absl::Status st = (*c)->Call(op, inputs, result, opts);
  if (st.ok()) Learn(result->handle, *c);
  return st;
}

absl::StatusOr<TensorInfo> Router::Upload(const HostTensor& tensor, int64_t chunk_bytes,
                                          std::chrono::milliseconds timeout) {
  absl::StatusOr<Client*> c = For("");
  if (!c.ok()) return c.status();
  auto info = (*c)->Upload(tensor, chunk_bytes, timeout);
  if (info.ok()) Learn(info->handle, *c);
  return info;
}

absl::StatusOr<HostTensor> Router::Download(const std::string& handle,
                                            std::chrono::milliseconds timeout) {
  absl::StatusOr<Client*> c = For(handle);
  if (!c.ok()) return c.status();
  return (*c)->Download(handle, timeout);
}

absl::StatusOr<int64_t> Router::FreeTensor(const std::string& handle) {
  absl::StatusOr<Client*> c = For(handle);
  if (!c.ok()) return c.status();
  return (*c)->FreeTensor(handle);
}

// ExecuteStream (see the header).
ExecuteStream::ExecuteStream(std::unique_ptr<grpc::ClientContext> ctx,
                             std::shared_ptr<grpc::Channel> channel, int window)
    : ctx_(std::move(ctx)), window_(std::max(1, window)) {
  stream_.reset(grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
      channel.get(),
      grpc::internal::RpcMethod("/fusebox.v1.KernelService/Execute",
                                grpc::internal::RpcMethod::BIDI_STREAMING),
      ctx_.get()));
}

ExecuteStream::~ExecuteStream() {
  if (!finished_) {
    ctx_->TryCancel();
    grpc::ByteBuffer ignored;
    while (stream_->Read(&ignored)) {
    }
    (void)stream_->Finish();
  }
}

absl::Status ExecuteStream::Submit(uint64_t id, Op op, const std::vector<Arg>& inputs,
                                   const CallOptions& opts) {
  const bool matmul = op == Op::kMatmulRelu;
  const int count = static_cast<int>(inputs.size());
  if (count != (matmul ? 2 : 1) && !(matmul && count == 3)) {
    return absl::InvalidArgumentError(matmul ? "matmul_relu takes a, b and an optional bias"
                                             : "this op takes one input");
  }
  // ExecuteRequest { uint64 id = 1; oneof op { gelu = 2; softmax = 3; row_sum = 4;
  // matmul_relu = 5; } }: the op request encoded as for a unary call, its bytes copied so that
  // the caller's tensors may go as soon as Submit returns.
  const grpc::ByteBuffer op_request = Encode(matmul, inputs, opts, nullptr);
  std::vector<grpc::Slice> parts;
  if (!op_request.Dump(&parts).ok()) return absl::InternalError("cannot encode the request");
  std::string head;
  head.push_back(0x08);
  PutVarint(&head, id);
  head.push_back(static_cast<char>(((static_cast<int>(op) + 2) << 3) | 2));
  PutVarint(&head, op_request.Length());
  std::vector<grpc::Slice> slices;
  slices.reserve(parts.size() + 1);
  slices.emplace_back(head);
  for (const grpc::Slice& p : parts) slices.emplace_back(p.begin(), p.size());  // copies
  grpc::ByteBuffer request(slices.data(), slices.size());
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) return absl::FailedPreconditionError("the stream was closed for sending");
    cv_.wait(lock, [this] { return unanswered_ < window_ || ended_; });
    if (ended_) return absl::UnavailableError("the stream has ended; Finish says why");
    ++unanswered_;
  }
  if (!stream_->Write(request)) {
    return absl::UnavailableError("the stream has ended; Finish says why");
  }
  return absl::OkStatus();
}

bool ExecuteStream::Next(ExecuteResult* out) {
  grpc::ByteBuffer response;
  if (!stream_->Read(&response)) {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
    cv_.notify_all();
    return false;
  }
  const absl::Status parsed = ParseExecuteResponse(response, out);
  if (!parsed.ok()) out->status = parsed;
  std::lock_guard<std::mutex> lock(mu_);
  if (unanswered_ > 0) --unanswered_;
  cv_.notify_all();
  return true;
}

void ExecuteStream::CloseSend() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  stream_->WritesDone();
}

absl::Status ExecuteStream::Finish() {
  if (finished_) return status_;
  CloseSend();
  grpc::ByteBuffer ignored;
  while (stream_->Read(&ignored)) {  // answers nobody took: the caller has given up on them
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
    cv_.notify_all();
  }
  status_ = FromGrpc(stream_->Finish());
  finished_ = true;
  return status_;
}

int ExecuteStream::unanswered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return unanswered_;
}

std::unique_ptr<ExecuteStream> Client::Execute(int window, std::chrono::milliseconds timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (timeout.count() > 0) ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  if (!options_.auth_token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.auth_token);
  return std::unique_ptr<ExecuteStream>(new ExecuteStream(std::move(ctx), channel_, window));
}

absl::Status ParseExecuteResponseForTest(const grpc::ByteBuffer& response, ExecuteResult* out) {
  return ParseExecuteResponse(response, out);
}

}  // namespace fusebox::client
