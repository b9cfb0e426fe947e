// Request validation and OpCall construction (see request.h).
//
// Empty tensors: an op whose output has no elements returns an empty output
// of the right shape. RowSum over a zero-length last axis returns zeros, and
// MatmulRelu with K = 0 returns relu(bias) (or zeros): the sums are empty.
#include "server/core/request.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusebox {
namespace {

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

template <typename Shape>
std::string ShapeString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// A checked view of one tensor argument, inline or resident.
struct TensorArg {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  int64_t elements = 1;
  const void* data = nullptr;
  const HostPieces* pieces = nullptr;  // the bytes as they arrived, when not in `data` alone
  int64_t bytes = 0;
  bool resident = false;
};

absl::StatusOr<TensorArg> CheckArg(const v1::TensorRef& ref, bool present, const char* name,
                                   const RequestContext& ctx, PreparedCall* p) {
  if (!present || ref.ref_case() == v1::TensorRef::REF_NOT_SET) {
    return Invalid(absl::StrCat(name, " is missing: set ", name, ".tensor or ", name, ".handle"));
  }
  TensorArg arg;
  if (ref.ref_case() == v1::TensorRef::kShared) {
    auto src = ResolveShared(ref.shared(), ctx, absl::StrCat(name, ".shared"));
    if (!src.ok()) return src.status();
    arg.dtype = src->dtype;
    arg.shape = std::move(src->shape);
    arg.bytes = src->bytes;
    arg.elements = arg.bytes / static_cast<int64_t>(ElementSize(arg.dtype));
    arg.data = src->data;
    arg.resident = src->region->resident;
    p->shared_inputs.push_back({src->region.get(), ref.shared().offset(), src->bytes});
    p->regions.push_back(std::move(src->region));
    return arg;
  }
  if (ref.ref_case() == v1::TensorRef::kHandle) {
    if (ctx.store == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat(name, ".handle: this server holds no tensors; send the tensor inline"));
    }
    auto t = ctx.store->Get(ctx.tenant, ref.handle());
    if (!t.ok()) return t.status();
    arg.dtype = (*t)->dtype;
    arg.shape = (*t)->shape;
    arg.bytes = (*t)->bytes;
    arg.elements = arg.bytes / static_cast<int64_t>(ElementSize(arg.dtype));
    arg.data = (*t)->buffer->data();
    arg.resident = true;
    p->held.push_back(*std::move(t));
    return arg;
  }
  const v1::Tensor& t = ref.tensor();
  auto dtype = CheckedDType(t.dtype(), name);
  if (!dtype.ok()) return dtype.status();
  auto bytes = CheckedBytes(*dtype, t.shape(), name);
  if (!bytes.ok()) return bytes.status();
  arg.dtype = *dtype;
  arg.shape.assign(t.shape().begin(), t.shape().end());
  arg.bytes = *bytes;
  arg.elements = *bytes / static_cast<int64_t>(ElementSize(*dtype));
  const HostPieces* pieces = ctx.payloads ? ctx.payloads->Find(&t) : nullptr;
  int64_t have = static_cast<int64_t>(t.data().size());
  if (pieces) {
    have = 0;
    for (const HostPiece& piece : *pieces) have += static_cast<int64_t>(piece.bytes);
  }
  if (have != *bytes) {
    return Invalid(absl::StrCat(name, ".data has ", have, " bytes but shape ",
                                ShapeString(t.shape()), " of ", DTypeName(*dtype), " needs ",
                                *bytes));
  }
  arg.data = t.data().data();
  if (pieces && !pieces->empty()) {
    arg.data = pieces->front().data;
    if (pieces->size() > 1) arg.pieces = pieces;
  }
  p->bytes_in += *bytes;
  return arg;
}

void SetInput(int i, const TensorArg& a, PreparedCall* p) {
  p->call.inputs[i] = a.data;
  p->call.input_pieces[i] = a.pieces;
  p->call.input_resident[i] = a.resident;
}

absl::Status NeedRankAtLeast1(const TensorArg& a, const char* op) {
  if (a.shape.empty()) {
    return Invalid(absl::StrCat(op, " works on the last axis and needs rank >= 1; got a scalar"));
  }
  return absl::OkStatus();
}

