// fusebox C++ client: a thin synchronous wrapper around fusebox.v1.KernelService.
// Tensors go in as HostTensor (dtype, shape, little-endian bytes) or TensorView (the
// same over the caller's own memory) and come out as HostTensor; every
// op returns the output plus the server's Timing and the client-side round trip.
// Errors come back as absl::Status with the gRPC code and the server's message.
//
// Request payloads are not copied on the client: the request is encoded by hand
// into a grpc::ByteBuffer whose data slices point at the caller's HostTensor
// bytes (which must stay alive for the call; calls are synchronous, so they do).
// The response is parsed by hand straight from the received slices: the output
// bytes are copied once, into the result's buffer (reusable, see Call). RequestPath::kProtobuf builds a normal request
// message instead (two client-side copies), kept to measure the difference.
//
// A Client is thread-safe: one channel, many concurrent calls.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/status/status.h"
#include "fusebox/v1/kernel_service.grpc.pb.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/parallel_copy.h"
#include "kernels/dtype.h"

namespace fusebox::client {

// A tensor in host memory: row-major, little-endian. The client does not
// validate it (the server does), so malformed tensors can be sent on purpose.
struct HostTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::string data;  // product(shape) * ElementSize(dtype) bytes

  // Product of the dims (1 for rank 0); -1 if a dim is negative or it overflows.
  int64_t NumElements() const;
  // Converts each value to dtype (round to nearest even for the half types).
  static HostTensor FromFloats(DType dtype, std::vector<int64_t> shape,
                               const std::vector<float>& values);
  // Widens every element to float (exact for all three dtypes).
  std::vector<float> ToFloats() const;
};

// Where the call's time went: the server's record plus the client's round trip
// (see fusebox.v1.Timing). launch_us: copy-in end -> kernel start on the GPU
// (launch work, an idle stream waking up); 0 on the CPU backend.
struct Timing {
  double queue_us = 0, copy_in_us = 0, kernel_us = 0, copy_out_us = 0, total_us = 0;
  double launch_us = 0;
  std::string backend, device;
  int stream = 0;
  double rpc_us = 0;  // client wall clock: call start -> response parsed
};

// The metadata header that names the replica holding a call's handles: a server started with
// --replica_id mints handles "<replica>.<random>", and every call naming one sends this header
// with <replica>, which a proxy in front of several replicas routes on (deploy/proxy).
inline constexpr char kReplicaHeader[] = "fusebox-replica";
// The replica a handle names; empty for a bare one.
std::string ReplicaOf(const std::string& handle);

// A tensor in a shared-memory region registered with the server (RegisterSharedMemory):
// `region` is the name it was registered under; the bytes start at `offset`.
struct SharedRef {
  std::string region;
  int64_t offset = 0;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
};

// A tensor in the caller's own memory (row-major, little-endian, `bytes` = product(shape) *
// ElementSize(dtype)), sent inline from there: no copy into a HostTensor first.
struct TensorView {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

// An op input: a tensor sent inline (implicitly, from a HostTensor or a TensorView, which
// must outlive the call), a handle to a tensor the server holds (see Upload), or a tensor in
// a registered shared-memory region.
class Arg {
 public:
  Arg(const HostTensor& t) : tensor_(&t) {}  // NOLINT(google-explicit-constructor)
  Arg(const TensorView& v) : view_(&v) {}    // NOLINT(google-explicit-constructor)
  static Arg Handle(std::string id) {
    Arg a;
    a.handle_ = std::move(id);
    return a;
  }
  static Arg Shared(SharedRef ref) {
    Arg a;
    a.shared_ = std::make_shared<SharedRef>(std::move(ref));
    return a;
  }
  const HostTensor* tensor() const { return tensor_; }
  const TensorView* view() const { return view_; }
  const std::string& handle() const { return handle_; }
  const SharedRef* shared() const { return shared_.get(); }

