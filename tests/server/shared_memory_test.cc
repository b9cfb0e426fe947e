// SharedMemoryRegistry on the CPU backend with real POSIX shared memory: off unless enabled;
// ranges checked without overflow; tenants see only their own regions; a region unregistered
// while held stays mapped until the holder lets go; a file truncated under the mapping is a
// FAILED_PRECONDITION at use time, and a SIGBUS inside the mapping is absorbed and marks the
// region faulted instead of killing the process; idle regions expire.
#include "server/core/shared_memory.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "server/backends/cpu/cpu_backend.h"

namespace fusebox {
namespace {

// A POSIX shared-memory object of `bytes`, unlinked at the end of the test.
class ShmObject {
 public:
  explicit ShmObject(size_t bytes) {
    key_ = "/fusebox-test-" + std::to_string(getpid()) + "-" + std::to_string(counter_++);
    fd_ = shm_open(key_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(bytes)), 0);
  }
  ~ShmObject() {
    close(fd_);
    shm_unlink(key_.c_str());
  }
  const std::string& key() const { return key_; }
  void Truncate(off_t bytes) { ASSERT_EQ(ftruncate(fd_, bytes), 0); }

 private:
  static inline int counter_ = 0;
  std::string key_;
  int fd_ = -1;
};

bool Mapped(const std::string& key) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/dev/shm" + key) != std::string::npos) return true;
  }
  return false;
}

class SharedMemoryTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ = MakeCpuBackend(CpuBackendOptions{});
  SharedMemoryLimits Enabled() {
    SharedMemoryLimits l;
    l.enabled = true;
    return l;
  }
};

