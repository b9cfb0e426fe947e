// The Prometheus exporter behind server/metrics.h: prometheus-cpp's Exposer
// serves /metrics; every family and every label combination is created here at
// start-up, so RecordCall only indexes fixed arrays (no map lookup, no string
// building, no allocation): about 0.2 us per call, see bench/metrics/RESULTS.md.
//
// Families (label values are all bounded; `device` is one per server):
//   fusebox_call_phase_duration_seconds  histogram {op, dtype, device, phase}
//       phase = queue | copy_in | kernel | copy_out | total; buckets 1 us x 2^k,
//       k = 0..25 (1 us .. 33.6 s). Observed once per call that ran, from the
//       same OpTiming the response's Timing is filled from.
//   fusebox_calls_total                  counter {method, code}  every RPC, its gRPC code name
//   fusebox_payload_bytes_total          counter {method, direction}  tensor bytes in / out
//   fusebox_calls_in_flight              gauge   RPCs between arrival and Finish
//   fusebox_build_info                   gauge=1 {version, backend, device, device_name}
// Read from the backend when scraped (BackendCollector below, no polling thread):
//   fusebox_queued_calls                 gauge {device}  accepted, waiting for a stream/worker
//   fusebox_busy_streams                 gauge {device}  streams (CPU: workers) running a call
//   fusebox_streams                      gauge {device}  size of that pool
//   fusebox_device_memory_used_bytes     gauge {device}  0 on the CPU backend
//   fusebox_device_memory_total_bytes    gauge {device}  0 on the CPU backend
//   fusebox_resident_tensors             gauge {device}  tensors the store holds by handle, from
//   fusebox_resident_tensor_bytes        gauge {device}  SetResidentTensorsSource; 0 without one
#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <cstring>
#include <exception>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fusebox/v1/kernel_service.pb.h"

#ifndef FUSEBOX_VERSION
#define FUSEBOX_VERSION "unknown"
#endif

namespace fusebox {
namespace {

constexpr int kOps = 4;      // Op::kGelu .. Op::kMatmulRelu
constexpr int kDTypes = 3;   // DType::kFloat32 (1) .. DType::kBFloat16 (3)
constexpr int kPhases = 5;
constexpr int kCodes = 17;   // grpc::StatusCode OK (0) .. UNAUTHENTICATED (16)
constexpr const char* kPhaseNames[kPhases] = {"queue", "copy_in", "kernel", "copy_out", "total"};
constexpr const char* kCodeNames[kCodes] = {
    "OK",          "CANCELLED",           "UNKNOWN",           "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED", "NOT_FOUND",     "ALREADY_EXISTS",    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",    "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL",          "UNAVAILABLE",       "DATA_LOSS",
    "UNAUTHENTICATED"};
constexpr int kUnknownCode = 2;

// 1 us .. 2^25 us = 33.6 s, doubling: histogram_quantile is then within 2x.
prometheus::Histogram::BucketBoundaries PhaseBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (int k = 0; k <= 25; ++k) b.push_back(1e-6 * static_cast<double>(int64_t{1} << k));
  return b;
}

// The short device id used as a label: "cuda:0 NVIDIA H200" -> "cuda:0".
std::string DeviceLabel(const std::string& device) {
  const size_t space = device.find(' ');
  std::string id = device.substr(0, space);
  return id.empty() ? "unknown" : id;
}

// Every RPC of fusebox.v1.KernelService, from the generated descriptor, so a
// new method gets its own label without an edit here; "other" catches the rest.
std::vector<std::string> MethodNames() {
  std::vector<std::string> names;
  const auto* service =
      v1::GeluRequest::descriptor()->file()->FindServiceByName("KernelService");
  if (service != nullptr) {
    for (int i = 0; i < service->method_count(); ++i) names.push_back(service->method(i)->name());
  }
  names.push_back("other");
  return names;
}

prometheus::ClientMetric GaugeSample(const std::string& device, double value) {
  prometheus::ClientMetric m;
  m.label.push_back({"device", device});
  m.gauge.value = value;
  return m;
}

prometheus::MetricFamily GaugeFamily(const char* name, const char* help,
                                     const std::string& device, double value) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = prometheus::MetricType::Gauge;
  f.metric.push_back(GaugeSample(device, value));
  return f;
}

