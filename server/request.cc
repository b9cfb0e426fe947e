// Request validation and OpCall construction (see request.h).
//
// Empty tensors: an op whose output has no elements returns an empty output
// of the right shape. RowSum over a zero-length last axis returns zeros, and
// MatmulRelu with K = 0 returns relu(bias) (or zeros): the sums are empty.
#include "server/request.h"

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusebox {
namespace {

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// A checked view of one inline tensor argument.
struct TensorArg {
  DType dtype;
  std::vector<int64_t> shape;
  int64_t elements = 1;
  const void* data = nullptr;
  int64_t bytes = 0;
};

absl::StatusOr<TensorArg> CheckArg(const v1::TensorRef& ref, bool present, const char* name) {
  if (!present || ref.ref_case() == v1::TensorRef::REF_NOT_SET) {
    return Invalid(absl::StrCat(name, " is missing: set ", name, ".tensor"));
  }
  if (ref.ref_case() == v1::TensorRef::kHandle) {
    return absl::UnimplementedError(absl::StrCat(
        name, ".handle: tensor handles are not served yet; send the tensor inline"));
  }
  const v1::Tensor& t = ref.tensor();
  if (t.dtype() == v1::DTYPE_UNSPECIFIED) {
    return Invalid(absl::StrCat(name, ".dtype is unspecified: use FLOAT32, FLOAT16 or BFLOAT16"));
  }
  if (t.dtype() != v1::FLOAT32 && t.dtype() != v1::FLOAT16 && t.dtype() != v1::BFLOAT16) {
    return Invalid(absl::StrCat(name, ".dtype ", static_cast<int>(t.dtype()),
                                " is unknown: use FLOAT32, FLOAT16 or BFLOAT16"));
  }
  TensorArg arg;
  arg.dtype = static_cast<DType>(t.dtype());
  const int64_t esize = static_cast<int64_t>(ElementSize(arg.dtype));
  for (int i = 0; i < t.shape_size(); ++i) {
    const int64_t d = t.shape(i);
    if (d < 0) {
      return Invalid(absl::StrCat(name, ".shape[", i, "] = ", d, " is negative (shape ",
                                  ShapeString(t.shape()), ")"));
    }
    arg.shape.push_back(d);
  }
  // Overflow is checked on the byte count so any size that passes fits in int64.
  int64_t bytes = esize;
  bool zero = false;
  for (int64_t d : arg.shape) {
    if (d == 0) zero = true;
    if (!zero && __builtin_mul_overflow(bytes, d, &bytes)) {
      return Invalid(absl::StrCat(name, ".shape ", ShapeString(t.shape()),
                                  " has more elements than fit in 64 bits"));
    }
  }
  if (zero) bytes = 0;
  arg.bytes = bytes;
  arg.elements = bytes / esize;
  if (static_cast<int64_t>(t.data().size()) != bytes) {
    return Invalid(absl::StrCat(name, ".data has ", t.data().size(), " bytes but shape ",
                                ShapeString(t.shape()), " of ", DTypeName(arg.dtype), " needs ",
                                bytes));
  }
  arg.data = t.data().data();
  return arg;
}

absl::Status NeedRankAtLeast1(const TensorArg& a, const char* op) {
  if (a.shape.empty()) {
    return Invalid(absl::StrCat(op, " works on the last axis and needs rank >= 1; got a scalar"));
  }
  return absl::OkStatus();
}

// Shapes the output tensor and points the call at its bytes.
absl::Status ShapeOutput(DType dtype, const std::vector<int64_t>& shape, int64_t elements,
                         const RequestLimits& limits, v1::Tensor* out, PreparedCall* p) {
  const int64_t bytes = elements * static_cast<int64_t>(ElementSize(dtype));
  if (bytes > limits.max_output_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the output would be ", bytes,
                                                     " bytes, over this server's limit of ",
                                                     limits.max_output_bytes));
  }
  out->set_dtype(static_cast<v1::DType>(dtype));
  for (int64_t d : shape) out->add_shape(d);
  out->mutable_data()->resize(static_cast<size_t>(bytes));
  p->call.output = out->mutable_data()->data();
  p->call.output_bytes = static_cast<size_t>(bytes);
  p->bytes_out = bytes;
  p->trivial = elements == 0;
  return absl::OkStatus();
}

