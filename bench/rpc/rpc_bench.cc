// fusebox-rpc-bench: loopback RPC benchmark of inline GeLU through the C++
// client against a running server. For each case (payload size x concurrent
// callers x request path) it warms up, then calls until a count or a time bound
// is reached, and prints one Markdown table row: client latency p50/p99, calls/s,
// payload GB/s, and the server's own median total/kernel time (the difference is
// the RPC path: serialization, copies, transport).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/cpp/fusebox_client.h"

namespace fc = fusebox::client;
using Clock = std::chrono::steady_clock;

namespace {

constexpr char kUsage[] = R"(fusebox-rpc-bench: loopback latency/throughput of inline GeLU (float32).

usage: fusebox-rpc-bench --server HOST:PORT [options]
  --cases LIST         SIZE:CALLERS[,...]; SIZE in bytes or with KiB/MiB/GiB
                       (default 4KiB:1,4KiB:8,64MiB:1)
  --request_path LIST  zerocopy,protobuf: how the client builds requests (default zerocopy)
  --min_calls N        measured calls per case at least ... (default 20)
  --max_calls N        ... and at most (default 20000)
  --max_seconds S      stop measuring a case after S seconds once min_calls are done (default 5)
  --warmup_seconds S   warm-up time per case, at least 2 calls per caller (default 0.5)
  --output_buffer B    reused | fresh: reuse one result buffer per caller (Client::Call) or
                       get a new one per call (Client::Gelu) (default reused)
  --no_header          do not print the table header
  --phases             add the server's queue, copy-in, launch and copy-out p50 columns
  --channels N         separate client channels (TCP connections) shared round-robin (default 1)
  --dtype D            float32 | float16 | bfloat16 (default float32)
  --channel_arg K=V    extra integer gRPC channel argument (repeatable),
                       e.g. grpc.http2.lookahead_bytes=16777216
Prints a Markdown table: one row per case.
)";

int64_t ParseSize(std::string s) {
  int64_t mult = 1;
  for (auto [suffix, m] : {std::pair<const char*, int64_t>{"GiB", 1LL << 30}, {"MiB", 1LL << 20}, {"KiB", 1LL << 10}}) {
    const std::string suf = suffix;
    if (s.size() > suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0) {
      mult = m;
      s = s.substr(0, s.size() - suf.size());
      break;
    }
  }
  return std::atoll(s.c_str()) * mult;
}

