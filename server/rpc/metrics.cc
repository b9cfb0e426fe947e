// The Prometheus exporter behind server/rpc/metrics.h. MetricsHttpServer
// (metrics_http.h) serves /metrics and prometheus-cpp's serializer writes the
// text; the numbers come from two Collectables of ours, both built once at
// start-up:
//
//  - CallStats: what RecordCall / CallStarted / CallFinished count. Every
//    label combination (op x dtype x phase, method x code) is a fixed slot in
//    an array, so the hot path does no lookup, no string work, no allocation
//    and takes no lock: per observation one bucket search over 26 doubles and
//    two relaxed atomic adds. The slots are sharded 16 ways by thread (each
//    shard on its own cache lines), so the gRPC / backend threads that finish
//    calls at the same time do not fight over cache lines. prometheus-cpp's
//    own Histogram takes a mutex and CAS-loops two doubles per Observe: with
//    4-8 threads finishing calls at once that cost 1-2 us per call on the
//    H200 host, against 0.13-0.18 us here (bench/baselines/metrics-record-call-*).
//  - BackendCollector: gauges read from Backend::stats() and the tensor store
//    hook when scraped: always current, and no thread polls between scrapes.
//
// Families (every label value is bounded; `device` is one per server):
//   fusebox_call_phase_duration_seconds  histogram {op, dtype, device, phase}
//       phase = queue | copy_in | launch | kernel | copy_out | total; buckets
//       1 us x 2^k, k = 0..25 (1 us .. 33.6 s). Observed once per call that
//       ran, every phase, from the same OpTiming the response's Timing is
//       filled from (launch: copy-in end -> kernel start, 0 on the CPU backend).
//   fusebox_calls_total                  counter {method, code}  every RPC, gRPC code name
//   fusebox_payload_bytes_total          counter {method, direction}  tensor bytes in / out
//   fusebox_calls_in_flight              gauge   RPCs between arrival and reply (all methods)
//   fusebox_build_info                   gauge=1 {version, backend, device, device_name}
//   fusebox_queued_calls                 gauge {device}  accepted, waiting for a stream/worker
//   fusebox_busy_streams                 gauge {device}  streams (CPU: workers) running a call
//   fusebox_streams                      gauge {device}  size of that pool
//   fusebox_device_memory_used_bytes     gauge {device}  0 on the CPU backend
//   fusebox_device_memory_total_bytes    gauge {device}  0 on the CPU backend
//   fusebox_resident_tensors             gauge {device}  tensors the store holds by handle, from
//   fusebox_resident_tensor_bytes        gauge {device}  SetResidentTensorsSource; 0 without one
// `method` is every RPC of fusebox.v1.KernelService (from the descriptor) plus
// "other"; `code` the 17 canonical gRPC code names.
#include "server/rpc/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <array>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fusebox/v1/kernel_service.pb.h"
#include "server/rpc/metrics_http.h"

#ifndef FUSEBOX_VERSION
#define FUSEBOX_VERSION "unknown"
#endif