// Gauges that belong to the backend and the tensor store, read when scraped:
// always current, and nothing runs between scrapes.
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
    const auto d = [](int64_t v) { return static_cast<double>(v); };
    return {
        GaugeFamily("fusebox_queued_calls",
                    "Calls accepted by the backend, waiting for a free stream (CPU: worker).",
                    device_, d(s.queued)),
        GaugeFamily("fusebox_busy_streams",
                    "Streams (CPU: workers) running a call now.", device_, d(s.busy)),
        GaugeFamily("fusebox_streams",
                    "Streams (CPU: workers) in the backend's pool.", device_, d(s.workers)),
        GaugeFamily("fusebox_device_memory_used_bytes",
                    "Device memory in use on the GPU, bytes; 0 on the CPU backend.", device_,
                    d(s.device_memory_used)),
        GaugeFamily("fusebox_device_memory_total_bytes",
                    "Device memory of the GPU, bytes; 0 on the CPU backend.", device_,
                    d(s.device_memory_total)),
        GaugeFamily("fusebox_resident_tensors",
                    "Tensors held on the server by handle (the tensor store; 0 without one).",
                    device_, d(r.count)),
        GaugeFamily("fusebox_resident_tensor_bytes",
                    "Bytes of tensors held on the server by handle (the tensor store; 0 "
                    "without one).",
                    device_, d(r.bytes)),
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
  PrometheusMetrics(const Backend* backend, std::unique_ptr<prometheus::Exposer> exposer)
      : registry_(std::make_shared<prometheus::Registry>()),
        collector_(std::make_shared<BackendCollector>(backend, DeviceLabel(backend->device()))),
        exposer_(std::move(exposer)),
        methods_(MethodNames()) {
    const std::string device = DeviceLabel(backend->device());

    auto& phases = prometheus::BuildHistogram()
                       .Name("fusebox_call_phase_duration_seconds")
                       .Help("Where each call's time went, by phase (queue, copy_in, kernel, "
                             "copy_out, total): the numbers its response's Timing carries.")
                       .Register(*registry_);
    const auto buckets = PhaseBuckets();
    for (int op = 0; op < kOps; ++op) {
      for (int dt = 0; dt < kDTypes; ++dt) {
        for (int ph = 0; ph < kPhases; ++ph) {
          phase_[op][dt][ph] = &phases.Add({{"op", OpName(static_cast<Op>(op))},
                                            {"dtype", DTypeName(static_cast<DType>(dt + 1))},
                                            {"device", device},
                                            {"phase", kPhaseNames[ph]}},
                                           buckets);
        }
      }
    }

    auto& calls = prometheus::BuildCounter()
                      .Name("fusebox_calls_total")
                      .Help("RPCs finished, by method and gRPC status code.")
                      .Register(*registry_);
    auto& bytes = prometheus::BuildCounter()
                      .Name("fusebox_payload_bytes_total")
                      .Help("Tensor payload bytes received (direction=in) and sent "
                            "(direction=out), by method.")
                      .Register(*registry_);
    calls_.resize(methods_.size());
    bytes_in_.resize(methods_.size());
    bytes_out_.resize(methods_.size());
    for (size_t m = 0; m < methods_.size(); ++m) {
      for (int c = 0; c < kCodes; ++c) {
        calls_[m][c] = &calls.Add({{"method", methods_[m]}, {"code", kCodeNames[c]}});
      }
      bytes_in_[m] = &bytes.Add({{"method", methods_[m]}, {"direction", "in"}});
      bytes_out_[m] = &bytes.Add({{"method", methods_[m]}, {"direction", "out"}});
    }

    in_flight_ = &prometheus::BuildGauge()
                      .Name("fusebox_calls_in_flight")
                      .Help("RPCs between arrival and reply.")
                      .Register(*registry_)
                      .Add({});
    prometheus::BuildGauge()
        .Name("fusebox_build_info")
        .Help("Always 1; labels say what is running.")
        .Register(*registry_)
        .Add({{"version", FUSEBOX_VERSION},
              {"backend", backend->name()},
              {"device", device},
              {"device_name", backend->device()}})
        .Set(1);

    exposer_->RegisterCollectable(registry_);
    exposer_->RegisterCollectable(collector_);
  }

  void RecordCall(const CallRecord& r) override {
    const size_t m = MethodIndex(r.method);
    const int code = r.grpc_code >= 0 && r.grpc_code < kCodes ? r.grpc_code : kUnknownCode;
    calls_[m][code]->Increment();
    if (r.bytes_in > 0) bytes_in_[m]->Increment(static_cast<double>(r.bytes_in));
    if (r.bytes_out > 0) bytes_out_[m]->Increment(static_cast<double>(r.bytes_out));
    if (!r.ran) return;
    const int op = static_cast<int>(r.op);
    const int dt = static_cast<int>(r.dtype) - 1;
    if (op < 0 || op >= kOps || dt < 0 || dt >= kDTypes) return;
    prometheus::Histogram* const* h = phase_[op][dt].data();
    const OpTiming& t = r.timing;
    h[0]->Observe(t.queue_us * 1e-6);
    h[1]->Observe(t.copy_in_us * 1e-6);
    h[2]->Observe(t.kernel_us * 1e-6);
    h[3]->Observe(t.copy_out_us * 1e-6);
    h[4]->Observe(t.total_us * 1e-6);
  }

  void CallStarted() override { in_flight_->Increment(); }
  void CallFinished() override { in_flight_->Decrement(); }

  void SetResidentTensorsSource(std::function<ResidentTensors()> source) override {
    collector_->SetResidentTensorsSource(std::move(source));
  }

  int port() const override {
    const std::vector<int> ports = exposer_->GetListeningPorts();
    return ports.empty() ? 0 : ports.front();
  }

 private:
  // A handful of short strcmp's: a few ns, cheaper than hashing the name.
  size_t MethodIndex(const char* method) const {
    const size_t other = methods_.size() - 1;
    if (method == nullptr) return other;
    for (size_t i = 0; i < other; ++i) {
      if (std::strcmp(methods_[i].c_str(), method) == 0) return i;
    }
    return other;
  }

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<BackendCollector> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  const std::vector<std::string> methods_;  // the last one is "other"
  // Pointers into registry_'s families, resolved once above.
  std::array<std::array<std::array<prometheus::Histogram*, kPhases>, kDTypes>, kOps> phase_{};
  std::vector<std::array<prometheus::Counter*, kCodes>> calls_;
  std::vector<prometheus::Counter*> bytes_in_, bytes_out_;
  prometheus::Gauge* in_flight_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& address,
                                                        const Backend* backend) {
  if (backend == nullptr) return absl::InvalidArgumentError("Metrics::Start: no backend");
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // Two HTTP threads: a scrape never waits behind another one.
    exposer = std::make_unique<prometheus::Exposer>(address, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("--metrics_address: cannot serve /metrics on ", address, ": ", e.what()));
  }
  return std::unique_ptr<Metrics>(new PrometheusMetrics(backend, std::move(exposer)));
}

}  // namespace fusebox
