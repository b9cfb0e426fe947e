// CreateBackend's choice: --backend=auto falls back to the CPU when no GPU is usable, but
// not when the GPU options are out of range (INVALID_ARGUMENT: --streams, a negative
// --cuda_device). The GPU side of it (a device ordinal past the last) is
// tests/gpu/cuda_backend_test.cc's.
#include "server/backend_loader.h"

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
      BackendChoice c;
      c.kind = kind;
      c.cuda.streams = streams;
      auto b = CreateBackend(c);
      EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << kind << " " << streams;
      EXPECT_NE(b.status().message().find("--streams must be 1..64"), absl::string_view::npos)
          << b.status();
    }
  }
}

TEST(BackendLoader, NegativeCudaDeviceIsInvalidArgumentNotACpuFallBack) {
  for (const char* kind : {"auto", "cuda"}) {
    BackendChoice c;
    c.kind = kind;
    c.cuda.device = -1;
    auto b = CreateBackend(c);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << kind;
    EXPECT_NE(b.status().message().find("--cuda_device must be >= 0"), absl::string_view::npos)
        << b.status();
  }
}

TEST(BackendLoader, UnknownKindIsInvalidArgument) {
  BackendChoice c;
  c.kind = "tpu";
  EXPECT_EQ(CreateBackend(c).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fusebox