std::string HumanSize(int64_t b) {
  if (b >= (1LL << 20) && b % (1LL << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b >= 1024 && b % 1024 == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) if (!item.empty()) out.push_back(item);
  return out;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

struct Case {
  int64_t bytes;
  int callers;
  fc::RequestPath path;
};

}  // namespace

int main(int argc, char** argv) {
  std::string server, cases_arg = "4KiB:1,4KiB:8,64MiB:1", paths_arg = "zerocopy", dtype_arg = "float32";
  int64_t min_calls = 20, max_calls = 20000;
  double max_seconds = 5, warmup_seconds = 0.5;
  int channels = 1;
  bool reuse_output = true, header = true, phases = false;
  std::vector<std::pair<std::string, int>> channel_args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], v;
    const auto eq = a.find('=');
    if (eq != std::string::npos) {
      v = a.substr(eq + 1);
      a = a.substr(0, eq);
    } else if (a != "--help" && a != "-h" && i + 1 < argc) {
      v = argv[++i];
    }
    if (a == "--help" || a == "-h") { std::fputs(kUsage, stdout); return 0; }
    else if (a == "--server") server = v;
    else if (a == "--cases") cases_arg = v;
    else if (a == "--request_path") paths_arg = v;
    else if (a == "--min_calls") min_calls = std::atoll(v.c_str());
    else if (a == "--max_calls") max_calls = std::atoll(v.c_str());
    else if (a == "--max_seconds") max_seconds = std::atof(v.c_str());
    else if (a == "--warmup_seconds") warmup_seconds = std::atof(v.c_str());
    else if (a == "--channels") channels = std::max(1, std::atoi(v.c_str()));
    else if (a == "--dtype") dtype_arg = v;
    else if (a == "--output_buffer") reuse_output = v != "fresh";
    else if (a == "--no_header") { header = false; if (eq == std::string::npos && !v.empty()) --i; }
    else if (a == "--phases") { phases = true; if (eq == std::string::npos && !v.empty()) --i; }
    else if (a == "--channel_arg" && v.find('=') != std::string::npos)
      channel_args.emplace_back(v.substr(0, v.find('=')), std::atoi(v.c_str() + v.find('=') + 1));
    else { std::fprintf(stderr, "fusebox-rpc-bench: unknown option %s\n%s", a.c_str(), kUsage); return 2; }
  }
  if (server.empty()) { std::fprintf(stderr, "fusebox-rpc-bench: --server is required\n%s", kUsage); return 2; }
  fusebox::DType dtype;
  if (!fc::ParseDType(dtype_arg, &dtype)) { std::fprintf(stderr, "bad --dtype\n"); return 2; }

  std::vector<Case> cases;
  for (const auto& p : Split(paths_arg, ',')) {
    fc::RequestPath path;
    if (p == "zerocopy") path = fc::RequestPath::kZeroCopy;
    else if (p == "protobuf") path = fc::RequestPath::kProtobuf;
    else { std::fprintf(stderr, "bad --request_path %s\n", p.c_str()); return 2; }
    for (const auto& c : Split(cases_arg, ',')) {
      auto parts = Split(c, ':');
      if (parts.size() != 2) { std::fprintf(stderr, "bad case %s (want SIZE:CALLERS)\n", c.c_str()); return 2; }
      cases.push_back({ParseSize(parts[0]), std::max(1, std::atoi(parts[1].c_str())), path});
    }
  }

  if (header) std::printf("| payload | callers | request path | output buffer | calls | p50 us | p99 us | mean us | calls/s | "
              "GB/s in | GB/s in+out | server total p50 us | server kernel p50 us |%s\n",
              phases ? " queue p50 us | copy-in p50 us | launch p50 us | copy-out p50 us |" : "");
  if (header) std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|%s\n",
                          phases ? "---|---|---|---|" : "");
  std::fflush(stdout);

  for (const Case& cs : cases) {
    fc::Client::Options opts;
    opts.request_path = cs.path;
    opts.channel_args = channel_args;
    opts.default_timeout = std::chrono::milliseconds(120000);
    std::vector<std::unique_ptr<fc::Client>> clients;
    for (int i = 0; i < channels; ++i) {
      clients.push_back(fc::Client::Create(server, opts));
      if (!clients.back()->WaitForReady(std::chrono::seconds(10))) {
        std::fprintf(stderr, "fusebox-rpc-bench: cannot connect to %s\n", server.c_str());
        return 1;
      }
    }
    // Random inputs in [-4, 4), one tensor shared by all callers (read-only).
    const int64_t n = cs.bytes / static_cast<int64_t>(fusebox::ElementSize(dtype));
    fc::HostTensor in;
    in.dtype = dtype;
    in.shape = {n};
    in.data.resize(static_cast<size_t>(n) * fusebox::ElementSize(dtype));
    uint64_t x = 88172645463325252ull;
    for (int64_t i = 0; i < n; ++i) {
      x ^= x << 13; x ^= x >> 7; x ^= x << 17;
      fusebox::StoreFromFloat(dtype, in.data.data(), static_cast<size_t>(i),
                              static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 8.0f - 4.0f);
    }

    std::mutex mu;
    // Per call: client latency, then the server's total, kernel, queue, copy-in, launch, copy-out.
    constexpr int kSeries = 7;
    std::vector<double> series[kSeries];
    std::atomic<int64_t> started{0};
    std::atomic<bool> failed{false};
    std::string error;
    auto worker = [&](int id, bool measure, Clock::time_point until) {
      fc::Client& c = *clients[id % channels];
      std::vector<double> mine[kSeries];
      fc::OpResult reused;
      int done = 0;
      while (!failed) {
        if (measure) {
          const int64_t k = started.fetch_add(1);
          if (k >= max_calls || (k >= min_calls && Clock::now() >= until)) break;
        } else if (done >= 2 && Clock::now() >= until) {
          break;
        }
        absl::StatusOr<fc::OpResult> fresh;
        absl::Status status;
        if (reuse_output) {
          status = c.Call(fc::Op::kGelu, {in}, &reused);
        } else {
          fresh = c.Gelu(in);
          status = fresh.status();
        }
        if (!status.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          failed = true;
          error = status.ToString();
          break;
        }
        const fc::Timing& t = reuse_output ? reused.timing : fresh->timing;
        ++done;
        const double values[kSeries] = {t.rpc_us,   t.total_us,      t.kernel_us, t.queue_us,
                                        t.copy_in_us, t.launch_us, t.copy_out_us};
        for (int k = 0; k < kSeries; ++k) mine[k].push_back(values[k]);
      }
      if (measure) {
        std::lock_guard<std::mutex> lock(mu);
        for (int k = 0; k < kSeries; ++k) series[k].insert(series[k].end(), mine[k].begin(), mine[k].end());
      }
    };
    auto run = [&](bool measure, double seconds) {
      const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(seconds));
      std::vector<std::thread> threads;
      for (int t = 0; t < cs.callers; ++t) threads.emplace_back(worker, t, measure, until);
      for (auto& t : threads) t.join();
    };
    run(false, warmup_seconds);
    const auto t0 = Clock::now();
    run(true, max_seconds);
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    if (failed) {
      std::fprintf(stderr, "fusebox-rpc-bench: call failed: %s\n", error.c_str());
      return 1;
    }
    const std::vector<double>& lat = series[0];
    const double calls = static_cast<double>(lat.size());
    const double gbs_in = calls * static_cast<double>(cs.bytes) / wall / 1e9;
    std::printf("| %s | %d | %s | %s | %zu | %.1f | %.1f | %.1f | %.0f | %.3f | %.3f | %.1f | %.1f |",
                HumanSize(cs.bytes).c_str(), cs.callers,
                cs.path == fc::RequestPath::kZeroCopy ? "zerocopy" : "protobuf",
                reuse_output ? "reused" : "fresh", lat.size(),
                Percentile(lat, 0.5), Percentile(lat, 0.99),
                [&] { double s = 0; for (double v : lat) s += v; return s / std::max(1.0, calls); }(),
                calls / wall, gbs_in, 2 * gbs_in, Percentile(series[1], 0.5), Percentile(series[2], 0.5));
    if (phases) {
      for (int k = 3; k < kSeries; ++k) std::printf(" %.1f |", Percentile(series[k], 0.5));
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}
