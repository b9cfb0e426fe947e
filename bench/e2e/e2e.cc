// fusebox-e2e: the real server, end to end, through the C++ client. Meant for
// the H200 (bench/e2e/run_e2e.sh starts the server with the CUDA backend),
// but runs against any server.
//   1. correctness: every op x dtype, inline and by handle, odd shapes, against
//      the fp64 reference (tests/reference.h), outputs checked for NaN/unwritten;
//   2. kernel time in responses vs the kernel benchmark's median for the same
//      shape (--bench_json: records {op,dtype,rows,cols,impl,ms}); inputs are
//      uploaded once and outputs kept on the server, so only the kernel runs;
//   3. RPC path: 4 KiB GeLU latency p50/p99, 64 MiB GeLU throughput (inline);
//   4. a 4 GiB upload (GB/s) and a chain matmul+ReLU -> softmax -> row sum on it,
//      with only the row sums crossing the network.
// Prints a short table last; --json writes every number.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "client/cpp/fusebox_client.h"
#include "tests/reference.h"

namespace fc = fusebox::client;
using fusebox::DType;

namespace {

struct Row {
  std::string what, value, verdict;
};
std::vector<Row> g_table;
std::ostringstream g_json;
int g_failures = 0;

void Report(const std::string& what, const std::string& value, bool ok) {
  g_table.push_back({what, value, ok ? "ok" : "FAIL"});
  if (!ok) ++g_failures;
  std::printf("%-58s %-40s %s\n", what.c_str(), value.c_str(), ok ? "ok" : "FAIL");
  std::fflush(stdout);
}

std::string Fmt(const char* fmt, double a, double b = 0, double c = 0, double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, a, b, c, d);
  return buf;
}

fc::HostTensor Random(DType dt, std::vector<int64_t> shape, float lo, float hi) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  auto bytes = fusebox::ref::RandomTensor(dt, n, lo, hi, std::random_device{}());
  fc::HostTensor t;
  t.dtype = dt;
  t.shape = std::move(shape);
  t.data.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return t;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

const char* Name(DType d) { return fusebox::DTypeName(d); }