// An output written into a shared-memory region (OutputOptions.shared): checked like an input
// (the caller's region, in range, writable, its file intact), and never overlapping an input
// in the same region, which the kernels do not allow for. The server holds none of its bytes.
absl::Status SharedOutput(DType dtype, const std::vector<int64_t>& shape, int64_t bytes,
                          const v1::OutputOptions& opts, const RequestContext& ctx,
                          PreparedCall* p, bool host_built) {
  if (opts.keep_on_server()) {
    return Invalid("output_options: keep_on_server and shared exclude each other; pick one");
  }
  const v1::SharedOutput& so = opts.shared();
  if (ctx.shm == nullptr) return absl::FailedPreconditionError("this server has no shared memory");
  auto region = ctx.shm->Get(ctx.tenant, so.region());
  if (!region.ok()) return region.status();
  auto span = SharedMemoryRegistry::Span(**region, so.offset(), bytes, /*write=*/true,
                                         "output_options.shared");
  if (!span.ok()) return span.status();
  if (host_built && (*region)->resident && bytes > 0) {
    return absl::UnimplementedError(
        "a result that needs no kernel (empty rows or K = 0) cannot be written into CUDA IPC "
        "memory; fill it on the client");
  }
  for (const auto& in : p->shared_inputs) {
    if (in.region == region->get() && bytes > 0 && in.bytes > 0 && so.offset() < in.offset + in.bytes &&
        in.offset < so.offset() + bytes) {
      return Invalid(absl::StrCat("output_options.shared: the output's bytes [", so.offset(), ", ",
                                  so.offset() + bytes, ") overlap an input's [", in.offset, ", ",
                                  in.offset + in.bytes, ") in region '", so.region(),
                                  "'; write it elsewhere"));
    }
  }
  if (ctx.inflight != nullptr && p->bytes_in > 0) {  // only the request's inline inputs
    auto token = ctx.inflight->Reserve(p->bytes_in, ctx.tenant, "call");
    if (!token.ok()) return token.status();
    p->inflight = *std::move(token);
  }
  p->call.output = *span;
  p->call.output_bytes = static_cast<size_t>(bytes);
  p->call.output_resident = (*region)->resident;
  p->has_shared_output = true;
  p->shared_output.set_region(so.region());
  p->shared_output.set_offset(so.offset());
  p->shared_output.set_dtype(static_cast<v1::DType>(dtype));
  for (int64_t d : shape) p->shared_output.add_shape(d);
  p->regions.push_back(*std::move(region));
  return absl::OkStatus();
}

// Shapes the output (inline in `out`, or a new resident tensor when kept) and
// points the call at its bytes. `host_built`: a non-empty result that needs no
// kernel (an empty row sum, K = 0), built in host memory (TrivialOutput) even when
// kept. Such a result costs the client nothing to ask for (a 14-byte request can name
// a gigabyte of zeros), so it is held to the size of the request's own tensors, or
// kMaxNoKernelOutputBytes where they are smaller: whatever the request, the reply is
// at most that much larger than it.
absl::Status ShapeOutput(DType dtype, const std::vector<int64_t>& shape, int64_t elements,
                         const v1::OutputOptions& opts, const RequestContext& ctx,
                         v1::Tensor* out, PreparedCall* p, bool host_built = false) {
  const int64_t bytes = elements * static_cast<int64_t>(ElementSize(dtype));
  const bool keep = opts.keep_on_server();
  p->trivial = elements == 0;
  if (opts.has_shared()) {
    return SharedOutput(dtype, shape, bytes, opts, ctx, p, host_built);
  }
  if (keep && ctx.store == nullptr) {
    return absl::UnimplementedError("keep_on_server: this server holds no tensors");
  }
  const bool on_host = !keep || host_built;  // the output's bytes are the host's
  const int64_t no_kernel_limit = std::min(ctx.limits.max_output_bytes,
                                           std::max(kMaxNoKernelOutputBytes, p->bytes_in));
  if (host_built && bytes > no_kernel_limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the output would be ", bytes,
        " bytes that need no kernel (empty rows or K = 0); such a result may be at most as large "
        "as the request's inline tensors (",
        p->bytes_in, " bytes) or ", kMaxNoKernelOutputBytes,
        " bytes: it would cost the server far more than the request; build it on the client"));
  }
  if (on_host && bytes > ctx.limits.max_output_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the output would be ", bytes, " bytes, over this server's limit of ",
                     ctx.limits.max_output_bytes,
                     " for inline results; keep it on the server and Download it"));
  }
  if (ctx.inflight != nullptr) {
    // The request's inline inputs, and the output where the host holds it: twice where gRPC
    // serializes its own copy of the reply, once where the reply is sent from it in place.
    const int64_t copies = !on_host ? 0 : (!keep && bytes >= kSentInPlaceBytes ? 1 : 2);
    const int64_t held = p->bytes_in + copies * bytes;
    auto token = ctx.inflight->Reserve(held, ctx.tenant, "call");
    if (!token.ok()) return token.status();
    p->inflight = *std::move(token);
  }
  if (keep) {
    auto t = ctx.store->Create(ctx.tenant, dtype, shape);
    if (!t.ok()) return t.status();
    p->kept_output = *std::move(t);
    p->call.output = p->kept_output->buffer->data();
    p->call.output_bytes = static_cast<size_t>(bytes);
    p->call.output_resident = true;
    return absl::OkStatus();
  }
  out->set_dtype(static_cast<v1::DType>(dtype));
  for (int64_t d : shape) out->add_shape(d);
  if (bytes >= kSentInPlaceBytes) {
    p->inline_output = ctx.backend ? ctx.backend->AllocateHostBytes(static_cast<size_t>(bytes))
                                   : MallocHostBytes(static_cast<size_t>(bytes));
    if (!p->inline_output) throw std::bad_alloc();  // RunOp answers RESOURCE_EXHAUSTED
    p->call.output = p->inline_output.get();
  } else {
    out->mutable_data()->resize(static_cast<size_t>(bytes));
    p->call.output = out->mutable_data()->data();
  }
  p->call.output_bytes = static_cast<size_t>(bytes);
  p->bytes_out = bytes;
  return absl::OkStatus();
}

