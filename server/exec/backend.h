// The seam between the RPC layer and compute. The service validates a request,
// turns it into an OpCall (host views of inline inputs and of the output's
// destination), asks the backend whether it can run it (Check) and submits it;
// a backend runs it and calls `done` exactly once, from one of its own threads.
// Nothing here that the RPC threads call waits on compute: Check, Submit,
// Allocate and destroying a Buffer return without waiting for a device.
//
// Backends: CpuBackend (server/backends/cpu/cpu_backend.cc, always built in) and the CUDA
// backend, a module loaded with dlopen (server/backend_loader.h says why).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/parallel_copy.h"
#include "kernels/dtype.h"

namespace fusebox {

enum class Op { kGelu, kSoftmax, kRowSum, kMatmulRelu };
inline const char* OpName(Op op) {
  switch (op) {
    case Op::kGelu: return "Gelu";
    case Op::kSoftmax: return "Softmax";
    case Op::kRowSum: return "RowSum";
    default: return "MatmulRelu";
  }
}

enum class MatmulImpl { kDefault = 0, kCublasLt = 1, kTiled = 2 };

// Host memory that leaves with a reply (an inline result, a download chunk): gRPC sends it from
// where it is and frees it once sent, through its deleter, which gives it back to whoever made it
// (std::free unless `fn` says otherwise).
struct HostBytesFree {
  void (*fn)(void* ctx, char* p) = nullptr;
  void* ctx = nullptr;
  void operator()(char* p) const {
    if (fn != nullptr) {
      fn(ctx, p);
    } else {
      std::free(p);
    }
  }
};
using HostBytes = std::unique_ptr<char, HostBytesFree>;

// `bytes` (at least 1) from malloc, freed with std::free; null when malloc fails.
inline HostBytes MallocHostBytes(size_t bytes) {
  return HostBytes(static_cast<char*>(std::malloc(bytes == 0 ? 1 : bytes)));
}

// An inline operand still in the pieces it arrived in (gRPC's receive slices): HostPieces
// (kernels/cpu/parallel_copy.h). The service hands these over instead of copying them together.

// One op on validated, host-resident inputs. The caller keeps every buffer
// alive until `done` runs. Output dtype is `dtype`, except RowSum's (float32).
struct OpCall {
  Op op = Op::kGelu;
  DType dtype = DType::kFloat32;
  // Gelu: n = rows * cols (any shape flattened; rows = 1).
  // Softmax / RowSum: rows x cols, the last axis is cols.
  // MatmulRelu: m x k times k x n, inputs[2] is the optional bias [n].
  int64_t rows = 0, cols = 0;
  int64_t m = 0, n = 0, k = 0;
  const void* inputs[3] = {nullptr, nullptr, nullptr};
  // When set, input i is these pieces' bytes (inputs[i] then points at the first piece, so a
  // present input is never null); a backend copies them into place (staging, or one host
  // buffer for the CPU's kernels).
  const HostPieces* input_pieces[3] = {nullptr, nullptr, nullptr};
  void* output = nullptr;
  size_t output_bytes = 0;
  bool allow_tf32 = false;
  MatmulImpl matmul_impl = MatmulImpl::kDefault;
  // Resident operands: when set, that pointer is a Buffer::data() of this
  // backend (device memory on CUDA) rather than host memory, so it needs no
  // copy in (inputs) or out (output).
  bool input_resident[3] = {false, false, false};
  bool output_resident = false;
  // True once no one waits for the result (the RPC was cancelled or passed its
  // deadline); empty: never. Asked as the call leaves the queue (NotAbandoned).
  std::function<bool()> abandoned;
};

// CANCELLED for a call whose caller has gone, so that a backend does not compute
// what no one will read (and a drain is not held up by queued orphans); else OK.
inline absl::Status NotAbandoned(const OpCall& call) {
  if (call.abandoned && call.abandoned()) {
    return absl::CancelledError("the call was cancelled or passed its deadline before it ran");
  }
  return absl::OkStatus();
}

// Where one call's time went, in microseconds (see fusebox.v1.Timing).
// launch_us: between the end of the copy-in and the kernel's start (the host's
// launch work and the GPU waking on an idle stream); 0 on the CPU backend.
struct OpTiming {
  double queue_us = 0, copy_in_us = 0, kernel_us = 0, copy_out_us = 0, total_us = 0;
  double launch_us = 0;
  int stream = -1;
};

using OpDone = std::function<void(absl::Status, const OpTiming&)>;

// The clock of `enqueued_ns` and of every host-side time in OpTiming.
inline int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A snapshot for gauges, cheap enough to take on every metrics scrape.
struct BackendStats {
  int64_t queued = 0;               // accepted, waiting for a stream / worker
  int64_t busy = 0;                 // streams / workers running a call now
  int64_t workers = 0;              // size of the pool
  int64_t device_memory_used = 0;   // bytes; 0 on the CPU backend
  int64_t device_memory_total = 0;  // bytes; 0 on the CPU backend
  // Counters since start (server/exec/batcher.h): op calls that reached a kernel launch,
  // launches (a batch of calls is one), and calls that ran in a batch of two or more.
  int64_t calls = 0;
  int64_t launches = 0;
  int64_t batched_calls = 0;
};

// Memory a backend holds for the tensor store: device memory on CUDA, host
// memory on the CPU. Destroying it returns the memory to the backend without
// waiting for the device, so destroy it only after every call and copy that
// uses it has had its `done`.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
  // Whether [offset, offset + bytes) lies within the buffer (checked before a copy).
  bool Contains(size_t offset, size_t bytes) const {
    return offset <= size() && bytes <= size() - offset;
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;    // "cpu" or "cuda"
  virtual std::string device() const = 0;  // e.g. "cuda:0 NVIDIA H200"
  // Whether this backend can run the call (e.g. the longest row its kernels take): OK, or
  // the error Submit would give it, so that a call it cannot run is refused before it waits
  // in the queue or holds memory. Cheap, never blocks, callable from any thread. The service
  // asks it about every call it submits; results that need no kernel are not submitted.
  virtual absl::Status Check(const OpCall& call) const;
  // Queues the call. When the queue is full `done` gets RESOURCE_EXHAUSTED
  // at once. `enqueued_ns` (steady clock) is when the request arrived.
  virtual void Submit(const OpCall& call, int64_t enqueued_ns, OpDone done) = 0;
  virtual BackendStats stats() const = 0;

  // `bytes` of host memory for an inline result or a download chunk, which the backend's copies
  // fill and gRPC then sends as it is (HostBytes); null when the host has none. The CUDA backend
  // hands out pinned memory from a pool, filled by one DMA; the default is malloc.
  virtual HostBytes AllocateHostBytes(size_t bytes);

  // Resident memory for the tensor store; out of memory is RESOURCE_EXHAUSTED. Called on
  // RPC threads: it never waits for the device (the memory is ready for every call and
  // copy submitted after it returns).
  virtual absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes);
  // Host <-> buffer copies, queued and run like calls (never on the caller's
  // thread); `done` gets copy_in_us (write) or copy_out_us (read). A copy at
  // offset 0 starts a transfer and is refused (RESOURCE_EXHAUSTED) when the
  // queue is full; a later piece (offset > 0) continues one that was admitted
  // and is queued regardless, so load never cuts an Upload or Download short.
  virtual void SubmitWrite(Buffer* dst, size_t offset, const void* src, size_t bytes,
                           int64_t enqueued_ns, OpDone done);
  virtual void SubmitRead(const Buffer* src, size_t offset, void* dst, size_t bytes,
                          int64_t enqueued_ns, OpDone done);
  // Stops taking calls, finishes the queued ones, joins threads. Idempotent.
  virtual void Shutdown() = 0;

