// Unit tests of the Prometheus exporter (server/rpc/metrics.cc): a fake backend,
// Metrics::Start on a free loopback port, RecordCall, then a plain HTTP GET of
// /metrics and checks on the parsed exposition text.
#include "server/rpc/metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fusebox {
namespace {

class FakeBackend final : public Backend {
 public:
  std::string name() const override { return "fake"; }
  std::string device() const override { return "fake:0 Test Device 9000"; }
  void Submit(const OpCall&, int64_t, OpDone done) override { done(absl::OkStatus(), {}); }
  BackendStats stats() const override {
    BackendStats s;
    s.queued = queued.load();
    s.busy = 3;
    s.workers = 4;
    s.device_memory_used = 1000;
    s.device_memory_total = 4000;
    s.calls = 30;
    s.launches = 12;
    s.batched_calls = 20;
    return s;
  }
  void Shutdown() override {}
  std::atomic<int64_t> queued{0};
};

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string reply;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) reply.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = reply.find("\r\n\r\n");
  return body == std::string::npos ? "" : reply.substr(body + 4);
}

using LabelSet = std::map<std::string, std::string>;

// Parses `name{a="x",b="y"} value` lines of the text format.
struct Sample {
  std::string name;
  LabelSet labels;
  double value = NAN;
};

std::vector<Sample> Parse(const std::string& text) {
  std::vector<Sample> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    const size_t brace = line.find('{');
    const size_t last_space = line.rfind(' ');
    size_t end = last_space;
    if (brace != std::string::npos && brace < last_space) {
      s.name = line.substr(0, brace);
      end = line.rfind('}');
      size_t i = brace + 1;
      while (i < end) {
        const size_t eq = line.find('=', i);
        const size_t q1 = eq + 1;  // opening quote
        size_t q2 = q1 + 1;
        std::string value;
        for (; line[q2] != '"'; ++q2) {
          if (line[q2] == '\\') ++q2;
          value += line[q2];
        }
        s.labels[line.substr(i, eq - i)] = value;
        i = q2 + 1;
        if (i < end && line[i] == ',') ++i;
      }
    } else {
      s.name = line.substr(0, last_space);
    }
    s.value = std::stod(line.substr(last_space + 1));
    out.push_back(std::move(s));
  }
  return out;
}

// The value of the one sample with this name and exactly these labels; NaN if absent.
double Value(const std::vector<Sample>& samples, const std::string& name, const LabelSet& labels) {
  for (const Sample& s : samples) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return NAN;
}

// The cumulative count of the phase histogram's bucket whose bound is `le`.
double Bucket(const std::vector<Sample>& samples, const LabelSet& labels, double le) {
  for (const Sample& s : samples) {
    if (s.name != "fusebox_call_phase_duration_seconds_bucket") continue;
    LabelSet l = s.labels;
    const double bound = std::stod(l["le"]);  // "+Inf" parses as inf
    l.erase("le");
    const bool same = std::isinf(le) ? std::isinf(bound) : std::fabs(bound - le) <= 1e-9 * le;
    if (l == labels && same) return s.value;
  }
  return NAN;
}

LabelSet Phase(const char* op, const char* dtype, const char* phase) {
  return {{"op", op}, {"dtype", dtype}, {"device", "fake:0"}, {"phase", phase}};
}

// One exporter for the whole suite, never stopped: each test records into label combinations no other test
// touches, so the tests stay independent of their order.
class MetricsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (metrics_ != nullptr) return;
    backend_ = new FakeBackend;
    auto m = Metrics::Start("127.0.0.1:0", backend_);
    ASSERT_TRUE(m.ok()) << m.status();
    metrics_ = m->release();
    ASSERT_GT(metrics_->port(), 0);
  }
  static std::vector<Sample> Scrape() { return Parse(HttpGet(metrics_->port(), "/metrics")); }

  static FakeBackend* backend_;
  static Metrics* metrics_;
};
FakeBackend* MetricsTest::backend_ = nullptr;
Metrics* MetricsTest::metrics_ = nullptr;