// The host buffer a trivial (nothing-to-compute) result is written into.
void* TrivialOutput(PreparedCall* p) {
  if (!p->call.output_resident) return p->call.output;
  p->trivial_bytes.assign(p->call.output_bytes, '\0');
  return p->trivial_bytes.data();
}

// The one input of Gelu, Softmax and RowSum, checked and set as the call's operand.
template <typename Req>
absl::StatusOr<TensorArg> UnaryInput(Op op, const Req& req, const RequestContext& ctx,
                                     PreparedCall* p) {
  auto a = CheckArg(req.input(), req.has_input(), "input", ctx, p);
  if (!a.ok()) return a.status();
  p->call.op = op;
  p->call.dtype = a->dtype;
  SetInput(0, *a, p);
  return a;
}

// Softmax and RowSum work on rows: the last axis is a row, every other axis counts rows.
absl::Status SetRows(const TensorArg& a, PreparedCall* p) {
  if (auto s = NeedRankAtLeast1(a, OpName(p->call.op)); !s.ok()) return s;
  const int64_t cols = a.shape.back();
  p->call.cols = cols;
  p->call.rows = cols == 0 ? 0 : a.elements / cols;
  return absl::OkStatus();
}

}  // namespace

absl::Status SharedRegionsIntact(const PreparedCall& p) {
  for (const auto& r : p.regions) {
    if (r->Faulted()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shared-memory region '", r->name,
          "' was truncated while this call used it (its file shrank): the result is lost; "
          "unregister the region and register it again"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SharedSource> ResolveShared(const v1::SharedTensor& ref, const RequestContext& ctx,
                                           const std::string& what) {
  if (ctx.shm == nullptr) return absl::FailedPreconditionError("this server has no shared memory");
  if (absl::Status s = ctx.shm->Allowed(); !s.ok()) return s;
  SharedSource src;
  auto dtype = CheckedDType(ref.dtype(), what.c_str());
  if (!dtype.ok()) return dtype.status();
  auto bytes = CheckedBytes(*dtype, ref.shape(), what.c_str());
  if (!bytes.ok()) return bytes.status();
  auto region = ctx.shm->Get(ctx.tenant, ref.region());
  if (!region.ok()) return region.status();
  auto span = SharedMemoryRegistry::Span(**region, ref.offset(), *bytes, /*write=*/false, what);
  if (!span.ok()) return span.status();
  src.region = *std::move(region);
  src.dtype = *dtype;
  src.shape.assign(ref.shape().begin(), ref.shape().end());
  src.bytes = *bytes;
  src.data = *span;
  return src;
}

absl::StatusOr<DType> CheckedDType(v1::DType dtype, const char* what) {
  if (dtype == v1::DTYPE_UNSPECIFIED) {
    return Invalid(absl::StrCat(what, ".dtype is unspecified: use FLOAT32, FLOAT16 or BFLOAT16"));
  }
  if (dtype != v1::FLOAT32 && dtype != v1::FLOAT16 && dtype != v1::BFLOAT16) {
    return Invalid(absl::StrCat(what, ".dtype ", static_cast<int>(dtype),
                                " is unknown: use FLOAT32, FLOAT16 or BFLOAT16"));
  }
  return static_cast<DType>(dtype);
}

absl::StatusOr<int64_t> CheckedBytes(DType dtype,
                                     const google::protobuf::RepeatedField<int64_t>& shape,
                                     const char* what) {
  if (shape.size() > kMaxRank) {  // before any message echoes the shape
    return Invalid(absl::StrCat(what, ".shape has ", shape.size(), " axes; at most ", kMaxRank));
  }
  for (int i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return Invalid(absl::StrCat(what, ".shape[", i, "] = ", shape[i], " is negative (shape ",
                                  ShapeString(shape), ")"));
    }
  }
  // Overflow is checked on the byte count so any size that passes fits in int64.
  const int64_t bytes = ShapeBytes(static_cast<int64_t>(ElementSize(dtype)), shape);
  if (bytes < 0) {
    return Invalid(absl::StrCat(what, ".shape ", ShapeString(shape),
                                " has more elements than fit in 64 bits"));
  }
  return bytes;
}

absl::StatusOr<PreparedCall> PrepareGelu(const v1::GeluRequest& req, const RequestContext& ctx,
                                         v1::Tensor* out) {
  PreparedCall p;
  auto a = UnaryInput(Op::kGelu, req, ctx, &p);
  if (!a.ok()) return a.status();
  p.call.rows = 1;  // elementwise: any shape is one flat row
  p.call.cols = a->elements;
  if (auto s = ShapeOutput(a->dtype, a->shape, a->elements, req.output_options(), ctx, out, &p);
      !s.ok()) {
    return s;
  }
  return p;
}

absl::StatusOr<PreparedCall> PrepareSoftmax(const v1::SoftmaxRequest& req,
                                            const RequestContext& ctx, v1::Tensor* out) {
  PreparedCall p;
  auto a = UnaryInput(Op::kSoftmax, req, ctx, &p);
  if (!a.ok()) return a.status();
  if (auto s = SetRows(*a, &p); !s.ok()) return s;
  if (auto s = ShapeOutput(a->dtype, a->shape, a->elements, req.output_options(), ctx, out, &p);
      !s.ok()) {
    return s;
  }
  return p;
}

absl::StatusOr<PreparedCall> PrepareRowSum(const v1::RowSumRequest& req,
                                           const RequestContext& ctx, v1::Tensor* out) {
  PreparedCall p;
  auto a = UnaryInput(Op::kRowSum, req, ctx, &p);
  if (!a.ok()) return a.status();
  if (auto s = SetRows(*a, &p); !s.ok()) return s;
  // A float32 output without the last axis. An input with a zero-length last axis has no
  // elements, yet its other axes may still multiply past int64: the output's size is checked
  // on its own (a zero among them makes it empty).
  const int64_t cols = p.call.cols;
  std::vector<int64_t> oshape(a->shape.begin(), a->shape.end() - 1);
  const int64_t obytes = ShapeBytes(sizeof(float), oshape);
  if (obytes < 0) {
    return Invalid(absl::StrCat("RowSum of shape ", ShapeString(a->shape),
                                ": its output (every axis but the last) has more bytes "
                                "than fit in 64 bits"));
  }
  const int64_t rows = obytes / static_cast<int64_t>(sizeof(float));
  p.call.rows = rows;
  if (auto s = ShapeOutput(DType::kFloat32, oshape, rows, req.output_options(), ctx, out, &p,
                           cols == 0);
      !s.ok()) {
    return s;
  }
  if (cols == 0) {  // empty sums are zero
    std::memset(TrivialOutput(&p), 0, p.call.output_bytes);
    p.trivial = true;
  }
  return p;
}

absl::StatusOr<PreparedCall> PrepareMatmulRelu(const v1::MatmulReluRequest& req,
                                               const RequestContext& ctx, v1::Tensor* out) {
  PreparedCall p;
  auto a = CheckArg(req.a(), req.has_a(), "a", ctx, &p);
  if (!a.ok()) return a.status();
  auto b = CheckArg(req.b(), req.has_b(), "b", ctx, &p);
  if (!b.ok()) return b.status();
  if (a->shape.size() != 2 || b->shape.size() != 2) {
    return Invalid(absl::StrCat("MatmulRelu needs a [M,K] and b [K,N] of rank 2; got ranks ",
                                a->shape.size(), " and ", b->shape.size()));
  }
  if (a->dtype != b->dtype) {
    return Invalid(absl::StrCat("a is ", DTypeName(a->dtype), " but b is ", DTypeName(b->dtype),
                                "; operands must share one dtype"));
  }
  const int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
  if (b->shape[0] != k) {
    return Invalid(absl::StrCat("inner dimensions differ: a is [", m, ",", k, "] and b is [",
                                b->shape[0], ",", n, "]"));
  }
  // The GPU kernels (cuBLASLt's and the tiled one) take int sizes; the CPU serves the same
  // shapes, so a request means the same on either backend.
  constexpr int64_t kMaxDim = int64_t{1} << 31;
  if (m >= kMaxDim || k >= kMaxDim || n >= kMaxDim) {
    return Invalid(absl::StrCat("MatmulRelu dimensions must be below 2^31; got a [", m, ",", k,
                                "] and b [", k, ",", n, "]"));
  }
  if (req.impl() != v1::MATMUL_IMPL_DEFAULT && req.impl() != v1::MATMUL_IMPL_CUBLASLT &&
      req.impl() != v1::MATMUL_IMPL_TILED) {
    return Invalid(absl::StrCat("impl ", static_cast<int>(req.impl()), " is unknown"));
  }
  p.call.op = Op::kMatmulRelu;
  p.call.dtype = a->dtype;
  p.call.m = m;
  p.call.n = n;
  p.call.k = k;
  SetInput(0, *a, &p);
  SetInput(1, *b, &p);
  p.call.allow_tf32 = req.allow_tf32();
  p.call.matmul_impl = static_cast<MatmulImpl>(req.impl());
  if (req.has_bias()) {
    auto bias = CheckArg(req.bias(), true, "bias", ctx, &p);
    if (!bias.ok()) return bias.status();
    if (bias->dtype != a->dtype) {
      return Invalid(absl::StrCat("bias is ", DTypeName(bias->dtype), " but a and b are ",
                                  DTypeName(a->dtype), "; operands must share one dtype"));
    }
    if (bias->shape.size() != 1 || bias->shape[0] != n) {
      return Invalid(absl::StrCat("bias must have shape [", n, "] (N columns of b); got ",
                                  ShapeString(bias->shape)));
    }
    SetInput(2, *bias, &p);
  }
  int64_t elements;
  if (__builtin_mul_overflow(m, n, &elements) ||
      elements > std::numeric_limits<int64_t>::max() / 4) {
    return absl::ResourceExhaustedError(absl::StrCat("the output [", m, ",", n, "] is too large"));
  }
  if (k == 0 && elements > 0 && p.call.inputs[2] != nullptr && p.call.input_resident[2]) {
    return absl::UnimplementedError("K = 0 with a bias held on the server; send the bias inline");
  }
  if (auto s = ShapeOutput(a->dtype, {m, n}, elements, req.output_options(), ctx, out, &p,
                           k == 0);
      !s.ok()) {
    return s;
  }
  if (k == 0 && elements > 0) {  // empty products: relu(bias) or zeros
    auto* o = static_cast<uint8_t*>(TrivialOutput(&p));
    const void* bias = p.call.inputs[2];
    std::string joined;  // a bias that arrived in pieces, together
    if (p.call.input_pieces[2] != nullptr) {
      for (const HostPiece& piece : *p.call.input_pieces[2]) {
        joined.append(static_cast<const char*>(piece.data), piece.bytes);
      }
      bias = joined.data();
    }
    for (int64_t j = 0; j < n; ++j) {  // the first row, then copies of it
      const float v = bias ? LoadAsFloat(a->dtype, bias, j) : 0.0f;
      const float r = (v > 0 || v != v) ? v : 0.0f;  // relu, NaN kept
      StoreFromFloat(a->dtype, o, j, r);
    }
    const size_t row = static_cast<size_t>(n) * ElementSize(a->dtype);
    for (int64_t have = 1; have < m;) {
      const int64_t copy = std::min(have, m - have);
      std::memcpy(o + have * row, o, copy * row);
      have += copy;
    }
    p.trivial = true;
  }
  return p;
}

}  // namespace fusebox
