// Shared memory on the CUDA backend, end to end: an in-process fusebox server (--backend=cuda,
// --allow_shared_memory) called through the C++ client.
//  - POSIX shared memory is pinned at registration (ListSharedMemory says pinned), and a GeLU
//    from a region into a region gives the very bits an inline call gives; a 256 MiB one is
//    timed (GB/s of input in the test's log: the 1 GiB target is fusebox-perf --shm).
//  - A CUDA IPC region exported by another process (fusebox_gpu_ipc_exporter) is opened;
//    a GeLU reads and writes it on the device (no copy in or out), the result read back by the
//    exporter matches an inline call; Upload reads from it; a size past the exported
//    allocation is INVALID_ARGUMENT.
// Skips when the CUDA backend cannot start (no GPU). Module: $FUSEBOX_CUDA_MODULE, else the
// build tree's; exporter: $FUSEBOX_IPC_EXPORTER, else the build tree's.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/cpp/fusebox_client.h"
#include "server/server.h"

namespace fusebox {
namespace {

using client::Arg;
using client::CallOptions;
using client::HostTensor;
using client::OpResult;
using client::SharedRef;

std::string Env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

class SharedMemoryGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.backend.kind = "cuda";
    o.backend.cuda_module = Env("FUSEBOX_CUDA_MODULE", FUSEBOX_CUDA_MODULE_PATH);
    o.allow_shared_memory = true;
    auto s = FuseboxServer::Start(o);
    if (!s.ok()) GTEST_SKIP() << "no CUDA backend here: " << s.status();
    server_ = *std::move(s);
    client_ = client::Client::Create("127.0.0.1:" + std::to_string(server_->port()));
  }
  void TearDown() override {
    client_.reset();
    if (server_) server_->Shutdown(5);
  }

  std::unique_ptr<FuseboxServer> server_;
  std::unique_ptr<client::Client> client_;
};

std::vector<float> Inputs(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 1000) * 0.01f - 5;
  return v;
}

TEST_F(SharedMemoryGpuTest, PinnedSystemRegionGeluMatchesInlineBits) {
  const size_t n = (size_t{64} << 20) / 4 + 7;  // crosses many staging chunks, odd length
  const size_t bytes = n * 4;
  auto seg = client::ShmSegment::Create("fusebox-gpu-test-" + std::to_string(getpid()),
                                        2 * bytes);
  ASSERT_TRUE(seg.ok()) << seg.status();
  const std::vector<float> x = Inputs(n);
  std::memcpy((*seg)->data(), x.data(), bytes);
  auto info = client_->RegisterSharedMemory("io", (*seg)->key(), 0, 2 * bytes);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->pinned) << "cudaHostRegister should pin a system region on CUDA";

  CallOptions opts;
  opts.shared_output_region = "io";
  opts.shared_output_offset = static_cast<int64_t>(bytes);
  OpResult shared;
  ASSERT_TRUE(client_->Call(client::Op::kGelu,
                            {Arg::Shared(SharedRef{"io", 0, DType::kFloat32, {int64_t(n)}})},
                            &shared, opts)
                  .ok());
  EXPECT_TRUE(shared.shared);
  const HostTensor in = HostTensor::FromFloats(DType::kFloat32, {int64_t(n)}, x);
  auto inline_result = client_->Gelu(in);
  ASSERT_TRUE(inline_result.ok()) << inline_result.status();
  EXPECT_EQ(std::memcmp(static_cast<char*>((*seg)->data()) + bytes,
                        inline_result->output.data.data(), bytes),
            0);

  // 256 MiB shm -> shm, best of 3, for the log.
  const size_t big = size_t{256} << 20;
  auto seg2 = client::ShmSegment::Create("fusebox-gpu-big-" + std::to_string(getpid()), 2 * big);
  ASSERT_TRUE(seg2.ok()) << seg2.status();
  std::memset((*seg2)->data(), 0, 2 * big);
  ASSERT_TRUE(client_->RegisterSharedMemory("big", (*seg2)->key(), 0, 2 * big).ok());
  CallOptions bo;
  bo.shared_output_region = "big";
  bo.shared_output_offset = static_cast<int64_t>(big);
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    OpResult r;
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(client_->Call(client::Op::kGelu,
                              {Arg::Shared(SharedRef{"big", 0, DType::kFloat32,
                                                     {int64_t(big / 4)}})},
                              &r, bo)
                    .ok());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                              .count());
  }
  std::printf("256 MiB GeLU shm->shm: %.2f ms, %.1f GB/s of input\n", best * 1e3,
              big / best / 1e9);
  EXPECT_TRUE(client_->UnregisterSharedMemory("big").ok());
  EXPECT_TRUE(client_->UnregisterSharedMemory("io").ok());
}

