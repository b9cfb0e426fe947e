// CreateBackend's choice: --backend=auto falls back to the CPU when no GPU is usable, but
// not when the GPU options are out of range: CheckOptions refuses those before any backend
// is tried (INVALID_ARGUMENT: --streams, a negative --cuda_device). The GPU side of it (a
// device ordinal past the last) is tests/gpu/cuda_backend_test.cc's.
#include "server/backend_loader.h"
#include "server/options.h"

#include <gtest/gtest.h>

namespace fusebox {
namespace {

TEST(BackendLoader, AutoWithoutALoadableCudaModuleUsesTheCpu) {
  BackendChoice c;
  c.kind = "auto";
  c.cuda_module = "/nonexistent/libfusebox_cuda_backend.so";
  auto b = CreateBackend(c);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name(), "cpu");
  (*b)->Shutdown();
}

TEST(BackendLoader, CudaWithoutALoadableCudaModuleIsUnavailable) {
  BackendChoice c;
  c.kind = "cuda";
  c.cuda_module = "/nonexistent/libfusebox_cuda_backend.so";
  EXPECT_EQ(CreateBackend(c).status().code(), absl::StatusCode::kUnavailable);
}

TEST(BackendLoader, StreamsOutOfRangeAreInvalidArgumentNotACpuFallBack) {
  for (int streams : {0, kMaxCudaStreams + 1}) {
    for (const char* kind : {"auto", "cuda"}) {
      ServerOptions o;
      o.backend.kind = kind;
      o.backend.cuda.streams = streams;
      const absl::Status s = CheckOptions(o);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << kind << " " << streams;
      EXPECT_NE(s.message().find("--streams must be in 1..64"), absl::string_view::npos) << s;
    }
  }
}

TEST(BackendLoader, NegativeCudaDeviceIsInvalidArgumentNotACpuFallBack) {
  for (const char* kind : {"auto", "cuda"}) {
    ServerOptions o;
    o.backend.kind = kind;
    o.backend.cuda.device = -1;
    const absl::Status s = CheckOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << kind;
    EXPECT_NE(s.message().find("--cuda_device must be >= 0"), absl::string_view::npos) << s;
  }
}

TEST(BackendLoader, UnknownKindIsInvalidArgument) {
  BackendChoice c;
  c.kind = "tpu";
  EXPECT_EQ(CreateBackend(c).status().code(), absl::StatusCode::kInvalidArgument);
  ServerOptions o;
  o.backend.kind = "tpu";
  EXPECT_EQ(CheckOptions(o).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ServerOptions, DefaultsPassTheirOwnCheck) { EXPECT_TRUE(CheckOptions(ServerOptions{}).ok()); }

}  // namespace
}  // namespace fusebox