 private:
  Arg() = default;
  const HostTensor* tensor_ = nullptr;
  const TensorView* view_ = nullptr;
  std::string handle_;
  std::shared_ptr<const SharedRef> shared_;
};

// POSIX shared memory of this process for the server to map (same node only; the server
// needs --allow_shared_memory): shm_open + ftruncate + mmap. The creator unlinks the name when
// the segment is destroyed; the server's mapping stays valid until it unregisters the region.
class ShmSegment {
 public:
  // A new object "/name" of `bytes` (mode 0600: only this user, and the server if it runs as
  // the same user or as root); ALREADY_EXISTS if the name is taken.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& name,
                                                            size_t bytes);
  // An object another process created; unlinked by its creator, not here.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Open(const std::string& name);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  const std::string& key() const { return key_; }  // "/name", what RegisterSharedMemory takes
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  ShmSegment() = default;
  std::string key_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool owner_ = false;
};

// A registered region as the server describes it.
struct SharedMemoryInfo {
  std::string name;
  bool cuda = false;  // a CUDA IPC region (else POSIX shared memory)
  std::string key;    // POSIX: the object's name, and where the region starts in it
  int64_t offset = 0;
  int64_t size = 0;
  int device = 0;  // CUDA IPC: the device
  bool pinned = false;
  int64_t registered_unix_ms = 0, last_used_unix_ms = 0;
};
struct SharedMemoryList {
  std::vector<SharedMemoryInfo> regions;
  int64_t used_bytes = 0, quota_bytes = 0, max_regions = 0;  // this caller's
};

// What the server holds for a handle.
struct TensorInfo {
  std::string handle;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  int64_t size_bytes = 0, created_unix_ms = 0, last_used_unix_ms = 0;
};
struct TensorList {
  std::vector<TensorInfo> tensors;
  int64_t used_bytes = 0, quota_bytes = 0;  // this caller's
};

struct OpResult {
  HostTensor output;
  Timing timing;
  std::string handle;  // set instead of output when the server kept the result
  // Set when the output went into a shared-memory region (CallOptions::shared_output):
  // output then has its dtype and shape, and no data.
  bool shared = false;
};

enum class Op { kGelu, kSoftmax, kRowSum, kMatmulRelu };

enum class RequestPath { kZeroCopy, kProtobuf };
enum class MatmulImpl { kDefault = 0, kCublasLt = 1, kTiled = 2 };

struct CallOptions {
  // 0 = the client's default_timeout.
  std::chrono::milliseconds timeout{0};
  // MatmulRelu only.
  bool allow_tf32 = false;
  MatmulImpl impl = MatmulImpl::kDefault;
  // Keep the output on the server: OpResult::handle is set, output left empty.
  bool keep_on_server = false;
  // Write the output into this registered shared-memory region, from shared_output_offset
  // (empty: none). OpResult::shared is set.
  std::string shared_output_region;
  int64_t shared_output_offset = 0;
};

// Called during an Upload or Download with the bytes moved so far and the tensor's size.
using TransferProgress = std::function<void(int64_t done, int64_t total)>;

enum class HealthStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// TLS to the server, on when `enabled` is set or anything below is given. PEM texts, not
// paths (LoadTlsFiles reads files into them).
struct TlsOptions {
  bool enabled = false;
  std::string root_certs;   // CA certificate(s) to trust; empty = gRPC's default roots
  std::string cert_chain;   // mTLS: the client's certificate (chain) and its key, both or neither
  std::string private_key;
  std::string server_name;  // checked against the server's certificate instead of target's host

  bool on() const {
    return enabled || !root_certs.empty() || !cert_chain.empty() || !private_key.empty() ||
           !server_name.empty();
  }
};

// Reads the given PEM files (an empty path is skipped) into *tls and turns TLS on. A client
// certificate without its key, or the other way round, is INVALID_ARGUMENT; a file that cannot
// be read, the OS's reason (absl::ErrnoToStatus) naming the file.
absl::Status LoadTlsFiles(const std::string& ca_file, const std::string& cert_file,
                          const std::string& key_file, TlsOptions* tls);

// One answer of an ExecuteStream.
struct ExecuteResult {
  uint64_t id = 0;      // the request's id
  absl::Status status;  // that request's own outcome; OK: `result` holds its output
  OpResult result;      // result.timing.rpc_us is not measured here (the caller knows when it sent)
};

