// Prometheus metrics for the server: families built once at start-up, one
// RecordCall per finished RPC, gauges read from the backend on each scrape.
// The timing recorded here is the same OpTiming object the response carries.
// Families and label values: server/rpc/metrics.cc's header comment.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/exec/backend.h"

namespace fusebox {

// One finished RPC. Methods without an op (Upload, Download, ...) leave
// `ran` false: they count in fusebox_calls_total and the byte counters only.
struct CallRecord {
  const char* method = "";     // a KernelService method name, e.g. "Gelu"
  Op op = Op::kGelu;
  DType dtype = DType::kFloat32;  // input dtype; meaningless when !ran
  int grpc_code = 0;           // grpc::StatusCode of the reply
  bool ran = false;            // the backend ran it: `timing` is valid
  OpTiming timing;
  int64_t bytes_in = 0;        // request payload bytes (tensor data)
  int64_t bytes_out = 0;       // response payload bytes
};

// What the tensor store holds, for fusebox_resident_tensors{,_bytes}; the
// gauges read 0 until the store calls SetResidentTensorsSource.
struct ResidentTensors {
  int64_t count = 0;
  int64_t bytes = 0;
};

class Metrics {
 public:
  // Serves /metrics on `address` (HOST:PORT or [V6]:PORT; port 0 picks a free one, see
  // port()) with MetricsHttpServer. `backend` must outlive this.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& address,
                                                        const Backend* backend);
  virtual ~Metrics() = default;
  virtual void RecordCall(const CallRecord& record) = 0;
  virtual void CallStarted() = 0;   // calls in flight +1
  virtual void CallFinished() = 0;  // calls in flight -1
  // Read on every scrape, from the HTTP thread: must be thread-safe and cheap.
  virtual void SetResidentTensorsSource(std::function<ResidentTensors()> source) = 0;
  // The port /metrics is served on (the chosen one when `address` said :0).
  virtual int port() const = 0;
};

}  // namespace fusebox