// 1. Correctness of every op and dtype, inline and through handles.
void CheckCorrectness(fc::Client& c) {
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  for (DType dt : dtypes) {
    const double tol = fusebox::ref::DefaultTolerance(dt);
    for (auto shape : std::vector<std::vector<int64_t>>{{1, 1}, {3, 1000}, {7, 65537}, {2, 3, 1025},
                                                         {1, 1 << 20}, {4097, 33}}) {
      const int64_t cols = shape.back();
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      const int64_t rows = n / cols;
      fc::HostTensor x = Random(dt, shape, -8, 8);
      std::string sh;
      for (int64_t d : shape) sh += (sh.empty() ? "" : "x") + std::to_string(d);
      for (bool by_handle : {false, true}) {
        std::string handle;
        if (by_handle) {
          auto up = c.Upload(x);
          if (!up.ok()) {
            Report(std::string("upload ") + Name(dt) + " " + sh, std::string(up.status().message()), false);
            continue;
          }
          handle = up->handle;
        }
        const fc::Arg in = by_handle ? fc::Arg::Handle(handle) : fc::Arg(x);
        const std::string how = by_handle ? " (handle)" : " (inline)";
        auto g = c.Gelu(in);
        auto gr = fusebox::ref::Gelu(dt, x.data.data(), n);
        auto gc = g.ok() ? fusebox::ref::Compare(dt, g->output.data.data(), gr, tol) : fusebox::ref::Comparison{};
        Report(std::string("Gelu ") + Name(dt) + " " + sh + how,
               g.ok() ? Fmt("rel err %.2e", gc.rel_error) : std::string(g.status().message()), g.ok() && gc.ok);
        auto s = c.Softmax(in);
        auto sr = fusebox::ref::Softmax(dt, x.data.data(), rows, cols);
        auto sc = s.ok() ? fusebox::ref::Compare(dt, s->output.data.data(), sr, tol) : fusebox::ref::Comparison{};
        Report(std::string("Softmax ") + Name(dt) + " " + sh + how,
               s.ok() ? Fmt("rel err %.2e", sc.rel_error) : std::string(s.status().message()), s.ok() && sc.ok);
        auto r = c.RowSum(in);
        auto rr = fusebox::ref::RowSum(dt, x.data.data(), rows, cols);
        const double rtol = fusebox::ref::RowSumTolerance(dt, x.data.data(), rows, cols, rr);
        auto rc = r.ok() ? fusebox::ref::Compare(DType::kFloat32, r->output.data.data(), rr, rtol)
                         : fusebox::ref::Comparison{};
        Report(std::string("RowSum ") + Name(dt) + " " + sh + how,
               r.ok() ? Fmt("rel err %.2e", rc.rel_error) : std::string(r.status().message()), r.ok() && rc.ok);
        if (by_handle) (void)c.FreeTensor(handle);
      }
    }
    for (auto mnk : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {3, 5, 7}, {65, 33, 129}, {1000, 1000, 1000}, {64, 4096, 4096}}) {
      const int64_t m = mnk[0], n = mnk[1], k = mnk[2];
      fc::HostTensor a = Random(dt, {m, k}, -1, 1), b = Random(dt, {k, n}, -1, 1),
                     bias = Random(dt, {n}, -1, 1);
      for (int impl = 1; impl <= 2; ++impl) {
        for (bool with_bias : {false, true}) {
          for (bool tf32 : {false, true}) {
            if (tf32 && dt != DType::kFloat32) continue;
            fc::CallOptions o;
            o.impl = static_cast<fc::MatmulImpl>(impl);
            o.allow_tf32 = tf32;
            auto res = c.MatmulRelu(a, b, with_bias ? &bias : nullptr, o);
            auto want = fusebox::ref::MatmulRelu(dt, a.data.data(), b.data.data(),
                                                 with_bias ? bias.data.data() : nullptr, m, n, k);
            const double t = dt == DType::kFloat32 ? (tf32 || impl == 2 ? 5e-3 : 1e-5) : 1e-2;
            auto cmp = res.ok() ? fusebox::ref::Compare(dt, res->output.data.data(), want, t)
                                : fusebox::ref::Comparison{};
            const std::string what = std::string("MatmulRelu ") + (impl == 1 ? "cublaslt " : "tiled ") +
                                     Name(dt) + Fmt(" %.0fx%.0fx%.0f", m, n, k) +
                                     (with_bias ? " +bias" : "") + (tf32 ? " tf32" : "");
            Report(what, res.ok() ? Fmt("rel err %.2e", cmp.rel_error) : std::string(res.status().message()),
                   res.ok() && cmp.ok);
          }
        }
      }
    }
  }
}

// Benchmark medians by (op, dtype, rows, cols) from the kernel benchmark's JSON
// (records whose impl is "ours"). A tiny scanner: the format is ours.
std::map<std::string, double> LoadBench(const std::string& path) {
  std::map<std::string, double> out;
  std::ifstream in(path);
  std::string line;
  auto field = [](const std::string& l, const std::string& key) -> std::string {
    const std::string k = "\"" + key + "\": ";
    size_t at = l.find(k);
    if (at == std::string::npos) return "";
    at += k.size();
    if (l[at] == '"') return l.substr(at + 1, l.find('"', at + 1) - at - 1);
    return l.substr(at, l.find_first_of(",}", at) - at);
  };
  while (std::getline(in, line)) {
    if (field(line, "impl") != "ours" || !field(line, "error").empty()) continue;
    out[field(line, "op") + "/" + field(line, "dtype") + "/" + field(line, "rows") + "x" +
        field(line, "cols")] = std::stod(field(line, "ms")) * 1e3;
  }
  return out;
}