// The exporter, a child process that dies with this one.
class Exporter {
 public:
  bool Start(size_t bytes) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) return false;
    const std::string path = Env("FUSEBOX_IPC_EXPORTER", FUSEBOX_IPC_EXPORTER_PATH);
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(in[0], STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      close(in[1]);
      close(out[0]);
      const std::string b = std::to_string(bytes);
      execl(path.c_str(), path.c_str(), b.c_str(), "0", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
    const std::string line = Line();
    if (line.rfind("HANDLE ", 0) != 0) return false;
    handle_ = Unhex(line.substr(7));
    return handle_.size() == 64;
  }
  ~Exporter() {
    if (to_ != nullptr) {
      std::fputs("quit\n", to_);
      std::fclose(to_);
    }
    if (from_ != nullptr) std::fclose(from_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  const std::string& handle() const { return handle_; }
  std::string Dump(size_t offset, size_t bytes) {
    std::fprintf(to_, "dump %zu %zu\n", offset, bytes);
    std::fflush(to_);
    return Unhex(Line());
  }

 private:
  std::string Line() {
    std::string s;
    for (int c; (c = std::fgetc(from_)) != EOF && c != '\n';) s.push_back(static_cast<char>(c));
    return s;
  }
  static std::string Unhex(const std::string& h) {
    std::string out;
    for (size_t i = 0; i + 1 < h.size(); i += 2) {
      out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
    }
    return out;
  }
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  std::string handle_;
};

TEST_F(SharedMemoryGpuTest, CudaIpcRegionGeluRunsOnTheDeviceAndUploadReadsIt) {
  const size_t bytes = size_t{8} << 20;  // the first half holds the input
  const size_t n = bytes / 2 / 4;
  Exporter ex;
  ASSERT_TRUE(ex.Start(bytes)) << "the exporter did not start";
  auto too_big = client_->RegisterCudaIpc("too-big", ex.handle(), 0, bytes + 4096);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument) << too_big.status();
  auto info = client_->RegisterCudaIpc("dev", ex.handle(), 0, bytes);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->cuda);

  CallOptions opts;
  opts.shared_output_region = "dev";
  opts.shared_output_offset = static_cast<int64_t>(bytes / 2);
  OpResult r;
  const SharedRef input{"dev", 0, DType::kFloat32, {int64_t(n)}};
  auto st = client_->Call(client::Op::kGelu, {Arg::Shared(input)}, &r, opts);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_LT(r.timing.copy_in_us, 5.0) << "an IPC input is device memory: nothing to copy in";
  EXPECT_LT(r.timing.copy_out_us, 5.0);
  auto inline_result =
      client_->Gelu(HostTensor::FromFloats(DType::kFloat32, {int64_t(n)}, Inputs(n)));
  ASSERT_TRUE(inline_result.ok());
  EXPECT_EQ(ex.Dump(bytes / 2, n * 4), inline_result->output.data);

  auto up = client_->UploadShared(input);
  ASSERT_TRUE(up.ok()) << up.status();
  auto down = client_->Download(up->handle);
  ASSERT_TRUE(down.ok());
  EXPECT_EQ(down->data, ex.Dump(0, n * 4));
  EXPECT_TRUE(client_->FreeTensor(up->handle).ok());
  // Out of the region: refused before anything runs.
  OpResult bad;
  EXPECT_EQ(client_->Call(client::Op::kGelu,
                          {Arg::Shared(SharedRef{"dev", 4, DType::kFloat32, {int64_t(bytes / 4)}})},
                          &bad, opts)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(client_->UnregisterSharedMemory("dev").ok());
}

}  // namespace
}  // namespace fusebox