  // Shared memory (server/core/shared_memory.h). Host memory mapped from a client's
  // shared-memory object, made ready for fast copies (CUDA: cudaHostRegister, so host <->
  // device copies of it are direct DMA instead of going through staging). The token undoes it
  // when dropped, which must happen before the memory is unmapped and only after every call
  // using it has had its `done`. Null token: nothing was needed (the CPU backend).
  virtual absl::StatusOr<std::shared_ptr<void>> RegisterHostMemory(void* data, size_t bytes);
  // Device memory another process exported with cudaIpcGetMemHandle (`handle`, its bytes),
  // opened for use as resident memory (an OpCall's input_resident / output_resident, a
  // SubmitWrite source); closed when the Buffer is destroyed. FAILED_PRECONDITION on a
  // backend without a GPU.
  virtual absl::StatusOr<std::unique_ptr<Buffer>> OpenIpcMemory(const std::string& handle,
                                                                int device, size_t bytes);
};

// A backend whose kernels take every valid call (the CPU's) keeps this.
inline absl::Status Backend::Check(const OpCall&) const { return absl::OkStatus(); }

inline HostBytes Backend::AllocateHostBytes(size_t bytes) { return MallocHostBytes(bytes); }

// Defaults for backends without resident memory.
inline absl::StatusOr<std::unique_ptr<Buffer>> Backend::Allocate(size_t) {
  return absl::UnimplementedError(name() + " backend cannot hold tensors");
}
inline void Backend::SubmitWrite(Buffer*, size_t, const void*, size_t, int64_t, OpDone done) {
  done(absl::UnimplementedError(name() + " backend cannot hold tensors"), OpTiming{});
}
inline void Backend::SubmitRead(const Buffer*, size_t, void*, size_t, int64_t, OpDone done) {
  done(absl::UnimplementedError(name() + " backend cannot hold tensors"), OpTiming{});
}
// Host memory needs nothing to be copied from at full speed on the CPU.
inline absl::StatusOr<std::shared_ptr<void>> Backend::RegisterHostMemory(void*, size_t) {
  return std::shared_ptr<void>();
}
inline absl::StatusOr<std::unique_ptr<Buffer>> Backend::OpenIpcMemory(const std::string&, int,
                                                                      size_t) {
  return absl::FailedPreconditionError(
      "CUDA IPC memory needs the CUDA backend; this server runs the " + name() +
      " backend: register POSIX shared memory (system) instead");
}

}  // namespace fusebox