TEST_F(SharedMemoryTest, OffByDefaultNamesTheFlag) {
  SharedMemoryRegistry reg(backend_.get(), SharedMemoryLimits{});
  ShmObject obj(4096);
  auto r = reg.RegisterSystem("t", "r", obj.key(), 0, 4096);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("--allow_shared_memory"), std::string::npos);
  EXPECT_EQ(reg.Get("t", "r").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SharedMemoryTest, SpansAreCheckedWithoutOverflow) {
  SharedMemoryRegistry reg(backend_.get(), Enabled());
  ShmObject obj(8192);
  auto r = reg.RegisterSystem("t", "r", obj.key(), 100, 4096);
  ASSERT_TRUE(r.ok()) << r.status();
  const SharedRegion& region = **r;
  EXPECT_TRUE(SharedMemoryRegistry::Span(region, 0, 4096, true, "x").ok());
  EXPECT_TRUE(SharedMemoryRegistry::Span(region, 4096, 0, true, "x").ok());
  for (auto [off, bytes] : {std::pair<int64_t, int64_t>{0, 4097}, {1, 4096}, {4097, 0},
                            {-1, 1}, {0, -1}, {INT64_MAX, 1}, {1, INT64_MAX},
                            {INT64_MAX - 10, 20}}) {
    auto s = SharedMemoryRegistry::Span(region, off, bytes, false, "x");
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << off << " " << bytes;
  }
  // The region starts 100 bytes into the object: its offset 0 is the object's byte 100.
  auto p = SharedMemoryRegistry::Span(region, 0, 4, true, "x");
  ASSERT_TRUE(p.ok());
  std::memcpy(*p, "abcd", 4);
  auto whole = reg.RegisterSystem("t", "whole", obj.key(), 0, 8192);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(std::memcmp(static_cast<char*>((*whole)->data()) + 100, "abcd", 4), 0);
  // Registration's own range: past the object's end, and offset + size overflowing.
  EXPECT_EQ(reg.RegisterSystem("t", "r2", obj.key(), 8000, 200).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.RegisterSystem("t", "r3", obj.key(), INT64_MAX - 5, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SharedMemoryTest, TenantsSeeOnlyTheirOwnRegions) {
  SharedMemoryRegistry reg(backend_.get(), Enabled());
  ShmObject obj(4096);
  ASSERT_TRUE(reg.RegisterSystem("alice", "r", obj.key(), 0, 4096).ok());
  auto other = reg.Get("bob", "r");
  auto none = reg.Get("bob", "never");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(reg.List("bob").empty());
  EXPECT_EQ(reg.Unregister("bob", "r").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reg.List("alice").size(), 1u);
  EXPECT_EQ(reg.TenantBytes("alice"), 4096);
  EXPECT_EQ(reg.TenantBytes("bob"), 0);
}

TEST_F(SharedMemoryTest, UnregisteredRegionStaysMappedUntilItsLastUserLetsGo) {
  SharedMemoryRegistry reg(backend_.get(), Enabled());
  ShmObject obj(4096);
  ASSERT_TRUE(reg.RegisterSystem("t", "r", obj.key(), 0, 4096).ok());
  auto held = reg.Get("t", "r");  // a call using it
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(reg.Unregister("t", "r").ok());
  EXPECT_EQ(reg.Get("t", "r").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Mapped(obj.key()));
  static_cast<char*>((*held)->data())[4095] = 1;  // still mapped: no fault
  held->reset();
  EXPECT_FALSE(Mapped(obj.key()));
}

TEST_F(SharedMemoryTest, TruncatedFileIsAnErrorAtUseTime) {
  SharedMemoryRegistry reg(backend_.get(), Enabled());
  ShmObject obj(1 << 20);
  auto r = reg.RegisterSystem("t", "r", obj.key(), 0, 1 << 20);
  ASSERT_TRUE(r.ok());
  obj.Truncate(4096);
  auto s = SharedMemoryRegistry::Span(**r, 0, 16, false, "input");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("truncated"), std::string::npos) << s.status();
}

TEST_F(SharedMemoryTest, SigbusInsideARegionMarksItFaultedAndTheProcessGoesOn) {
  SharedMemoryRegistry reg(backend_.get(), Enabled());
  ShmObject obj(1 << 20);
  auto r = reg.RegisterSystem("t", "r", obj.key(), 0, 1 << 20);
  ASSERT_TRUE(r.ok());
  auto* p = static_cast<volatile uint8_t*>((*r)->data());
  p[0] = 7;
  EXPECT_FALSE((*r)->Faulted());
  // The file shrinks after the check at use time: the next touch past its end is a SIGBUS,
  // from another thread as a kernel's would be.
  obj.Truncate(0);
  int read = -1;
  std::thread([&] {
    read = p[(1 << 20) - 1];
    p[12345] = 1;  // writes land in the zero pages, harmlessly
  }).join();
  EXPECT_EQ(read, 0);
  EXPECT_TRUE((*r)->Faulted());
  auto s = SharedMemoryRegistry::Span(**r, 0, 16, false, "input");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(reg.Unregister("t", "r").ok());
  r->reset();
  EXPECT_FALSE(Mapped(obj.key()));
}

TEST_F(SharedMemoryTest, IdleRegionsExpireAndTheirMappingsGo) {
  SharedMemoryLimits l = Enabled();
  l.idle_expiry_seconds = 0.05;
  SharedMemoryRegistry reg(backend_.get(), l);
  ShmObject obj(4096);
  ASSERT_TRUE(reg.RegisterSystem("t", "r", obj.key(), 0, 4096).ok());
  EXPECT_EQ(reg.ExpireIdle(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  EXPECT_EQ(reg.ExpireIdle(), 1);
  EXPECT_EQ(reg.Get("t", "r").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(Mapped(obj.key()));
}

TEST_F(SharedMemoryTest, PerTenantCountAndBytesAreLimited) {
  SharedMemoryLimits l = Enabled();
  l.max_regions_per_tenant = 2;
  l.tenant_quota_bytes = 6000;
  SharedMemoryRegistry reg(backend_.get(), l);
  ShmObject obj(8192);
  ASSERT_TRUE(reg.RegisterSystem("t", "a", obj.key(), 0, 4096).ok());
  EXPECT_EQ(reg.RegisterSystem("t", "b", obj.key(), 0, 4096).status().code(),
            absl::StatusCode::kResourceExhausted);  // 8192 > 6000
  ASSERT_TRUE(reg.RegisterSystem("t", "b", obj.key(), 0, 1000).ok());
  EXPECT_EQ(reg.RegisterSystem("t", "c", obj.key(), 0, 10).status().code(),
            absl::StatusCode::kResourceExhausted);  // a third region
  EXPECT_EQ(reg.RegisterSystem("t", "a", obj.key(), 0, 10).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(reg.RegisterSystem("u", "c", obj.key(), 0, 4096).ok());  // another tenant's own
}

TEST_F(SharedMemoryTest, CudaIpcOnTheCpuBackendIsAClearError) {
  SharedMemoryRegistry reg(backend_.get(), Enabled());
  auto r = reg.RegisterCuda("t", "gpu", std::string(64, '\0'), 0, 1 << 20);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("CUDA backend"), std::string::npos) << r.status();
  EXPECT_TRUE(reg.List("t").empty());
}

}  // namespace
}  // namespace fusebox