// The Execute RPC: many op calls on one stream, each with an id the caller chooses; answers come
// back in the order the server finishes them. A request that fails gets its own error
// (ExecuteResult::status) and the stream goes on. At most `window` requests are unanswered at
// once: Submit blocks until an answer has been taken (Next) below that. One thread may Submit
// while another takes answers; a single thread must call Next before Submit when unanswered()
// == window(). Made by Client::Execute; deleting an unfinished stream cancels it.
class ExecuteStream {
 public:
  ~ExecuteStream();
  ExecuteStream(const ExecuteStream&) = delete;
  ExecuteStream& operator=(const ExecuteStream&) = delete;

  // Sends one op request (inputs as for Client::Call; they are copied: they may go as soon as
  // this returns; opts.timeout is not used, the stream has one deadline). Not OK when the
  // stream has ended (Finish says why) or was closed for sending.
  absl::Status Submit(uint64_t id, Op op, const std::vector<Arg>& inputs,
                      const CallOptions& opts = {});
  // The next answer; false once the stream has ended (then Finish).
  bool Next(ExecuteResult* out);
  // No more requests: the server ends the stream once it has answered every one.
  void CloseSend();
  // Closes for sending, drops answers not taken, and returns the stream's status: OK when the
  // server answered every request; UNAVAILABLE when it shut down (requests without an answer
  // were not run and may be sent again); UNAUTHENTICATED, CANCELLED, DEADLINE_EXCEEDED...
  absl::Status Finish();

  int window() const { return window_; }
  int unanswered() const;  // submitted, answer not yet taken

 private:
  friend class Client;
  ExecuteStream(std::unique_ptr<grpc::ClientContext> ctx, std::shared_ptr<grpc::Channel> channel,
                int window);

  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream_;
  const int window_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int unanswered_ = 0;   // guarded by mu_
  bool closed_ = false;  // guarded by mu_: CloseSend was called
  bool ended_ = false;   // guarded by mu_: the stream has no more answers
  bool finished_ = false;
  absl::Status status_;
};

class Client {
 public:
  struct Options {
    std::chrono::milliseconds default_timeout{60000};
    RequestPath request_path = RequestPath::kZeroCopy;
    // Largest message sent / received; -1 = unlimited (the server enforces its own).
    int max_message_bytes = -1;
    // Sent as `authorization: Bearer <token>` when the server has a token file.
    std::string auth_token;
    // Extra integer channel arguments, e.g. {"grpc.http2.lookahead_bytes", 1 << 24}.
    std::vector<std::pair<std::string, int>> channel_args;
    // Plaintext unless tls.on().
    TlsOptions tls;
    // Parallel transfers: an Upload or Download of at least parallel_min_bytes goes as byte
    // ranges of range_bytes (CreateUpload / WriteUpload / CommitUpload; ranged Downloads), on
    // transfer_connections connections at once (this client's own and ones opened for
    // transfers on first use). 1 = one stream on one connection (plain Upload / Download).
    int transfer_connections = 4;
    int64_t parallel_min_bytes = int64_t{64} << 20;
    int64_t range_bytes = int64_t{8} << 20;
    // Threads that copy a large op result (2 MiB or more) out of gRPC's receive buffers into
    // OpResult::output.data: 0 = min(4, cores / 2), 1 = the calling thread alone.
    int copy_threads = 0;
  };

  // Creates a channel to target ("host:port"). Does not wait for the server;
  // see WaitForReady.
  static std::unique_ptr<Client> Create(const std::string& target, Options options);
  static std::unique_ptr<Client> Create(const std::string& target) {
    return Create(target, Options());
  }

  // True when the channel connected within timeout.
  bool WaitForReady(std::chrono::milliseconds timeout);

  absl::StatusOr<OpResult> Gelu(const Arg& input, const CallOptions& opts = {});
  absl::StatusOr<OpResult> Softmax(const Arg& input, const CallOptions& opts = {});
  absl::StatusOr<OpResult> RowSum(const Arg& input, const CallOptions& opts = {});
  // bias may be null.
  absl::StatusOr<OpResult> MatmulRelu(const Arg& a, const Arg& b, const HostTensor* bias,
                                      const CallOptions& opts = {});
  absl::StatusOr<OpResult> MatmulRelu(const Arg& a, const Arg& b, const Arg& bias,
                                      const CallOptions& opts = {});

  // Any op, writing into *result. result->output.data keeps its capacity, so a
  // result reused across calls needs no fresh allocation (for large tensors
  // that saves a page fault per 4 KiB). inputs: {input} or {a, b[, bias]}.
  absl::Status Call(Op op, const std::vector<Arg>& inputs, OpResult* result,
                    const CallOptions& opts = {});

