// Prometheus metrics for the server: families built once at start-up, one
// RecordCall per finished RPC, gauges read from the backend on each scrape.
// The timing recorded here is the same OpTiming object the response carries.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/backend.h"

namespace fusebox {

struct CallRecord {
  const char* method = "";     // "Gelu", "Softmax", "RowSum", "MatmulRelu"
  Op op = Op::kGelu;
  DType dtype = DType::kFloat32;  // input dtype; meaningless when !ran
  int grpc_code = 0;           // grpc::StatusCode of the reply
  bool ran = false;            // the backend ran it: `timing` is valid
  OpTiming timing;
  int64_t bytes_in = 0;        // request payload bytes (tensor data)
  int64_t bytes_out = 0;       // response payload bytes
};

class Metrics {
 public:
  // Serves /metrics on `address` (host:port). `backend` must outlive this.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& address,
                                                        const Backend* backend);
  virtual ~Metrics() = default;
  virtual void RecordCall(const CallRecord& record) = 0;
  virtual void CallStarted() = 0;   // calls in flight +1
  virtual void CallFinished() = 0;  // calls in flight -1
};

}  // namespace fusebox