namespace fusebox {
namespace {

constexpr int kOps = 4;      // Op::kGelu .. Op::kMatmulRelu
constexpr int kDTypes = 3;   // DType::kFloat32 (1) .. DType::kBFloat16 (3)
constexpr int kPhases = 6;
constexpr int kBounds = 26;  // finite bucket bounds; slot kBounds is +Inf
constexpr int kCodes = 17;   // grpc::StatusCode OK (0) .. UNAUTHENTICATED (16)
constexpr int kMaxMethods = 24;  // KernelService has 15-16; beyond 23 they count as "other"
constexpr int kShards = 16;
constexpr int kUnknownCode = 2;
constexpr const char* kPhaseNames[kPhases] = {"queue",  "copy_in",  "launch",
                                               "kernel", "copy_out", "total"};
constexpr const char* kCodeNames[kCodes] = {
    "OK",          "CANCELLED",           "UNKNOWN",           "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED", "NOT_FOUND",     "ALREADY_EXISTS",    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",    "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL",          "UNAVAILABLE",       "DATA_LOSS",
    "UNAUTHENTICATED"};

// Bucket bounds in seconds: 1 us .. 2^25 us = 33.6 s, doubling, so
// histogram_quantile is within 2x; 26 buckets keep a scrape near 250 KB.
struct Bounds {
  double le[kBounds];
  Bounds() {
    for (int k = 0; k < kBounds; ++k) le[k] = 1e-6 * static_cast<double>(int64_t{1} << k);
  }
};
const Bounds& PhaseBounds() {
  static const Bounds bounds;
  return bounds;
}

// The slot of `seconds` (from `us` microseconds): the first bound >= it, as
// Prometheus' `le` means; kBounds for +Inf. frexp guesses, two compares fix.
inline int BucketOf(double us, double seconds, const double* le) {
  if (!(us > 1.0)) return 0;  // also NaN and negative
  int e;
  std::frexp(us, &e);  // us in [2^(e-1), 2^e)
  int k = e < kBounds ? e : kBounds;
  while (k > 0 && seconds <= le[k - 1]) --k;
  while (k < kBounds && seconds > le[k]) ++k;
  return k;
}

inline void AddDouble(std::atomic<double>& a, double v) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

// One thread's share of every count: ~18 KB, cache-line aligned, so threads
// on different shards never share a cache line.
struct alignas(64) Shard {
  std::atomic<uint64_t> bucket[kOps][kDTypes][kPhases][kBounds + 1];
  std::atomic<double> sum[kOps][kDTypes][kPhases];
  std::atomic<uint64_t> calls[kMaxMethods][kCodes];
  std::atomic<uint64_t> bytes[kMaxMethods][2];  // in, out
  std::atomic<int64_t> in_flight;
};

// Threads take shards round-robin as they first record: the few gRPC and
// backend threads of a server each get their own.
inline int ThisThreadShard() {
  static std::atomic<unsigned> next{0};
  thread_local const int shard =
      static_cast<int>(next.fetch_add(1, std::memory_order_relaxed) % kShards);
  return shard;
}

// The short device id used as a label: "cuda:0 NVIDIA H200" -> "cuda:0".
std::string DeviceLabel(const std::string& device) {
  std::string id = device.substr(0, device.find(' '));
  return id.empty() ? "unknown" : id;
}

// Every RPC of fusebox.v1.KernelService, from the generated descriptor, so a
// new method gets its own label without an edit here; "other" comes last.
std::vector<std::string> MethodNames() {
  std::vector<std::string> names;
  const auto* service = v1::GeluRequest::descriptor()->file()->FindServiceByName("KernelService");
  for (int i = 0; service != nullptr && i < service->method_count() && i < kMaxMethods - 1; ++i) {
    names.push_back(service->method(i)->name());
  }
  names.push_back("other");
  return names;
}

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

prometheus::ClientMetric Sample(std::vector<prometheus::ClientMetric::Label> labels) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  return m;
}

// What RecordCall, CallStarted and CallFinished count (see the file comment).
class CallStats final : public prometheus::Collectable {
 public:
  CallStats(std::string backend, std::string device, std::string device_name)
      : shards_(new Shard[kShards]()),  // () zero-fills every atomic
        methods_(MethodNames()),
        backend_(std::move(backend)),
        device_(std::move(device)),
        device_name_(std::move(device_name)) {}

  void Record(const CallRecord& r) {
    Shard& s = shards_[ThisThreadShard()];
    const int m = MethodIndex(r.method);
    const int code = r.grpc_code >= 0 && r.grpc_code < kCodes ? r.grpc_code : kUnknownCode;
    s.calls[m][code].fetch_add(1, std::memory_order_relaxed);
    if (r.bytes_in > 0) s.bytes[m][0].fetch_add(r.bytes_in, std::memory_order_relaxed);
    if (r.bytes_out > 0) s.bytes[m][1].fetch_add(r.bytes_out, std::memory_order_relaxed);
    if (!r.ran) return;
    const int op = static_cast<int>(r.op);
    const int dt = static_cast<int>(r.dtype) - 1;
    if (op < 0 || op >= kOps || dt < 0 || dt >= kDTypes) return;
    const OpTiming& t = r.timing;
    const double us[kPhases] = {t.queue_us,  t.copy_in_us,  t.launch_us,
                                t.kernel_us, t.copy_out_us, t.total_us};
    const double* le = PhaseBounds().le;
    for (int ph = 0; ph < kPhases; ++ph) {
      const double v = us[ph] > 0 ? us[ph] : 0.0;  // a NaN or negative timing counts as 0
      const double seconds = v * 1e-6;
      s.bucket[op][dt][ph][BucketOf(v, seconds, le)].fetch_add(1, std::memory_order_relaxed);
      AddDouble(s.sum[op][dt][ph], seconds);
    }
  }