  // A unary call whose request the caller has encoded already: `request` is its bytes as
  // pieces in order, sent as they are (no copy; they must stay valid until the call returns).
  // The reply's bytes are left in *response, unparsed. For clients in other languages that
  // encode their own messages (the Python client's native transport, client/python/native).
  // `handle`: a handle the call names, whose replica's header it then sends.
  absl::Status CallEncoded(const std::string& method, const HostPieces& request,
                           grpc::ByteBuffer* response, std::chrono::milliseconds timeout = {},
                           const std::string& handle = {});

  // Tensors held by the server (on the GPU with the CUDA backend), usable as
  // Arg::Handle(info.handle) in any op. Upload streams chunks of chunk_bytes; tensors of at
  // least Options::parallel_min_bytes go in ranges on several connections (UploadRanged,
  // DownloadRanged). progress, when set, is called after every chunk with the bytes moved so
  // far and in all (from the transfer's threads, one call at a time, never going back).
  absl::StatusOr<TensorInfo> Upload(const HostTensor& tensor, int64_t chunk_bytes = 4 << 20,
                                    std::chrono::milliseconds timeout = {},
                                    const TransferProgress& progress = {});
  absl::StatusOr<HostTensor> Download(const std::string& handle,
                                      std::chrono::milliseconds timeout = {},
                                      const TransferProgress& progress = {});
  // The parallel paths themselves, whatever the size: `connections` streams (0 = the
  // options'), each on its own connection, take ranges of range_bytes in turn. An upload that
  // fails is aborted on the server (nothing left behind).
  absl::StatusOr<TensorInfo> UploadRanged(const HostTensor& tensor, int connections = 0,
                                          std::chrono::milliseconds timeout = {},
                                          const TransferProgress& progress = {});
  absl::StatusOr<HostTensor> DownloadRanged(const std::string& handle, int connections = 0,
                                            std::chrono::milliseconds timeout = {},
                                            const TransferProgress& progress = {});
  // A download into memory of the caller's (`capacity` bytes at `dst`, the tensor's size at
  // most), ranged as DownloadRanged: no allocation, and no first touch of fresh pages, which
  // for a tensor of GiBs costs more than the transfer. Returns the tensor's description.
  absl::StatusOr<TensorInfo> DownloadInto(const std::string& handle, void* dst, size_t capacity,
                                          int connections = 0,
                                          std::chrono::milliseconds timeout = {},
                                          const TransferProgress& progress = {});
  absl::StatusOr<int64_t> FreeTensor(const std::string& handle);  // bytes freed
  absl::StatusOr<TensorList> ListTensors();
  absl::StatusOr<TensorInfo> StatTensor(const std::string& handle);
  // An upload whose bytes the server reads from a registered shared-memory region.
  absl::StatusOr<TensorInfo> UploadShared(const SharedRef& source,
                                          std::chrono::milliseconds timeout = {});

  // Shared memory on the server's node (it must run with --allow_shared_memory). A region is
  // registered under a name of the caller's choosing, then named by Arg::Shared and
  // CallOptions::shared_output.
  absl::StatusOr<SharedMemoryInfo> RegisterSharedMemory(const std::string& name,
                                                        const std::string& key, int64_t offset,
                                                        int64_t size);
  // Device memory exported with cudaIpcGetMemHandle (its bytes); CUDA backend only.
  absl::StatusOr<SharedMemoryInfo> RegisterCudaIpc(const std::string& name,
                                                   const std::string& ipc_handle, int device,
                                                   int64_t size);
  absl::Status UnregisterSharedMemory(const std::string& name);
  absl::StatusOr<SharedMemoryList> ListSharedMemory();

  // Opens an Execute stream with at most `window` requests unanswered (see ExecuteStream);
  // `timeout` > 0 is a deadline for the whole stream (default none).
  std::unique_ptr<ExecuteStream> Execute(int window = 64,
                                         std::chrono::milliseconds timeout = {});