// 2. Kernel time reported by the server vs the benchmark for the same shape.
void CompareKernelTimes(fc::Client& c, const std::map<std::string, double>& bench) {
  struct Shape { const char* op; int64_t rows, cols; };
  const Shape shapes[] = {{"gelu", 1, int64_t{1} << 28}, {"softmax", 262144, 128}, {"softmax", 65536, 1024},
                          {"softmax", 8192, 8192}, {"softmax", 2048, 32768}, {"softmax", 128, 1048576},
                          {"rowsum", 262144, 128}, {"rowsum", 65536, 1024}, {"rowsum", 8192, 8192},
                          {"rowsum", 2048, 32768}, {"rowsum", 128, 1048576}};
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    for (const Shape& s : shapes) {
      const std::string key = std::string(s.op) + "/" + Name(dt) + "/" + std::to_string(s.rows) + "x" +
                              std::to_string(s.cols);
      auto it = bench.find(key);
      fc::HostTensor x = Random(dt, s.op[0] == 'g' ? std::vector<int64_t>{s.cols} : std::vector<int64_t>{s.rows, s.cols}, -4, 4);
      auto up = c.Upload(x);
      if (!up.ok()) {
        Report("kernel time " + key, std::string(up.status().message()), false);
        continue;
      }
      std::vector<double> us, launch;
      fc::CallOptions keep;
      keep.keep_on_server = true;
      for (int i = 0; i < 12; ++i) {
        const fc::Arg in = fc::Arg::Handle(up->handle);
        auto r = s.op[0] == 'g' ? c.Gelu(in, keep) : s.op[0] == 's' ? c.Softmax(in, keep) : c.RowSum(in, keep);
        if (!r.ok()) {
          Report("kernel time " + key, std::string(r.status().message()), false);
          break;
        }
        (void)c.FreeTensor(r->handle);
        if (i >= 2) {  // first two: warm-up
          us.push_back(r->timing.kernel_us);
          launch.push_back(r->timing.launch_us);
        }
      }
      (void)c.FreeTensor(up->handle);
      if (us.empty()) continue;
      const double med = Median(us), med_launch = Median(launch);
      g_json << "{\"kind\": \"kernel_time\", \"shape\": \"" << key << "\", \"server_us\": " << med
             << ", \"launch_us\": " << med_launch << ", \"bench_us\": " << (it == bench.end() ? 0.0 : it->second)
             << "},\n";
      if (it == bench.end()) {
        Report("kernel time " + key, Fmt("server %.1f us (no bench row)", med), false);
      } else {
        const double ratio = med / it->second;
        Report("kernel time " + key,
               Fmt("server %.1f us / bench %.1f us = %.3f (launch %.1f us)", med, it->second, ratio, med_launch),
               std::fabs(ratio - 1) <= 0.10);
      }
    }
  }
}