CallRecord GeluOk(double kernel_us) {
  CallRecord r;
  r.method = "Gelu";
  r.op = Op::kGelu;
  r.dtype = DType::kBFloat16;
  r.ran = true;
  r.timing.queue_us = 3;
  r.timing.copy_in_us = 10;
  r.timing.launch_us = 5;
  r.timing.kernel_us = kernel_us;
  r.timing.copy_out_us = 20;
  r.timing.total_us = 40 + kernel_us;
  r.bytes_in = 2048;
  r.bytes_out = 2048;
  return r;
}

TEST_F(MetricsTest, EveryLabelComboIsExposedAtZeroBeforeAnyCall) {
  const auto s = Scrape();
  EXPECT_EQ(Value(s, "fusebox_calls_total", {{"method", "MatmulRelu"}, {"code", "UNAVAILABLE"}}),
            0);
  EXPECT_EQ(Value(s, "fusebox_call_phase_duration_seconds_count",
                  Phase("Softmax", "float16", "copy_out")),
            0);
  EXPECT_EQ(Value(s, "fusebox_call_phase_duration_seconds_count",
                  Phase("Softmax", "float16", "launch")),
            0);
  EXPECT_EQ(Value(s, "fusebox_payload_bytes_total", {{"method", "RowSum"}, {"direction", "out"}}),
            0);
  EXPECT_EQ(Value(s, "fusebox_calls_in_flight", {}), 0);
}

TEST_F(MetricsTest, RecordCallFillsEveryPhaseFromTheSameTiming) {
  metrics_->RecordCall(GeluOk(100));
  metrics_->RecordCall(GeluOk(300));
  const auto s = Scrape();
  EXPECT_EQ(Value(s, "fusebox_calls_total", {{"method", "Gelu"}, {"code", "OK"}}), 2);
  EXPECT_EQ(Value(s, "fusebox_payload_bytes_total", {{"method", "Gelu"}, {"direction", "in"}}),
            4096);
  EXPECT_EQ(Value(s, "fusebox_payload_bytes_total", {{"method", "Gelu"}, {"direction", "out"}}),
            4096);
  const char* phases[] = {"queue", "copy_in", "launch", "kernel", "copy_out", "total"};
  const double sums[] = {6e-6, 20e-6, 10e-6, 400e-6, 40e-6, 480e-6};
  for (int i = 0; i < 6; ++i) {
    SCOPED_TRACE(phases[i]);
    EXPECT_EQ(Value(s, "fusebox_call_phase_duration_seconds_count",
                    Phase("Gelu", "bfloat16", phases[i])),
              2);
    EXPECT_NEAR(Value(s, "fusebox_call_phase_duration_seconds_sum",
                      Phase("Gelu", "bfloat16", phases[i])),
                sums[i], 1e-12);
  }
  // 100 us falls in (64 us, 128 us], 300 us in (256 us, 512 us].
  const LabelSet k = Phase("Gelu", "bfloat16", "kernel");
  EXPECT_EQ(Bucket(s, k, 64e-6), 0);
  EXPECT_EQ(Bucket(s, k, 128e-6), 1);
  EXPECT_EQ(Bucket(s, k, 256e-6), 1);
  EXPECT_EQ(Bucket(s, k, 512e-6), 2);
  EXPECT_EQ(Bucket(s, k, INFINITY), 2);
  // Other dtypes of the same op are untouched.
  EXPECT_EQ(Value(s, "fusebox_call_phase_duration_seconds_count",
                  Phase("Gelu", "float32", "kernel")),
            0);
}

TEST_F(MetricsTest, ValueOnABoundCountsInThatBucketAsLeSays) {
  CallRecord r;
  r.method = "RowSum";
  r.op = Op::kRowSum;
  r.dtype = DType::kFloat16;
  r.ran = true;
  r.timing.kernel_us = 64;  // exactly the 64 us bound
  metrics_->RecordCall(r);
  r.timing.kernel_us = 64.001;
  metrics_->RecordCall(r);
  r.timing.kernel_us = 1e8;  // 100 s: past the last bound (33.6 s)
  metrics_->RecordCall(r);
  const auto s = Scrape();
  const LabelSet k = Phase("RowSum", "float16", "kernel");
  EXPECT_EQ(Bucket(s, k, 32e-6), 0);
  EXPECT_EQ(Bucket(s, k, 64e-6), 1);
  EXPECT_EQ(Bucket(s, k, 128e-6), 2);
  EXPECT_EQ(Bucket(s, k, 1e-6 * (1 << 25)), 2);
  EXPECT_EQ(Bucket(s, k, INFINITY), 3);
  // The other phases were 0: the first bucket.
  EXPECT_EQ(Bucket(s, Phase("RowSum", "float16", "queue"), 1e-6), 3);
}