absl::StatusOr<PreparedCall> PrepareUnary(Op op, const v1::TensorRef& input, bool has_input,
                                          const RequestLimits& limits, v1::Tensor* out) {
  auto a = CheckArg(input, has_input, "input");
  if (!a.ok()) return a.status();
  PreparedCall p;
  p.call.op = op;
  p.call.dtype = a->dtype;
  p.call.inputs[0] = a->data;
  p.bytes_in = a->bytes;
  if (op == Op::kGelu) {
    p.call.rows = 1;
    p.call.cols = a->elements;
    if (auto s = ShapeOutput(a->dtype, a->shape, a->elements, limits, out, &p); !s.ok()) return s;
    return p;
  }
  if (auto s = NeedRankAtLeast1(*a, OpName(op)); !s.ok()) return s;
  const int64_t cols = a->shape.back();
  p.call.cols = cols;
  p.call.rows = cols == 0 ? 0 : a->elements / cols;
  if (op == Op::kSoftmax) {
    if (auto s = ShapeOutput(a->dtype, a->shape, a->elements, limits, out, &p); !s.ok()) return s;
    return p;
  }
  // RowSum: float32 output without the last axis.
  std::vector<int64_t> oshape(a->shape.begin(), a->shape.end() - 1);
  int64_t rows = 1;
  for (int64_t d : oshape) rows *= d;
  p.call.rows = rows;
  if (auto s = ShapeOutput(DType::kFloat32, oshape, rows, limits, out, &p); !s.ok()) return s;
  if (cols == 0) {  // empty sums are zero
    std::memset(p.call.output, 0, p.call.output_bytes);
    p.trivial = true;
  }
  return p;
}

}  // namespace

absl::StatusOr<PreparedCall> PrepareGelu(const v1::GeluRequest& req, const RequestLimits& limits,
                                         v1::Tensor* out) {
  return PrepareUnary(Op::kGelu, req.input(), req.has_input(), limits, out);
}

absl::StatusOr<PreparedCall> PrepareSoftmax(const v1::SoftmaxRequest& req,
                                            const RequestLimits& limits, v1::Tensor* out) {
  return PrepareUnary(Op::kSoftmax, req.input(), req.has_input(), limits, out);
}

absl::StatusOr<PreparedCall> PrepareRowSum(const v1::RowSumRequest& req,
                                           const RequestLimits& limits, v1::Tensor* out) {
  return PrepareUnary(Op::kRowSum, req.input(), req.has_input(), limits, out);
}

absl::StatusOr<PreparedCall> PrepareMatmulRelu(const v1::MatmulReluRequest& req,
                                               const RequestLimits& limits, v1::Tensor* out) {
  auto a = CheckArg(req.a(), req.has_a(), "a");
  if (!a.ok()) return a.status();
  auto b = CheckArg(req.b(), req.has_b(), "b");
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
  PreparedCall p;
  p.call.op = Op::kMatmulRelu;
  p.call.dtype = a->dtype;
  p.call.m = m;
  p.call.n = n;
  p.call.k = k;
  p.call.inputs[0] = a->data;
  p.call.inputs[1] = b->data;
  p.call.allow_tf32 = req.allow_tf32();
  p.call.matmul_impl = static_cast<MatmulImpl>(req.impl());
  if (req.impl() != v1::MATMUL_IMPL_DEFAULT && req.impl() != v1::MATMUL_IMPL_CUBLASLT &&
      req.impl() != v1::MATMUL_IMPL_TILED) {
    return Invalid(absl::StrCat("impl ", static_cast<int>(req.impl()), " is unknown"));
  }
  p.bytes_in = a->bytes + b->bytes;
  if (req.has_bias()) {
    auto bias = CheckArg(req.bias(), true, "bias");
    if (!bias.ok()) return bias.status();
    if (bias->dtype != a->dtype) {
      return Invalid(absl::StrCat("bias is ", DTypeName(bias->dtype), " but a and b are ",
                                  DTypeName(a->dtype), "; operands must share one dtype"));
    }
    if (bias->shape.size() != 1 || bias->shape[0] != n) {
      return Invalid(absl::StrCat("bias must have shape [", n, "] (N columns of b); got ",
                                  ShapeString(req.bias().tensor().shape())));
    }
    p.call.inputs[2] = bias->data;
    p.bytes_in += bias->bytes;
  }
  int64_t elements;
  if (__builtin_mul_overflow(m, n, &elements) ||
      elements > std::numeric_limits<int64_t>::max() / 4) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the output [", m, ",", n, "] is too large"));
  }
  if (auto s = ShapeOutput(a->dtype, {m, n}, elements, limits, out, &p); !s.ok()) return s;
  if (k == 0 && elements > 0) {  // empty products: relu(bias) or zeros
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float v = p.call.inputs[2] ? LoadAsFloat(a->dtype, p.call.inputs[2], j) : 0.0f;
        StoreFromFloat(a->dtype, p.call.output, i * n + j, v > 0 || v != v ? v : 0.0f);
      }
    }
    p.trivial = true;
  }
  return p;
}

}  // namespace fusebox