// 3. Latency of small calls and throughput of large ones, inline.
void RpcPath(fc::Client& c) {
  fc::HostTensor small = Random(DType::kFloat32, {1024}, -3, 3);  // 4 KiB
  fc::OpResult res;
  for (int i = 0; i < 200; ++i) (void)c.Call(fc::Op::kGelu, {fc::Arg(small)}, &res);
  // Per call the client's latency and the server's own total and queue time (from the
  // response), so that a slow tail can be placed inside the server or outside it.
  std::vector<double> lat, server_total, server_queue;
  for (int i = 0; i < 2000; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!c.Call(fc::Op::kGelu, {fc::Arg(small)}, &res).ok()) break;
    lat.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    server_total.push_back(res.timing.total_us);
    server_queue.push_back(res.timing.queue_us);
  }
  const double p50 = Percentile(lat, 0.5), p99 = Percentile(lat, 0.99);
  const double s50 = Percentile(server_total, 0.5), s99 = Percentile(server_total, 0.99);
  const double q50 = Percentile(server_queue, 0.5), q99 = Percentile(server_queue, 0.99);
  g_json << "{\"kind\": \"gelu_4KiB_latency\", \"p50_us\": " << p50 << ", \"p99_us\": " << p99
         << ", \"server_total_p50_us\": " << s50 << ", \"server_total_p99_us\": " << s99
         << ", \"server_queue_p50_us\": " << q50 << ", \"server_queue_p99_us\": " << q99 << "},\n";
  Report("GeLU 4 KiB fp32 inline latency (2000 calls)", Fmt("p50 %.0f us, p99 %.0f us", p50, p99), lat.size() == 2000);
  Report("  inside the server: total p50 / p99, queue p50 / p99 us",
         Fmt("%.0f / %.0f, %.0f / %.0f", s50, s99, q50, q99), true);

  fc::HostTensor big = Random(DType::kFloat32, {int64_t{16} << 20}, -3, 3);  // 64 MiB
  for (int i = 0; i < 2; ++i) (void)c.Call(fc::Op::kGelu, {fc::Arg(big)}, &res);
  std::vector<double> secs;
  fc::Timing last;
  for (int i = 0; i < 10; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!c.Call(fc::Op::kGelu, {fc::Arg(big)}, &res).ok()) break;
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    last = res.timing;
  }
  const double med = Median(secs);
  const double gbps = med > 0 ? (64.0 * (1 << 20)) / med / 1e9 : 0;
  g_json << "{\"kind\": \"gelu_64MiB\", \"median_s\": " << med << ", \"gbps_in\": " << gbps
         << ", \"copy_in_us\": " << last.copy_in_us << ", \"kernel_us\": " << last.kernel_us
         << ", \"copy_out_us\": " << last.copy_out_us << ", \"server_total_us\": " << last.total_us << "},\n";
  Report("GeLU 64 MiB fp32 inline (10 calls)",
         Fmt("%.1f ms/call, %.2f GB/s in", med * 1e3, gbps), secs.size() == 10);
  Report("  its server phases: copy-in / kernel / copy-out us",
         Fmt("%.0f / %.0f / %.0f", last.copy_in_us, last.kernel_us, last.copy_out_us), true);
}

// 4. A 4 GiB upload, then matmul+ReLU -> softmax -> row sum on it.
void BigUploadAndChain(fc::Client& c, double h2d_gbps) {
  const int64_t m = 32768, k = 32768, n = 256;  // A: 4 GiB of float32
  fc::HostTensor a = Random(DType::kFloat32, {m, k}, -1, 1);
  fc::HostTensor b = Random(DType::kFloat32, {k, n}, -1, 1);
  const auto t0 = std::chrono::steady_clock::now();
  auto up = c.Upload(a, 4 << 20, std::chrono::milliseconds(600000));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!up.ok()) {
    Report("upload 4 GiB", std::string(up.status().message()), false);
    return;
  }
  const double gbps = a.data.size() / secs / 1e9;
  g_json << "{\"kind\": \"upload_4GiB\", \"seconds\": " << secs << ", \"gbps\": " << gbps
         << ", \"pinned_h2d_gbps\": " << h2d_gbps << "},\n";
  Report("upload 4 GiB fp32 (4 MiB chunks), client wall clock",
         Fmt("%.2f GB/s (pinned H2D %.1f GB/s)", gbps, h2d_gbps), true);
  fc::CallOptions keep;
  keep.keep_on_server = true;
  keep.allow_tf32 = true;
  auto mm = c.MatmulRelu(fc::Arg::Handle(up->handle), b, nullptr, keep);
  if (!mm.ok()) {
    Report("chain: matmul+ReLU", std::string(mm.status().message()), false);
    return;
  }
  fc::CallOptions keep2;
  keep2.keep_on_server = true;
  auto sm = c.Softmax(fc::Arg::Handle(mm->handle), keep2);
  if (!sm.ok()) {
    Report("chain: softmax", std::string(sm.status().message()), false);
    return;
  }
  auto rs = c.RowSum(fc::Arg::Handle(sm->handle));
  if (!rs.ok()) {
    Report("chain: row sum", std::string(rs.status().message()), false);
    return;
  }
  // Each softmax row sums to 1; and 4 rows of the matmul checked against fp64.
  const auto sums = rs->output.ToFloats();
  double worst = 0;
  for (float v : sums) worst = std::max(worst, std::fabs(v - 1.0));
  auto mid = c.Download(mm->handle);
  double rel = 1;
  if (mid.ok()) {
    const int64_t rows[4] = {0, 1, 12345, m - 1};
    double num = 0, den = 0;
    const float* A = reinterpret_cast<const float*>(a.data.data());
    const float* B = reinterpret_cast<const float*>(b.data.data());
    const float* O = reinterpret_cast<const float*>(mid->data.data());
    for (int64_t r : rows) {
      std::vector<double> acc(n, 0.0);
      for (int64_t p = 0; p < k; ++p) {
        for (int64_t j = 0; j < n; ++j) acc[j] += double(A[r * k + p]) * B[p * n + j];
      }
      for (int64_t j = 0; j < n; ++j) {
        const double want = std::max(acc[j], 0.0);
        num += (O[r * n + j] - want) * (O[r * n + j] - want);
        den += want * want;
      }
    }
    rel = std::sqrt(num / std::max(den, 1e-300));
  }
  const bool ok = sums.size() == static_cast<size_t>(m) && worst < 1e-4 && rel < 5e-3;
  Report("chain on it: matmul+ReLU(tf32) -> softmax -> row sum",
         Fmt("max |rowsum-1| %.1e, matmul rel err %.1e, kernel %.0f us", worst, rel, mm->timing.kernel_us), ok);
  (void)c.FreeTensor(mm->handle);
  (void)c.FreeTensor(sm->handle);
  (void)c.FreeTensor(up->handle);
  auto left = c.ListTensors();
  Report("nothing left held after FreeTensor", left.ok() ? std::to_string(left->tensors.size()) + " tensors" : "list failed",
         left.ok() && left->tensors.empty());
}

}  // namespace