  void AddInFlight(int64_t delta) {
    shards_[ThisThreadShard()].in_flight.fetch_add(delta, std::memory_order_relaxed);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    out.push_back(PhaseFamily());

    auto calls = Family("fusebox_calls_total", "RPCs finished, by method and gRPC status code.",
                        prometheus::MetricType::Counter);
    auto bytes = Family("fusebox_payload_bytes_total",
                        "Tensor payload bytes received (direction=in) and sent (direction=out), "
                        "by method.",
                        prometheus::MetricType::Counter);
    for (size_t m = 0; m < methods_.size(); ++m) {
      for (int c = 0; c < kCodes; ++c) {
        auto x = Sample({{"code", kCodeNames[c]}, {"method", methods_[m]}});
        x.counter.value = static_cast<double>(Total([&](const Shard& s) {
          return s.calls[m][c].load(std::memory_order_relaxed);
        }));
        calls.metric.push_back(std::move(x));
      }
      for (int d = 0; d < 2; ++d) {
        auto x = Sample({{"direction", d == 0 ? "in" : "out"}, {"method", methods_[m]}});
        x.counter.value = static_cast<double>(Total([&](const Shard& s) {
          return s.bytes[m][d].load(std::memory_order_relaxed);
        }));
        bytes.metric.push_back(std::move(x));
      }
    }
    out.push_back(std::move(calls));
    out.push_back(std::move(bytes));

    auto in_flight = Family("fusebox_calls_in_flight", "RPCs between arrival and reply.",
                            prometheus::MetricType::Gauge);
    auto x = Sample({});
    // The shards are read one after another, so a call's -1 can be seen without its +1 (on
    // another thread's shard): never report fewer than none.
    x.gauge.value = static_cast<double>(std::max<int64_t>(0, Total([](const Shard& s) -> int64_t {
      return s.in_flight.load(std::memory_order_relaxed);
    })));
    in_flight.metric.push_back(std::move(x));
    out.push_back(std::move(in_flight));

    auto info = Family("fusebox_build_info", "Always 1; labels say what is running.",
                       prometheus::MetricType::Gauge);
    auto i = Sample({{"backend", backend_},
                     {"device", device_},
                     {"device_name", device_name_},
                     {"version", FUSEBOX_VERSION}});
    i.gauge.value = 1;
    info.metric.push_back(std::move(i));
    out.push_back(std::move(info));
    return out;
  }

 private:
  int MethodIndex(const char* method) const {
    const int other = static_cast<int>(methods_.size()) - 1;
    if (method == nullptr) return other;
    for (int i = 0; i < other; ++i) {  // a few short strcmp's: cheaper than hashing
      if (std::strcmp(methods_[i].c_str(), method) == 0) return i;
    }
    return other;
  }

  template <typename F>
  auto Total(F value) const -> decltype(value(std::declval<const Shard&>())) {
    decltype(value(std::declval<const Shard&>())) total = 0;
    for (int s = 0; s < kShards; ++s) total += value(shards_[s]);
    return total;
  }

  prometheus::MetricFamily PhaseFamily() const {
    auto f = Family("fusebox_call_phase_duration_seconds",
                    "Where each call's time went, by phase (queue, copy_in, launch, kernel, "
                    "copy_out, total): the numbers its response's Timing carries.",
                    prometheus::MetricType::Histogram);
    const double* le = PhaseBounds().le;
    for (int op = 0; op < kOps; ++op) {
      for (int dt = 0; dt < kDTypes; ++dt) {
        for (int ph = 0; ph < kPhases; ++ph) {
          auto x = Sample({{"device", device_},
                           {"dtype", DTypeName(static_cast<DType>(dt + 1))},
                           {"op", OpName(static_cast<Op>(op))},
                           {"phase", kPhaseNames[ph]}});
          uint64_t cumulative = 0;
          for (int k = 0; k <= kBounds; ++k) {
            cumulative += Total([&](const Shard& s) {
              return s.bucket[op][dt][ph][k].load(std::memory_order_relaxed);
            });
            prometheus::ClientMetric::Bucket b;
            b.cumulative_count = cumulative;
            b.upper_bound = k < kBounds ? le[k] : std::numeric_limits<double>::infinity();
            x.histogram.bucket.push_back(b);
          }
          x.histogram.sample_count = cumulative;  // = the +Inf bucket, always
          x.histogram.sample_sum = Total([&](const Shard& s) {
            return s.sum[op][dt][ph].load(std::memory_order_relaxed);
          });
          f.metric.push_back(std::move(x));
        }
      }
    }
    return f;
  }

