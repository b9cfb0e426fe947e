// libFuzzer harness: request decoding and validation (server/core/request.h).
//
// Input: one byte that picks the request type (Gelu, Softmax, RowSum, MatmulRelu), then the
// bytes a client would send, parsed as that message by the same protobuf code the server
// runs. The request then goes through its Prepare* with a RequestContext backed by a real
// TensorStore on the CPU backend and an in-flight budget, and one that passes runs on the
// backend to completion, as the service runs it (a kept output is committed, then freed).
//
// Handles: the store holds a few tensors of this tenant and one of another tenant. Real
// handles are 128 random bits the fuzzer cannot guess, so a handle of two bytes "#<c>"
// stands for stored tensor c % kStored (see MapHandles); any other handle is looked up as is.
//
// It fails (abort) when: a request is refused with a code a client error cannot have (only
// INVALID_ARGUMENT, RESOURCE_EXHAUSTED, NOT_FOUND and UNIMPLEMENTED can), or with no message;
// an accepted call's output is not the size its shape says, or fails on the backend; or the
// store or the in-flight budget is not back where it was once the call is dropped.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "server/backends/cpu/cpu_backend.h"
#include "server/core/inflight_bytes.h"
#include "server/core/request.h"
#include "server/core/tensor_store.h"
#include "tests/fuzz/fuzz_check.h"

namespace fusebox {
namespace {

constexpr int kStored = 6;
constexpr char kFuzzerName[] = "request_fuzzer";
constexpr char kTenant[] = "fuzz";
constexpr int64_t kLimitBytes = int64_t{1} << 20;

struct World {
  std::unique_ptr<Backend> backend = MakeCpuBackend(CpuBackendOptions{});
  std::unique_ptr<TensorStore> store;
  InflightBytes inflight{4 * kLimitBytes};
  std::vector<std::string> handles;  // kStored: the last is another tenant's
  int64_t used_bytes = 0;            // this tenant's, once the stored tensors are in
  int64_t count = 0;