int main(int argc, char** argv) {
  std::string server = "localhost:50051", bench_json, json_out;
  double h2d = 0;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* flag) { return a.rfind(flag, 0) == 0 ? a.substr(std::strlen(flag)) : std::string(); };
    if (a.rfind("--server=", 0) == 0) server = val("--server=");
    else if (a.rfind("--bench_json=", 0) == 0) bench_json = val("--bench_json=");
    else if (a.rfind("--json=", 0) == 0) json_out = val("--json=");
    else if (a.rfind("--h2d_gbps=", 0) == 0) h2d = std::stod(val("--h2d_gbps="));
    else if (a == "--quick") quick = true;
    else {
      std::fprintf(stderr,
                   "usage: fusebox-e2e [--server=HOST:PORT] [--bench_json=ours.json] [--h2d_gbps=X] "
                   "[--json=out.json] [--quick]\n  --quick: correctness and RPC path only\n");
      return 2;
    }
  }
  fc::Client::Options o;
  o.default_timeout = std::chrono::milliseconds(300000);
  auto c = fc::Client::Create(server, o);
  if (!c->WaitForReady(std::chrono::milliseconds(20000))) {
    std::fprintf(stderr, "fusebox-e2e: no server at %s\n", server.c_str());
    return 1;
  }
  CheckCorrectness(*c);
  RpcPath(*c);
  if (!quick) {
    if (!bench_json.empty()) CompareKernelTimes(*c, LoadBench(bench_json));
    BigUploadAndChain(*c, h2d);
  }
  if (!json_out.empty()) std::ofstream(json_out) << "[\n" << g_json.str() << "{}]\n";
  std::printf("\n== summary (%d failures)\n", g_failures);
  int checks = 0;
  for (const Row& r : g_table) {
    const bool op_check = r.what.rfind("Gelu ", 0) == 0 || r.what.rfind("Softmax ", 0) == 0 ||
                          r.what.rfind("RowSum ", 0) == 0 || r.what.rfind("MatmulRelu ", 0) == 0;
    checks += op_check;
    if (!op_check || r.verdict != "ok") {
      std::printf("%-58s %-40s %s\n", r.what.c_str(), r.value.c_str(), r.verdict.c_str());
    }
  }
  std::printf("op correctness checks against the fp64 reference: %d\n", checks);
  std::printf("%d passed, %d failed\n", static_cast<int>(g_table.size()) - g_failures, g_failures);
  return g_failures == 0 ? 0 : 1;
}