TEST_F(MetricsTest, NanOrNegativeTimingCountsAsZero) {
  CallRecord r;
  r.method = "Softmax";
  r.op = Op::kSoftmax;
  r.dtype = DType::kBFloat16;
  r.ran = true;
  r.timing.queue_us = NAN;
  r.timing.copy_in_us = -5;
  r.timing.launch_us = -0.5;
  metrics_->RecordCall(r);
  const auto s = Scrape();
  for (const char* phase : {"queue", "copy_in", "launch"}) {
    SCOPED_TRACE(phase);
    EXPECT_EQ(Bucket(s, Phase("Softmax", "bfloat16", phase), 1e-6), 1);
    EXPECT_EQ(Value(s, "fusebox_call_phase_duration_seconds_sum",
                    Phase("Softmax", "bfloat16", phase)),
              0);
  }
}

// Every op x dtype carries the same six phases, launch included, so a panel
// grouping `by (phase)` shows launch next to the others.
TEST_F(MetricsTest, EveryOpAndDtypeHasAllSixPhases) {
  const auto s = Scrape();
  std::map<std::string, std::set<std::string>> phases;  // "op/dtype" -> phases
  for (const Sample& x : s) {
    if (x.name != "fusebox_call_phase_duration_seconds_count") continue;
    EXPECT_EQ(x.labels.at("device"), "fake:0");
    phases[x.labels.at("op") + "/" + x.labels.at("dtype")].insert(x.labels.at("phase"));
  }
  EXPECT_EQ(phases.size(), 12u);
  const std::set<std::string> want = {"queue", "copy_in", "launch", "kernel", "copy_out", "total"};
  for (const auto& [combo, got] : phases) EXPECT_EQ(got, want) << combo;
}

// launch_us (copy-in end -> kernel start on the GPU) is a series of its own:
// neither folded into kernel nor into another phase.
TEST_F(MetricsTest, LaunchPhaseIsObservedOnItsOwn) {
  CallRecord r;
  r.method = "MatmulRelu";
  r.op = Op::kMatmulRelu;
  r.dtype = DType::kBFloat16;
  r.ran = true;
  r.timing.copy_in_us = 3;
  r.timing.launch_us = 30;  // (16 us, 32 us]
  r.timing.kernel_us = 2;   // (1 us, 2 us]
  r.timing.total_us = 40;
  metrics_->RecordCall(r);
  r.timing.launch_us = 9;   // (8 us, 16 us]
  metrics_->RecordCall(r);
  const auto s = Scrape();
  const LabelSet launch = Phase("MatmulRelu", "bfloat16", "launch");
  const LabelSet kernel = Phase("MatmulRelu", "bfloat16", "kernel");
  EXPECT_EQ(Value(s, "fusebox_call_phase_duration_seconds_count", launch), 2);
  EXPECT_NEAR(Value(s, "fusebox_call_phase_duration_seconds_sum", launch), 39e-6, 1e-12);
  EXPECT_EQ(Bucket(s, launch, 8e-6), 0);
  EXPECT_EQ(Bucket(s, launch, 16e-6), 1);
  EXPECT_EQ(Bucket(s, launch, 32e-6), 2);
  EXPECT_NEAR(Value(s, "fusebox_call_phase_duration_seconds_sum", kernel), 4e-6, 1e-12);
  EXPECT_EQ(Bucket(s, kernel, 2e-6), 2);
  EXPECT_NEAR(Value(s, "fusebox_call_phase_duration_seconds_sum",
                    Phase("MatmulRelu", "bfloat16", "copy_in")),
              6e-6, 1e-12);
}