  const std::unique_ptr<Shard[]> shards_;
  const std::vector<std::string> methods_;  // the last one is "other"
  const std::string backend_, device_, device_name_;
};

// One sample labelled with the device: a gauge, or a counter (a total the backend keeps).
prometheus::MetricFamily DeviceMetric(prometheus::MetricType type, const char* name, const char* help,
                                      const std::string& device, int64_t value) {
  auto f = Family(name, help, type);
  auto x = Sample({{"device", device}});
  if (type == prometheus::MetricType::Counter) {
    x.counter.value = static_cast<double>(value);
  } else {
    x.gauge.value = static_cast<double>(value);
  }
  f.metric.push_back(std::move(x));
  return f;
}
prometheus::MetricFamily DeviceGauge(const char* name, const char* help, const std::string& device,
                                     int64_t value) {
  return DeviceMetric(prometheus::MetricType::Gauge, name, help, device, value);
}
prometheus::MetricFamily DeviceCounter(const char* name, const char* help, const std::string& device,
                                       int64_t value) {
  return DeviceMetric(prometheus::MetricType::Counter, name, help, device, value);
}

// Gauges that belong to the backend and the tensor store, read when scraped.
class BackendCollector final : public prometheus::Collectable {
 public:
  BackendCollector(const Backend* backend, std::string device)
      : backend_(backend), device_(std::move(device)) {}

  void SetResidentTensorsSource(std::function<ResidentTensors()> source) {
    std::lock_guard<std::mutex> lock(mu_);
    resident_ = std::move(source);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    const BackendStats s = backend_->stats();
    ResidentTensors r;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (resident_) r = resident_();
    }
    return {
        DeviceGauge("fusebox_queued_calls",
                    "Calls accepted by the backend, waiting for a free stream (CPU: worker).",
                    device_, s.queued),
        DeviceGauge("fusebox_busy_streams", "Streams (CPU: workers) running a call now.",
                    device_, s.busy),
        DeviceGauge("fusebox_streams", "Streams (CPU: workers) in the backend's pool.", device_,
                    s.workers),
        DeviceGauge("fusebox_device_memory_used_bytes",
                    "Device memory in use on the GPU, bytes; 0 on the CPU backend.", device_,
                    s.device_memory_used),
        DeviceGauge("fusebox_device_memory_total_bytes",
                    "Device memory of the GPU, bytes; 0 on the CPU backend.", device_,
                    s.device_memory_total),
        DeviceGauge("fusebox_resident_tensors",
                    "Tensors held on the server by handle (the tensor store; 0 without one).",
                    device_, r.count),
        DeviceGauge("fusebox_resident_tensor_bytes",
                    "Bytes of tensors held on the server by handle (the tensor store; 0 without "
                    "one).",
                    device_, r.bytes),
        DeviceCounter("fusebox_op_calls_total",
                      "Op calls that reached a kernel launch (server/exec/batcher.h).", device_,
                      s.calls),
        DeviceCounter("fusebox_launches_total",
                      "Kernel launches of op calls; a batch of small calls is one "
                      "(launches per call = this / fusebox_op_calls_total).",
                      device_, s.launches),
        DeviceCounter("fusebox_batched_calls_total",
                      "Op calls that ran in a batch of two or more (--batching).", device_,
                      s.batched_calls),
    };
  }

 private:
  const Backend* backend_;
  const std::string device_;
  mutable std::mutex mu_;
  std::function<ResidentTensors()> resident_;
};

class PrometheusMetrics final : public Metrics {
 public:
  PrometheusMetrics(std::shared_ptr<CallStats> calls,
                    std::shared_ptr<BackendCollector> backend_gauges,
                    std::unique_ptr<MetricsHttpServer> http)
      : calls_(std::move(calls)),
        backend_gauges_(std::move(backend_gauges)),
        http_(std::move(http)) {}

  void RecordCall(const CallRecord& record) override { calls_->Record(record); }
  void CallStarted() override { calls_->AddInFlight(1); }
  void CallFinished() override { calls_->AddInFlight(-1); }

  void SetResidentTensorsSource(std::function<ResidentTensors()> source) override {
    backend_gauges_->SetResidentTensorsSource(std::move(source));
  }

  int port() const override { return http_->port(); }

 private:
  const std::shared_ptr<CallStats> calls_;
  const std::shared_ptr<BackendCollector> backend_gauges_;
  const std::unique_ptr<MetricsHttpServer> http_;  // holds the collectors too
};

}  // namespace

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& address,
                                                        const Backend* backend) {
  if (backend == nullptr) return absl::InvalidArgumentError("Metrics::Start: no backend");
  const std::string device = DeviceLabel(backend->device());
  auto calls = std::make_shared<CallStats>(backend->name(), device, backend->device());
  auto backend_gauges = std::make_shared<BackendCollector>(backend, device);
  auto http = MetricsHttpServer::Start(address, {calls, backend_gauges});
  if (!http.ok()) {
    return absl::Status(http.status().code(),
                        absl::StrCat("--metrics_address: cannot serve /metrics on ",
                                     http.status().message()));
  }
  return std::unique_ptr<Metrics>(
      new PrometheusMetrics(std::move(calls), std::move(backend_gauges), *std::move(http)));
}

}  // namespace fusebox
