// What recording one call's metrics costs (issue 5 asks for < 1 us): the real
// exporter (Metrics::Start on a loopback port, server/rpc/metrics.cc) with a stub
// backend, one thread and several threads recording at once. Read the CPU
// column: CPU time per call, summed over threads. Two designs the exporter
// avoids, for contrast: prometheus-cpp's Histogram/Counter objects resolved
// once (a mutex and CAS loops per Observe), and Family::Add (a hashed label
// lookup) on every observation. Results: bench/metrics/RESULTS.md.
#include <benchmark/benchmark.h>
#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "server/rpc/metrics.h"

namespace fusebox {
namespace {

class StubBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  std::string device() const override { return "cpu"; }
  void Submit(const OpCall&, int64_t, OpDone done) override { done(absl::OkStatus(), {}); }
  BackendStats stats() const override { return {}; }
  void Shutdown() override {}
};

Metrics& Shared() {
  static StubBackend backend;
  static Metrics* metrics = [] {
    auto m = Metrics::Start("127.0.0.1:0", &backend);
    if (!m.ok()) {
      std::fprintf(stderr, "Metrics::Start: %s\n", m.status().ToString().c_str());
      std::abort();
    }
    return m->release();
  }();
  return *metrics;
}

CallRecord Record(int i) {
  static const char* kMethods[] = {"Gelu", "Softmax", "RowSum", "MatmulRelu"};
  CallRecord r;
  r.method = kMethods[i & 3];
  r.op = static_cast<Op>(i & 3);
  r.dtype = static_cast<DType>(1 + (i >> 2) % 3);
  r.ran = true;
  r.timing.queue_us = 4.0 + (i & 7);
  r.timing.copy_in_us = 120.0;
  r.timing.launch_us = 20.0 + (i & 3);
  r.timing.kernel_us = 35.0 + (i & 15);
  r.timing.copy_out_us = 110.0;
  r.timing.total_us = 300.0 + (i & 31);
  r.bytes_in = r.bytes_out = 1 << 20;
  return r;
}

// One finished call that ran: 1 call counter + 2 byte counters + 5 histograms,
// the label combination varying call to call as in a mixed workload. Under
// ->Threads(n) every thread records at once into the same exporter.
void BM_RecordCall(benchmark::State& state) {
  Metrics& m = Shared();
  CallRecord records[64];
  for (int i = 0; i < 64; ++i) records[i] = Record(i + state.thread_index() * 7);
  int i = 0;
  for (auto _ : state) {
    m.RecordCall(records[i++ & 63]);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RecordCall)->ThreadRange(1, 8)->UseRealTime();

// Every thread records the same op and dtype: only the sharding keeps the
// threads apart.
void BM_RecordCallSameLabels(benchmark::State& state) {
  Metrics& m = Shared();
  const CallRecord r = Record(0);
  for (auto _ : state) m.RecordCall(r);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RecordCallSameLabels)->ThreadRange(1, 8)->UseRealTime();

// A rejected call: one counter, no histograms.
void BM_RecordCallError(benchmark::State& state) {
  Metrics& m = Shared();
  CallRecord r;
  r.method = "MatmulRelu";
  r.op = Op::kMatmulRelu;
  r.grpc_code = 3;
  for (auto _ : state) m.RecordCall(r);
}
BENCHMARK(BM_RecordCallError);

// What service.cc adds around RecordCall per RPC.
void BM_CallStartedFinished(benchmark::State& state) {
  Metrics& m = Shared();
  for (auto _ : state) {
    m.CallStarted();
    m.CallFinished();
  }
}
BENCHMARK(BM_CallStartedFinished);

// The same work (6 histogram observations, 3 counter increments) through
// prometheus-cpp's own Histogram and Counter, resolved once at start-up.
void BM_PrometheusCppObjects(benchmark::State& state) {
  struct Objects {
    prometheus::Registry registry;
    prometheus::Histogram* h[4][6];
    prometheus::Counter* c[4][3];
    Objects() {
      prometheus::Histogram::BucketBoundaries b;
      for (int k = 0; k < 26; ++k) b.push_back(1e-6 * (1 << k));
      auto& hf = prometheus::BuildHistogram().Name("h_seconds").Help("x").Register(registry);
      auto& cf = prometheus::BuildCounter().Name("c_total").Help("x").Register(registry);
      for (int op = 0; op < 4; ++op) {
        for (int p = 0; p < 6; ++p) h[op][p] = &hf.Add({{"op", std::to_string(op)},
                                                        {"phase", std::to_string(p)}}, b);
        for (int i = 0; i < 3; ++i) c[op][i] = &cf.Add({{"op", std::to_string(op)},
                                                        {"i", std::to_string(i)}});
      }
    }
  };
  static Objects o;
  CallRecord records[64];
  for (int i = 0; i < 64; ++i) records[i] = Record(i + state.thread_index() * 7);
  int i = 0;
  for (auto _ : state) {
    const CallRecord& r = records[i++ & 63];
    const int op = static_cast<int>(r.op);
    o.c[op][0]->Increment();
    o.c[op][1]->Increment(static_cast<double>(r.bytes_in));
    o.c[op][2]->Increment(static_cast<double>(r.bytes_out));
    o.h[op][0]->Observe(r.timing.queue_us * 1e-6);
    o.h[op][1]->Observe(r.timing.copy_in_us * 1e-6);
    o.h[op][2]->Observe(r.timing.launch_us * 1e-6);
    o.h[op][3]->Observe(r.timing.kernel_us * 1e-6);
    o.h[op][4]->Observe(r.timing.copy_out_us * 1e-6);
    o.h[op][5]->Observe(r.timing.total_us * 1e-6);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PrometheusCppObjects)->ThreadRange(1, 8)->UseRealTime();

// The design this exporter avoids: resolving labels on every call.
void BM_LabelLookupPerCall(benchmark::State& state) {
  static prometheus::Registry registry;
  static auto& family =
      prometheus::BuildHistogram().Name("lookup_seconds").Help("x").Register(registry);
  const prometheus::Histogram::BucketBoundaries buckets = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1};
  const char* phases[] = {"queue", "copy_in", "launch", "kernel", "copy_out", "total"};
  for (auto _ : state) {
    for (const char* phase : phases) {
      family
          .Add({{"op", "Gelu"}, {"dtype", "float32"}, {"device", "cpu"}, {"phase", phase}},
               buckets)
          .Observe(1e-4);
    }
  }
}
BENCHMARK(BM_LabelLookupPerCall);

}  // namespace
}  // namespace fusebox

BENCHMARK_MAIN();
