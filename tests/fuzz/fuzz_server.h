// What the gRPC-facing harnesses (upload_fuzzer, ranged_upload_fuzzer) share: the in-process
// FuseboxServer they call (CPU backend, loopback, a small store) and a stub on one channel to
// it, the reader of a fuzzer's script, status codes by name, and the check that the store is
// empty again once the calls are over.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fusebox/v1/kernel_service.grpc.pb.h"
#include "server/server.h"

namespace fusebox {

struct FuzzServer {
  std::unique_ptr<FuseboxServer> server;
  std::unique_ptr<v1::KernelService::Stub> stub;  // no message size limit on this side
  const char* harness;                            // names a failure
};

// The process's one server, started on the first call (a failure to start aborts, naming
// `harness`). Never destroyed: the server's threads live on past the fuzzer's last input.
FuzzServer& TheFuzzServer(const char* harness);

// A fuzzer's input read as a script: its bytes in order, then zeros once it is spent.
class FuzzReader {
 public:
  FuzzReader(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  bool empty() const { return i_ >= n_; }
  uint8_t Byte() { return i_ < n_ ? d_[i_++] : 0; }
  // k bytes, little-endian.
  uint64_t Bytes(int k) {
    uint64_t v = 0;
    for (int j = 0; j < k; ++j) v |= uint64_t{Byte()} << (8 * j);
    return v;
  }
  // The next k bytes as they are, fewer where the input ends first.
  std::string Take(size_t k) {
    k = std::min(k, n_ - std::min(i_, n_));
    std::string s(reinterpret_cast<const char*>(d_ + i_), k);
    i_ += k;
    return s;
  }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t i_ = 0;
};

// A status code's name, for a failure's message.
const char* CodeName(grpc::StatusCode c);

// Aborts unless the store is empty again (no tensors, no bytes of `tenant`'s) within 10 s;
// `after` says after what, in the failure's message.
void CheckStoreEmpty(FuzzServer& w, const char* tenant, const char* after);

}  // namespace fusebox