TEST_F(MetricsTest, ConcurrentRecordsFromManyThreadsAllCount) {
  constexpr int kThreads = 8, kCalls = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this] {
      CallRecord r;
      r.method = "MatmulRelu";
      r.op = Op::kMatmulRelu;
      r.dtype = DType::kFloat16;
      r.ran = true;
      r.timing.kernel_us = 250;
      r.bytes_in = 3;
      for (int i = 0; i < kCalls; ++i) {
        metrics_->CallStarted();
        metrics_->RecordCall(r);
        metrics_->CallFinished();
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto s = Scrape();
  const LabelSet k = Phase("MatmulRelu", "float16", "kernel");
  EXPECT_EQ(Value(s, "fusebox_call_phase_duration_seconds_count", k), kThreads * kCalls);
  EXPECT_EQ(Bucket(s, k, 256e-6), kThreads * kCalls);
  EXPECT_EQ(Bucket(s, k, 128e-6), 0);
  EXPECT_NEAR(Value(s, "fusebox_call_phase_duration_seconds_sum", k), kThreads * kCalls * 250e-6,
              1e-9);
  EXPECT_EQ(
      Value(s, "fusebox_payload_bytes_total", {{"method", "MatmulRelu"}, {"direction", "in"}}),
      3.0 * kThreads * kCalls);
  EXPECT_EQ(Value(s, "fusebox_calls_in_flight", {}), 0);
}

TEST_F(MetricsTest, BucketsSpanOneMicrosecondToTensOfSeconds) {
  const auto s = Scrape();
  std::vector<double> bounds;
  for (const Sample& x : s) {
    if (x.name != "fusebox_call_phase_duration_seconds_bucket") continue;
    LabelSet l = x.labels;
    const std::string le = l["le"];
    l.erase("le");
    if (l == Phase("RowSum", "float32", "total") && le != "+Inf") bounds.push_back(std::stod(le));
  }
  ASSERT_FALSE(bounds.empty());
  EXPECT_DOUBLE_EQ(bounds.front(), 1e-6);
  EXPECT_GE(bounds.back(), 30.0);
  EXPECT_LE(bounds.size(), 30u);
}

TEST_F(MetricsTest, FailedCallCountsItsCodeButNoLatency) {
  const double ok_before =
      Value(Scrape(), "fusebox_calls_total", {{"method", "Softmax"}, {"code", "OK"}});
  CallRecord r;
  r.method = "Softmax";
  r.op = Op::kSoftmax;
  r.grpc_code = 3;  // INVALID_ARGUMENT
  metrics_->RecordCall(r);
  r.grpc_code = 8;  // RESOURCE_EXHAUSTED
  r.bytes_in = 100;
  metrics_->RecordCall(r);
  const auto s = Scrape();
  EXPECT_EQ(Value(s, "fusebox_calls_total", {{"method", "Softmax"}, {"code", "INVALID_ARGUMENT"}}),
            1);
  EXPECT_EQ(
      Value(s, "fusebox_calls_total", {{"method", "Softmax"}, {"code", "RESOURCE_EXHAUSTED"}}), 1);
  EXPECT_EQ(Value(s, "fusebox_calls_total", {{"method", "Softmax"}, {"code", "OK"}}), ok_before);
  EXPECT_EQ(Value(s, "fusebox_payload_bytes_total", {{"method", "Softmax"}, {"direction", "in"}}),
            100);
  EXPECT_EQ(Value(s, "fusebox_call_phase_duration_seconds_count",
                  Phase("Softmax", "float32", "total")),
            0);
}

TEST_F(MetricsTest, UnknownMethodAndOutOfRangeCodeStayBounded) {
  CallRecord r;
  r.method = "NotAMethod";
  r.grpc_code = 99;
  metrics_->RecordCall(r);
  r.method = nullptr;
  r.grpc_code = -1;
  metrics_->RecordCall(r);
  const auto s = Scrape();
  EXPECT_EQ(Value(s, "fusebox_calls_total", {{"method", "other"}, {"code", "UNKNOWN"}}), 2);
  for (const Sample& x : s) {
    if (x.name == "fusebox_calls_total") {
      EXPECT_NE(x.labels.at("method"), "NotAMethod");
    }
  }
}

TEST_F(MetricsTest, MethodsComeFromTheServiceDescriptor) {
  const auto s = Scrape();
  for (const char* m : {"Gelu", "Softmax", "RowSum", "MatmulRelu", "Upload", "Download",
                        "FreeTensor", "ListTensors", "RegisterSharedMemory",
                        "UnregisterSharedMemory", "ListSharedMemory", "other"}) {
    EXPECT_FALSE(std::isnan(Value(s, "fusebox_calls_total", {{"method", m}, {"code", "OK"}})))
        << m;
  }
}

TEST_F(MetricsTest, InFlightFollowsStartedAndFinished) {
  const double before = Value(Scrape(), "fusebox_calls_in_flight", {});
  metrics_->CallStarted();
  metrics_->CallStarted();
  metrics_->CallFinished();
  EXPECT_EQ(Value(Scrape(), "fusebox_calls_in_flight", {}), before + 1);
  metrics_->CallFinished();
}

TEST_F(MetricsTest, BackendGaugesAreReadAtScrapeTime) {
  const LabelSet dev = {{"device", "fake:0"}};
  backend_->queued = 7;
  auto s = Scrape();
  EXPECT_EQ(Value(s, "fusebox_queued_calls", dev), 7);
  EXPECT_EQ(Value(s, "fusebox_busy_streams", dev), 3);
  EXPECT_EQ(Value(s, "fusebox_streams", dev), 4);
  EXPECT_EQ(Value(s, "fusebox_device_memory_used_bytes", dev), 1000);
  EXPECT_EQ(Value(s, "fusebox_device_memory_total_bytes", dev), 4000);
  backend_->queued = 2;
  EXPECT_EQ(Value(Scrape(), "fusebox_queued_calls", dev), 2);
}

TEST_F(MetricsTest, LaunchCountersComeFromTheBackend) {
  const LabelSet dev = {{"device", "fake:0"}};
  auto s = Scrape();
  EXPECT_EQ(Value(s, "fusebox_op_calls_total", dev), 30);
  EXPECT_EQ(Value(s, "fusebox_launches_total", dev), 12);
  EXPECT_EQ(Value(s, "fusebox_batched_calls_total", dev), 20);
}

TEST_F(MetricsTest, ResidentTensorGaugesReadZeroWithoutASource) {
  const LabelSet dev = {{"device", "fake:0"}};
  metrics_->SetResidentTensorsSource(nullptr);
  auto s = Scrape();
  EXPECT_EQ(Value(s, "fusebox_resident_tensors", dev), 0);
  EXPECT_EQ(Value(s, "fusebox_resident_tensor_bytes", dev), 0);
  metrics_->SetResidentTensorsSource([] { return ResidentTensors{5, 1 << 20}; });
  s = Scrape();
  EXPECT_EQ(Value(s, "fusebox_resident_tensors", dev), 5);
  EXPECT_EQ(Value(s, "fusebox_resident_tensor_bytes", dev), 1 << 20);
  metrics_->SetResidentTensorsSource(nullptr);
}

TEST_F(MetricsTest, BuildInfoNamesVersionBackendAndDevice) {
  const auto s = Scrape();
  bool found = false;
  for (const Sample& x : s) {
    if (x.name != "fusebox_build_info") continue;
    found = true;
    EXPECT_EQ(x.value, 1);
    EXPECT_EQ(x.labels.at("backend"), "fake");
    EXPECT_EQ(x.labels.at("device"), "fake:0");
    EXPECT_EQ(x.labels.at("device_name"), "fake:0 Test Device 9000");
    EXPECT_FALSE(x.labels.at("version").empty());
    EXPECT_NE(x.labels.at("version"), "unknown");
  }
  EXPECT_TRUE(found);
}

// Every family on the page is ours: fusebox_*, and says what it counts.
TEST_F(MetricsTest, EveryFamilyIsPrefixedAndHasHelp) {
  const std::string text = HttpGet(metrics_->port(), "/metrics");
  std::istringstream in(text);
  int ours = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# HELP ", 0) != 0) continue;
    ++ours;
    EXPECT_EQ(line.rfind("# HELP fusebox_", 0), 0u) << line;
    EXPECT_GT(line.size(), std::string("# HELP fusebox_x ").size() + 20) << line;
  }
  EXPECT_EQ(ours, 15);  // 12, and the three launch counters
}

TEST_F(MetricsTest, AddressInUseIsAnErrorNotACrash) {
  FakeBackend backend;
  auto second = Metrics::Start("127.0.0.1:" + std::to_string(metrics_->port()), &backend);
  EXPECT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace fusebox
