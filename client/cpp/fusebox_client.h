// fusebox C++ client: a thin synchronous wrapper around fusebox.v1.KernelService.
// Tensors go in and out as HostTensor (dtype, shape, little-endian bytes); every
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

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/generic/generic_stub.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// Where the call's time went: the server's record plus the client's round trip.
struct Timing {
  double queue_us = 0, copy_in_us = 0, kernel_us = 0, copy_out_us = 0, total_us = 0;
  std::string backend, device;
  int stream = 0;
  double rpc_us = 0;  // client wall clock: call start -> response parsed
};

struct OpResult {
  HostTensor output;
  Timing timing;
  std::string handle;  // set instead of output when the server kept the result
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
};

enum class HealthStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

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
  };

  // Creates a channel to target ("host:port"). Does not wait for the server;
  // see WaitForReady.
  static std::unique_ptr<Client> Create(const std::string& target, Options options);
  static std::unique_ptr<Client> Create(const std::string& target) {
    return Create(target, Options());
  }

  // True when the channel connected within timeout.
  bool WaitForReady(std::chrono::milliseconds timeout);

  absl::StatusOr<OpResult> Gelu(const HostTensor& input, const CallOptions& opts = {});
  absl::StatusOr<OpResult> Softmax(const HostTensor& input, const CallOptions& opts = {});
  absl::StatusOr<OpResult> RowSum(const HostTensor& input, const CallOptions& opts = {});
  // bias may be null.
  absl::StatusOr<OpResult> MatmulRelu(const HostTensor& a, const HostTensor& b,
                                      const HostTensor* bias, const CallOptions& opts = {});

  // Any op, writing into *result. result->output.data keeps its capacity, so a
  // result reused across calls needs no fresh allocation (for large tensors
  // that saves a page fault per 4 KiB). inputs: {input} or {a, b[, bias]}.
  absl::Status Call(Op op, const std::vector<const HostTensor*>& inputs, OpResult* result,
                    const CallOptions& opts = {});

  // grpc.health.v1.Health/Check; service "" = the whole server.
  absl::StatusOr<HealthStatus> Health(const std::string& service = "",
                                      std::chrono::milliseconds timeout =
                                          std::chrono::milliseconds(5000));

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  Client(std::shared_ptr<grpc::Channel> channel, Options options);
  absl::StatusOr<OpResult> Run(Op op, std::vector<const HostTensor*> inputs,
                               const CallOptions& opts);
  absl::Status UnaryCall(const std::string& method, const grpc::ByteBuffer& request,
                         grpc::ByteBuffer* response, std::chrono::milliseconds timeout);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
  Options options_;
};

// Converts a gRPC status to absl (the codes are the same numbers).
absl::Status FromGrpc(const grpc::Status& s);

// "float32", "float16", "bfloat16"; false for anything else.
bool ParseDType(const std::string& name, DType* out);

// Parses an op response (any of the four) the way the client does (for the tests).
absl::Status ParseResponseForTest(const grpc::ByteBuffer& response, OpResult* result);

// Encodes a request exactly like protobuf would (exposed for the tests).
// tensors: the op's tensor fields in field order (input; or a, b[, bias]).
// Payload slices point into the tensors' data.
grpc::ByteBuffer EncodeRequestForTest(bool matmul, const HostTensor* const* tensors, int count,
                                      bool allow_tf32, int impl);

}  // namespace fusebox::client