  // grpc.health.v1.Health/Check; service "" = the whole server.
  absl::StatusOr<HealthStatus> Health(const std::string& service = "",
                                      std::chrono::milliseconds timeout =
                                          std::chrono::milliseconds(5000));

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  Client(std::shared_ptr<grpc::Channel> channel, Options options);
  absl::StatusOr<OpResult> Run(Op op, std::vector<Arg> inputs, const CallOptions& opts);
  // The deadline, the token, and for a call naming `handle` its replica's header.
  void Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds timeout,
               const std::string& handle = {}) const;
  // What a ranged transfer's call on `channel` adds: on a connection opened for transfers,
  // waiting for it to connect (within the deadline).
  void PrepareTransfer(grpc::ClientContext* ctx, const grpc::Channel* channel) const;
  absl::Status UnaryCall(const std::string& method, const grpc::ByteBuffer& request,
                         grpc::ByteBuffer* response, std::chrono::milliseconds timeout,
                         const std::string& handle = {});

  // `n` connections: this client's own channel first, then channels made (once) for
  // transfers, each with a subchannel pool of its own so that each is a connection of its own.
  std::vector<grpc::Channel*> TransferChannels(int n);
  // The `size` bytes of `handle` into dst, as ranges on `connections` connections.
  absl::Status DownloadRangesInto(const std::string& handle, char* dst, int64_t size,
                                  int connections, std::chrono::milliseconds timeout,
                                  const TransferProgress& progress);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
  std::unique_ptr<v1::KernelService::Stub> kernel_stub_;  // streaming and small RPCs
  Options options_;
  std::string target_;
  std::mutex transfer_mu_;
  std::vector<std::shared_ptr<grpc::Channel>> transfer_channels_;  // guarded by transfer_mu_
};

// Converts a gRPC status to absl (the codes are the same numbers).
absl::Status FromGrpc(const grpc::Status& s);

// "float32", "float16", "bfloat16"; false for anything else.
bool ParseDType(const std::string& name, DType* out);

// Parses an op response (any of the four) the way the client does (for the tests), a large
// result copied with copy_threads threads (Options::copy_threads).
absl::Status ParseResponseForTest(const grpc::ByteBuffer& response, OpResult* result,
                                  int copy_threads = 0);
// Parses an ExecuteResponse the way ExecuteStream::Next does (for the tests).
absl::Status ParseExecuteResponseForTest(const grpc::ByteBuffer& response, ExecuteResult* out);
// Parses a grpc.health.v1 HealthCheckResponse the way Health() does (for the tests).
absl::StatusOr<HealthStatus> ParseHealthForTest(const grpc::ByteBuffer& response);

// Several replicas without a proxy: one Client per target. A call naming a handle goes to the
// replica whose id starts the handle; other calls go to the targets in turn. A target
// "ID=host:port" names its replica; for a plain "host:port" the id is learned from the first
// handle it mints (Upload, or an op that keeps its output). A handle of a replica no target is
// known for is NOT_FOUND, as for a replica that is gone. Thread-safe.
class Router {
 public:
  static std::unique_ptr<Router> Create(const std::vector<std::string>& targets,
                                        Client::Options options);

  absl::Status Call(Op op, const std::vector<Arg>& inputs, OpResult* result,
                    const CallOptions& opts = {});
  absl::StatusOr<TensorInfo> Upload(const HostTensor& tensor, int64_t chunk_bytes = 4 << 20,
                                    std::chrono::milliseconds timeout = {});
  absl::StatusOr<HostTensor> Download(const std::string& handle,
                                      std::chrono::milliseconds timeout = {});
  absl::StatusOr<int64_t> FreeTensor(const std::string& handle);

  // The client a call naming `handle` goes to; an empty handle: the next target in turn.
  absl::StatusOr<Client*> For(const std::string& handle);
  size_t size() const { return clients_.size(); }

 private:
  Router() = default;
  void Learn(const std::string& handle, Client* client);

  std::vector<std::unique_ptr<Client>> clients_;
  std::mutex mu_;
  std::map<std::string, Client*> by_replica_;  // guarded by mu_
  std::atomic<size_t> turn_{0};
};

// Encodes a request exactly like protobuf would (exposed for the tests).
// inputs: the op's tensor fields in field order (input; or a, b[, bias]).
// Payload slices point into the tensors' data.
grpc::ByteBuffer EncodeRequestForTest(bool matmul, const std::vector<Arg>& inputs,
                                      const CallOptions& opts);

}  // namespace fusebox::client