  World() {
    // libprotobuf logs each string field that is not UTF-8 (a handle, here): noise, not a bug.
    google::protobuf::SetLogHandler(nullptr);
    StoreLimits l;
    l.budget_bytes = l.tenant_quota_bytes = l.max_tensor_bytes = 4 * kLimitBytes;
    l.max_tensors = 64;
    l.idle_expiry_seconds = 0;
    store = std::make_unique<TensorStore>(backend.get(), l);
    struct Spec {
      const char* tenant;
      DType dtype;
      std::vector<int64_t> shape;
    };
    const Spec specs[kStored] = {
        {kTenant, DType::kFloat32, {4}},        {kTenant, DType::kFloat16, {2, 3}},
        {kTenant, DType::kBFloat16, {3, 2}},    {kTenant, DType::kFloat32, {0, 5}},
        {kTenant, DType::kFloat32, {3, 4}},     {"other", DType::kFloat32, {4}},
    };
    for (const Spec& s : specs) {
      auto t = store->Create(s.tenant, s.dtype, s.shape);
      FUZZ_CHECK(t.ok(), "%s", t.status().ToString().c_str());
      auto* bytes = static_cast<uint8_t*>((*t)->buffer->data());
      for (int64_t i = 0; i < (*t)->bytes; ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
      store->Commit(*t);
      handles.push_back((*t)->handle);
    }
    used_bytes = store->TenantUsedBytes(kTenant);
    count = store->stats().count;
  }
};

World& TheWorld() {
  static World* w = new World();  // never destroyed: the backend's threads live on
  return *w;
}

void MapHandle(v1::TensorRef* ref, const World& w) {
  if (ref->ref_case() == v1::TensorRef::kHandle && ref->handle().size() == 2 &&
      ref->handle()[0] == '#') {
    ref->set_handle(w.handles[static_cast<uint8_t>(ref->handle()[1]) % kStored]);
  }
}

template <typename Req>
void MapHandles(Req* r, const World& w) {
  if (r->has_input()) MapHandle(r->mutable_input(), w);
}
template <>
void MapHandles(v1::MatmulReluRequest* r, const World& w) {
  if (r->has_a()) MapHandle(r->mutable_a(), w);
  if (r->has_b()) MapHandle(r->mutable_b(), w);
  if (r->has_bias()) MapHandle(r->mutable_bias(), w);
}

void Run(absl::StatusOr<PreparedCall> p, const v1::Tensor& out, World& w) {
  if (!p.ok()) {
    const absl::StatusCode code = p.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument ||
                   code == absl::StatusCode::kResourceExhausted ||
                   code == absl::StatusCode::kNotFound ||
                   code == absl::StatusCode::kUnimplemented ||
                   // a TensorRef.shared on a server without shared memory (it is off here)
                   code == absl::StatusCode::kFailedPrecondition,
               "%s", p.status().ToString().c_str());
    FUZZ_CHECK(!p.status().message().empty(), "code %d", static_cast<int>(code));
    return;
  }
  const OpCall& call = p->call;
  if (p->kept_output) {
    FUZZ_CHECK(call.output_resident && call.output == p->kept_output->buffer->data() &&
                   static_cast<int64_t>(call.output_bytes) == p->kept_output->bytes,
               "kept output of %zu bytes", call.output_bytes);
  } else {
    // An inline result is in the reply's data field, or (kSentInPlaceBytes and more) in a
    // buffer of its own that the reply sends; the call writes into whichever holds it.
    const bool in_place = p->inline_output != nullptr;
    const size_t held = in_place ? call.output_bytes : out.data().size();
    FUZZ_CHECK(!call.output_resident && held == call.output_bytes &&
                   static_cast<int64_t>(call.output_bytes) == p->bytes_out &&
                   (in_place ? call.output == p->inline_output.get() && out.data().empty() &&
                                   p->bytes_out >= kSentInPlaceBytes
                             : p->bytes_out < kSentInPlaceBytes),
               "inline output %zu bytes (%s), call %zu, bytes_out %lld", held,
               in_place ? "in place" : "in the message", call.output_bytes,
               static_cast<long long>(p->bytes_out));
    const int64_t want =
        ShapeBytes(static_cast<int64_t>(ElementSize(static_cast<DType>(out.dtype()))), out.shape());
    FUZZ_CHECK(want == static_cast<int64_t>(held), "shape needs %lld, has %zu",
               static_cast<long long>(want), held);
    FUZZ_CHECK(p->bytes_out <= kLimitBytes, "inline output of %lld bytes past the limit",
               static_cast<long long>(p->bytes_out));
  }
  if (!p->trivial || !p->trivial_bytes.empty()) {
    std::promise<absl::Status> done;
    auto cb = [&done](absl::Status s, const OpTiming&) { done.set_value(s); };
    if (p->trivial) {
      w.backend->SubmitWrite(p->kept_output->buffer.get(), 0, p->trivial_bytes.data(),
                             p->trivial_bytes.size(), SteadyNowNs(), cb);
    } else {
      w.backend->Submit(call, SteadyNowNs(), cb);
    }
    const absl::Status s = done.get_future().get();
    FUZZ_CHECK(s.ok(), "%s", s.ToString().c_str());
  }
  if (p->kept_output) {
    w.store->Commit(p->kept_output);
    auto freed = w.store->Free(kTenant, p->kept_output->handle);
    FUZZ_CHECK(freed.ok() && *freed == p->kept_output->bytes, "%s",
               freed.status().ToString().c_str());
  }
}

template <typename Req, typename Prepare>
void One(const uint8_t* data, size_t size, Prepare prepare, World& w) {
  Req req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return;  // the server answers that itself
  MapHandles(&req, w);
  RequestContext ctx;
  ctx.store = w.store.get();
  ctx.inflight = &w.inflight;
  ctx.tenant = kTenant;
  ctx.limits.max_output_bytes = kLimitBytes;
  {
    v1::Tensor out;  // lives until the call has run: the call writes into it
    Run(prepare(req, ctx, &out), out, w);
  }
  FUZZ_CHECK(w.inflight.used() == 0, "%lld in-flight bytes left",
             static_cast<long long>(w.inflight.used()));
  FUZZ_CHECK(w.store->TenantUsedBytes(kTenant) == w.used_bytes && w.store->stats().count == w.count,
             "store holds %lld bytes in %lld tensors, was %lld in %lld",
             static_cast<long long>(w.store->TenantUsedBytes(kTenant)),
             static_cast<long long>(w.store->stats().count), static_cast<long long>(w.used_bytes),
             static_cast<long long>(w.count));
}

}  // namespace
}  // namespace fusebox

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fusebox;
  if (size < 1) return 0;
  World& w = TheWorld();
  const uint8_t* body = data + 1;
  const size_t n = size - 1;
  switch (data[0] % 4) {
    case 0: One<v1::GeluRequest>(body, n, PrepareGelu, w); break;
    case 1: One<v1::SoftmaxRequest>(body, n, PrepareSoftmax, w); break;
    case 2: One<v1::RowSumRequest>(body, n, PrepareRowSum, w); break;
    default: One<v1::MatmulReluRequest>(body, n, PrepareMatmulRelu, w); break;
  }
  return 0;
}
