// `fusebox-perf`: a load generator for any fusebox server, in the manner of ghz or
// perf_analyzer. It runs one op (any dtype and shape, inputs inline or by a handle uploaded
// once) through the C++ client library, in closed loop (N callers, or a sweep of N; unary calls,
// or --mode=stream: an Execute stream per caller with a window of calls in flight) or in open
// loop at a fixed rate with latency counted from each call's intended send time, and reports
// latency percentiles, calls/s, errors by gRPC code and the server's own phase medians (from
// the responses' Timing) as a table, JSON or CSV. With --shm the inputs and outputs live in
// POSIX shared memory registered with the server (same node), so calls carry no tensor bytes.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstring>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/cpp/connection_flags.h"
#include "client/cpp/fusebox_client.h"
#include "client/cpp/loadgen.h"
#include "fusebox/version.h"

namespace fc = fusebox::client;
namespace load = fusebox::client::load;

namespace {

constexpr char kFooter[] = R"(
Shapes: gelu, softmax and rowsum take the input's shape, dims joined by x (4096, 64x1024);
matmul_relu takes MxKxN (a is MxK, b is KxN; --bias adds a bias of N).

Closed loop (the default): each of --callers callers (or each count in --concurrency_sweep,
one run per count) calls again as soon as its call returns. Open loop (--rate R): calls are
due at R per second and taken by a pool of --callers callers; latency counts from the due
time, so a server that falls behind shows it as latency (and `late` counts calls that started
more than 1 ms after they were due because every caller was busy).

Streaming (--mode=stream, closed loop only): each caller opens one Execute stream on its
connection and keeps --window calls in flight on it: it sends while fewer are unanswered, else
takes the next answer; latency runs from a call's send to its answer. Compare calls/s with
--mode=unary at the same --callers to see what the stream saves.

Every caller has its own connection (a channel of its own). An option given empty
(--tls_ca=) overrides its variable.

Output: a table on stdout; --json FILE and --csv FILE (- for stdout, then the table goes to
stderr) with, per run: calls, ok, calls/s, latency p50/p90/p99/p99.9/mean/max in
microseconds, errors by gRPC code, and the medians of the server's own Timing: queue_us,
copy_in_us, launch_us, kernel_us, copy_out_us, total_us.

exit status: 0 when every call succeeded; 1 when a call failed or the server could not be
reached (the report is written either way); 2 bad command line.
)";

struct Run {
  int callers = 0;
  double rate = 0;  // 0: closed loop
  load::Result result;
  // Medians of the server's Timing over successful calls, in kPhases order.
  std::vector<double> server_us;
};

constexpr const char* kPhases[] = {"queue_us",   "copy_in_us",  "launch_us",
                                   "kernel_us",  "copy_out_us", "total_us"};
constexpr int kNumPhases = 6;
constexpr double kQuantiles[] = {0.5, 0.9, 0.99, 0.999};
constexpr const char* kQuantileNames[] = {"p50", "p90", "p99", "p99.9"};

std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

bool ParseShape(const std::string& s, std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(s, 'x')) {
    int64_t d;
    if (!absl::SimpleAtoi(part, &d) || d < 0) return false;
    out->push_back(d);
  }
  return !out->empty();
}

fc::HostTensor RandomTensor(fusebox::DType dtype, std::vector<int64_t> shape, uint64_t seed) {
  fc::HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const int64_t n = t.NumElements();
  t.data.resize(static_cast<size_t>(n) * fusebox::ElementSize(dtype));
  uint64_t x = seed * 2654435761u + 88172645463325252ull;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    // Values in [-4, 4): the range where GeLU is not a plain identity or zero.
    fusebox::StoreFromFloat(dtype, t.data.data(), static_cast<size_t>(i),
                            static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 8.0f - 4.0f);
  }
  return t;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// The bytes of the op's output for these inputs.
int64_t OutputBytes(fc::Op op, fusebox::DType dtype, const std::vector<int64_t>& shape) {
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  const int64_t es = static_cast<int64_t>(fusebox::ElementSize(dtype));
  switch (op) {
    case fc::Op::kRowSum:
      return shape.empty() || shape.back() == 0 ? 0 : elements / shape.back() * 4;
    case fc::Op::kMatmulRelu:
      return shape.size() == 3 ? shape[0] * shape[2] * es : 0;
    default:
      return elements * es;
  }
}

}  // namespace

int main(int argc, char** argv) {
  fc::ConnectionFlags conn = fc::ConnectionFlags::FromEnvironment();
  const std::string& server = conn.server;
  bool by_handle = false, bias = false, use_shm = false;
  std::string op_name = "gelu", dtype_name = "float32", shape_arg = "1024", sweep_arg;
  std::string json_path, csv_path;
  int callers = 1, window = 16;
  std::string mode = "unary";
  double rate = 0, warmup_s = 1, duration_s = 5;
  long timeout_ms = 10000;

  CLI::App app("fusebox-perf: load a fusebox server with one op and report latency, calls/s, "
               "errors and the server's own timing.", "fusebox-perf");
  app.set_version_flag("--version", "fusebox-perf " FUSEBOX_VERSION " (commit " FUSEBOX_COMMIT
                       ", " FUSEBOX_BUILD_TYPE " build)");
  app.footer(kFooter);
  conn.AddTo(&app, "HOST:PORT or unix:PATH (default: $FUSEBOX_SERVER, else localhost:50051)");
  app.add_option("--op", op_name, "gelu | softmax | rowsum | matmul_relu")->capture_default_str();
  app.add_option("--dtype", dtype_name, "float32 | float16 | bfloat16")->capture_default_str();
  app.add_option("--shape", shape_arg, "the input's shape, e.g. 64x1024; matmul_relu: MxKxN")
      ->capture_default_str();
  app.add_flag("--bias", bias, "matmul_relu: add a bias of N");
  app.add_flag("--by_handle", by_handle,
               "upload the inputs once and call by handle (default: inputs inline in every call)");
  app.add_flag("--shm", use_shm,
               "inputs and outputs in POSIX shared memory registered with the server (same node; "
               "the server needs --allow_shared_memory): calls name them instead of carrying "
               "them; each caller writes its own output area");
  app.add_option("--callers", callers, "concurrent callers (closed loop), or the pool that sends "
                 "the calls at --rate (open loop)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--concurrency_sweep", sweep_arg,
                 "closed loop, one run per caller count, e.g. 1,8,16,64 (instead of --callers)");
  app.add_option("--rate", rate, "open loop: calls per second (0: closed loop)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--warmup_s", warmup_s, "seconds of calls before each run's measured part")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--duration_s", duration_s, "seconds measured per run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--timeout_ms", timeout_ms, "deadline of each call")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--mode", mode, "unary: one RPC per call; stream: calls on an Execute stream "
                 "per caller, --window in flight")
      ->check(CLI::IsMember({"unary", "stream"}))
      ->capture_default_str();
  app.add_option("--window", window, "--mode=stream: calls in flight per stream")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--json", json_path, "write the report as JSON to FILE (- for stdout)");
  app.add_option("--csv", csv_path, "write one CSV row per run to FILE (- for stdout)");
  auto usage = [](const std::string& msg) {
    std::fprintf(stderr, "fusebox-perf: %s\n(run `fusebox-perf --help` for usage)\n", msg.c_str());
    return 2;
  };
  try {
    std::vector<std::string> words = fc::WordsForCli11(argc, argv);
    app.parse(words);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return usage(e.what());
  }
  fc::Op op;
  if (op_name == "gelu") op = fc::Op::kGelu;
  else if (op_name == "softmax") op = fc::Op::kSoftmax;
  else if (op_name == "rowsum") op = fc::Op::kRowSum;
  else if (op_name == "matmul_relu") op = fc::Op::kMatmulRelu;
  else return usage("unknown --op '" + op_name + "'");
  fusebox::DType dtype;
  if (!fc::ParseDType(dtype_name, &dtype)) return usage("unknown --dtype '" + dtype_name + "'");
  std::vector<int64_t> shape;
  if (!ParseShape(shape_arg, &shape)) return usage("bad --shape '" + shape_arg + "'");
  if (op == fc::Op::kMatmulRelu && shape.size() != 3) return usage("matmul_relu takes --shape MxKxN");
  if (bias && op != fc::Op::kMatmulRelu) return usage("--bias is for matmul_relu");
  if (use_shm && by_handle) return usage("--shm and --by_handle: pick one");
  std::vector<int> counts;
  if (!sweep_arg.empty()) {
    if (rate > 0) return usage("--concurrency_sweep is closed loop; --rate is open loop: pick one");
    for (absl::string_view part : absl::StrSplit(sweep_arg, ',')) {
      int n;
      if (!absl::SimpleAtoi(part, &n) || n < 1 || n > 4096) return usage("bad --concurrency_sweep");
      counts.push_back(n);
    }
  } else {
    counts.push_back(callers);
  }
  const bool streaming = mode == "stream";
  if (streaming && rate > 0) return usage("--mode=stream is closed loop: leave out --rate");
  if (streaming && use_shm) return usage("--mode=stream sends inputs inline or by handle: leave out --shm");
  if (const std::string m = conn.Mistake(); !m.empty()) return usage(m);
  // The table goes to stderr when stdout carries the JSON or CSV.
  FILE* table_out = (json_path == "-" || csv_path == "-") ? stderr : stdout;

  fc::Client::Options copts;
  copts.default_timeout = std::chrono::milliseconds(timeout_ms);
  if (absl::Status st = conn.ApplyTo(&copts); !st.ok()) {
    std::fprintf(stderr, "fusebox-perf: %s\n", st.ToString().c_str());
    return 1;
  }
  // A channel of its own per caller: gRPC shares a connection among channels with equal
  // arguments, which would put every caller on one TCP connection.
  copts.channel_args.emplace_back("grpc.use_local_subchannel_pool", 1);

  int most = 0;
  for (int n : counts) most = std::max(most, n);
  std::vector<std::unique_ptr<fc::Client>> clients;
  for (int i = 0; i < most; ++i) {
    clients.push_back(fc::Client::Create(server, copts));
    if (!clients.back()->WaitForReady(std::chrono::milliseconds(std::max(timeout_ms, 10000L)))) {
      std::fprintf(stderr, "fusebox-perf: cannot connect to %s\n", server.c_str());
      return 1;
    }
  }

  // The inputs, and with --by_handle their handles (uploaded once, freed at the end).
  std::vector<fc::HostTensor> tensors;
  if (op == fc::Op::kMatmulRelu) {
    tensors.push_back(RandomTensor(dtype, {shape[0], shape[1]}, 1));
    tensors.push_back(RandomTensor(dtype, {shape[1], shape[2]}, 2));
    if (bias) tensors.push_back(RandomTensor(dtype, {shape[2]}, 3));
  } else {
    tensors.push_back(RandomTensor(dtype, shape, 1));
  }
  std::vector<fc::Arg> args;
  std::vector<std::string> handles;
  // --shm: one region holds the inputs, then one output area per caller.
  std::unique_ptr<fc::ShmSegment> segment;
  const std::string region = "fusebox-perf-" + std::to_string(getpid());
  std::vector<fc::CallOptions> call_opts(static_cast<size_t>(most));
  const int64_t out_bytes = OutputBytes(op, dtype, shape);
  int64_t in_bytes = 0;
  for (const auto& t : tensors) in_bytes += static_cast<int64_t>(t.data.size());
  if (use_shm) {
    auto round = [](int64_t v) { return (v + 4095) / 4096 * 4096; };
    int64_t in_total = 0;
    for (const auto& t : tensors) in_total += round(static_cast<int64_t>(t.data.size()));
    const int64_t total = in_total + most * round(out_bytes);
    auto seg = fc::ShmSegment::Create(region, static_cast<size_t>(total));
    if (!seg.ok()) {
      std::fprintf(stderr, "fusebox-perf: %s\n", seg.status().ToString().c_str());
      return 1;
    }
    segment = *std::move(seg);
    int64_t at = 0;
    for (const auto& t : tensors) {
      std::memcpy(static_cast<char*>(segment->data()) + at, t.data.data(), t.data.size());
      args.push_back(fc::Arg::Shared(fc::SharedRef{region, at, t.dtype, t.shape}));
      at += round(static_cast<int64_t>(t.data.size()));
    }
    auto info = clients[0]->RegisterSharedMemory(region, segment->key(), 0, total);
    if (!info.ok()) {
      std::fprintf(stderr, "fusebox-perf: RegisterSharedMemory failed: %s\n",
                   info.status().ToString().c_str());
      return 1;
    }
    for (int c = 0; c < most; ++c) {
      call_opts[static_cast<size_t>(c)].shared_output_region = region;
      call_opts[static_cast<size_t>(c)].shared_output_offset = in_total + c * round(out_bytes);
    }
  }
  for (const auto& t : tensors) {
    if (use_shm) break;
    if (!by_handle) {
      args.emplace_back(t);
      continue;
    }
    auto info = clients[0]->Upload(t);
    if (!info.ok()) {
      std::fprintf(stderr, "fusebox-perf: upload failed: %s\n", info.status().ToString().c_str());
      return 1;
    }
    handles.push_back(info->handle);
    args.push_back(fc::Arg::Handle(info->handle));
  }

  std::vector<Run> runs;
  for (int n : counts) {
    // Per caller (a thread of its own): the reused result, and the server's timings.
    std::vector<fc::OpResult> results(static_cast<size_t>(n));
    std::vector<std::vector<std::vector<double>>> phases(
        static_cast<size_t>(n), std::vector<std::vector<double>>(kNumPhases));
    auto call = [&](int c, bool measured) {
      fc::OpResult& r = results[static_cast<size_t>(c)];
      const absl::Status st =
          clients[static_cast<size_t>(c)]->Call(op, args, &r, call_opts[static_cast<size_t>(c)]);
      if (st.ok() && measured) {
        const fc::Timing& t = r.timing;
        const double v[kNumPhases] = {t.queue_us,  t.copy_in_us,  t.launch_us,
                                      t.kernel_us, t.copy_out_us, t.total_us};
        for (int k = 0; k < kNumPhases; ++k) phases[static_cast<size_t>(c)][k].push_back(v[k]);
      }
      return static_cast<int>(st.code());
    };
    auto record = [&](int c, const fc::Timing& t) {
      const double v[kNumPhases] = {t.queue_us,  t.copy_in_us,  t.launch_us,
                                    t.kernel_us, t.copy_out_us, t.total_us};
      for (int k = 0; k < kNumPhases; ++k) phases[static_cast<size_t>(c)][k].push_back(v[k]);
    };
    Run run;
    run.callers = n;
    run.rate = rate;
    if (streaming) {
      std::vector<std::unique_ptr<fc::ExecuteStream>> streams;
      for (int c = 0; c < n; ++c) streams.push_back(clients[static_cast<size_t>(c)]->Execute(window));
      auto send = [&](int c, uint64_t seq, bool) {
        return static_cast<int>(streams[static_cast<size_t>(c)]->Submit(seq, op, args).code());
      };
      std::vector<fc::ExecuteResult> answers(static_cast<size_t>(n));
      auto take = [&](int c, bool measured, uint64_t* seq) {
        fc::ExecuteResult& r = answers[static_cast<size_t>(c)];
        if (!streams[static_cast<size_t>(c)]->Next(&r)) return -1;
        *seq = r.id;
        if (r.status.ok() && measured) record(c, r.result.timing);
        return static_cast<int>(r.status.code());
      };
      run.result = load::StreamLoop(n, window, warmup_s, duration_s, send, take);
      for (auto& st : streams) {
        if (absl::Status end = st->Finish(); !end.ok()) {
          std::fprintf(stderr, "fusebox-perf: a stream ended with %s\n", end.ToString().c_str());
          ++run.result.errors[static_cast<int>(end.code())];
        }
      }
    } else {
      run.result = rate > 0 ? load::OpenLoop(n, rate, warmup_s, duration_s, call)
                            : load::ClosedLoop(n, warmup_s, duration_s, call);
    }
    for (int k = 0; k < kNumPhases; ++k) {
      std::vector<double> all;
      for (const auto& p : phases) all.insert(all.end(), p[k].begin(), p[k].end());
      run.server_us.push_back(load::Percentile(std::move(all), 0.5));
    }
    runs.push_back(std::move(run));
  }
  for (const auto& h : handles) (void)clients[0]->FreeTensor(h);
  if (segment) (void)clients[0]->UnregisterSharedMemory(region);

  // The table.
  std::ostringstream shape_str;
  for (size_t i = 0; i < shape.size(); ++i) shape_str << (i ? "x" : "") << shape[i];
  const std::string loop = streaming ? "stream (window " + std::to_string(window) + ")"
                           : rate > 0  ? "open"
                                       : "closed";
  std::fprintf(table_out, "fusebox-perf: %s %s %s, %s, %s loop, %.1f s per run (+%.1f s warm-up), server %s\n",
               op_name.c_str(), dtype_name.c_str(), shape_str.str().c_str(),
               use_shm ? "shared memory" : by_handle ? "by handle" : "inline", loop.c_str(), duration_s,
               warmup_s, server.c_str());
  std::fprintf(table_out, "%7s %9s %9s %10s %9s %9s %9s %9s %6s  %s\n", "callers", "rate/s",
               "calls", "calls/s", "p50 us", "p90 us", "p99 us", "p99.9 us", "late", "errors");
  bool any_error = false;
  for (const Run& r : runs) {
    std::string errs;
    for (auto [code, k] : r.result.errors) {
      errs += (errs.empty() ? "" : " ") + CodeName(code) + ":" + std::to_string(k);
      any_error = true;
    }
    std::fprintf(table_out, "%7d %9s %9lld %10.0f %9.1f %9.1f %9.1f %9.1f %6lld  %s\n", r.callers,
                 r.rate > 0 ? Num(r.rate).c_str() : "-", static_cast<long long>(r.result.calls),
                 r.result.calls_per_s(), load::Percentile(r.result.latency_us, 0.5),
                 load::Percentile(r.result.latency_us, 0.9),
                 load::Percentile(r.result.latency_us, 0.99),
                 load::Percentile(r.result.latency_us, 0.999),
                 static_cast<long long>(r.result.late), errs.empty() ? "none" : errs.c_str());
    // Bandwidth at the median latency: what one call moves end to end.
    const double p50 = load::Percentile(r.result.latency_us, 0.5);
    if (p50 > 0) {
      std::fprintf(table_out,
                   "        %lld bytes in, %lld out per call: at the median latency %.2f GB/s of "
                   "input, %.2f GB/s in+out\n",
                   static_cast<long long>(in_bytes), static_cast<long long>(out_bytes),
                   in_bytes / p50 / 1e3, (in_bytes + out_bytes) / p50 / 1e3);
    }
  }
  std::fprintf(table_out, "server medians (us):");
  for (int k = 0; k < kNumPhases; ++k) std::fprintf(table_out, " %10s", kPhases[k]);
  std::fprintf(table_out, "\n");
  for (const Run& r : runs) {
    std::fprintf(table_out, "  %4d callers      ", r.callers);
    for (int k = 0; k < kNumPhases; ++k) std::fprintf(table_out, " %10.1f", r.server_us[k]);
    std::fprintf(table_out, "\n");
  }

  auto write = [](const std::string& path, const std::string& text) {
    if (path == "-") {
      std::fputs(text.c_str(), stdout);
      return true;
    }
    std::ofstream f(path);
    f << text;
    return static_cast<bool>(f);
  };
  if (!json_path.empty()) {
    std::ostringstream j;
    j << "{\"server\": " << JsonString(server) << ", \"op\": " << JsonString(op_name)
      << ", \"dtype\": " << JsonString(dtype_name) << ", \"shape\": [";
    for (size_t i = 0; i < shape.size(); ++i) j << (i ? ", " : "") << shape[i];
    j << "], \"input\": " << JsonString(use_shm ? "shm" : by_handle ? "handle" : "inline")
      << ", \"mode\": " << JsonString(streaming ? "stream" : rate > 0 ? "open" : "closed")
      << ", \"window\": " << (streaming ? window : 0)
      << ", \"warmup_s\": " << Num(warmup_s) << ", \"duration_s\": " << Num(duration_s)
      << ", \"runs\": [";
    for (size_t i = 0; i < runs.size(); ++i) {
      const Run& r = runs[i];
      j << (i ? ", " : "") << "\n  {\"callers\": " << r.callers << ", \"rate\": " << Num(r.rate)
        << ", \"calls\": " << r.result.calls << ", \"ok\": " << r.result.latency_us.size()
        << ", \"calls_per_s\": " << Num(r.result.calls_per_s()) << ", \"late\": " << r.result.late
        << ", \"latency_us\": {";
      for (int q = 0; q < 4; ++q) {
        j << "\"" << kQuantileNames[q] << "\": " << Num(load::Percentile(r.result.latency_us, kQuantiles[q]))
          << ", ";
      }
      double sum = 0, max = 0;
      for (double v : r.result.latency_us) sum += v, max = std::max(max, v);
      j << "\"mean\": " << Num(r.result.latency_us.empty() ? 0 : sum / static_cast<double>(r.result.latency_us.size()))
        << ", \"max\": " << Num(max) << "}, \"errors\": {";
      bool first = true;
      for (auto [code, k] : r.result.errors) {
        j << (first ? "" : ", ") << JsonString(CodeName(code)) << ": " << k;
        first = false;
      }
      j << "}, \"server_us\": {";
      for (int k = 0; k < kNumPhases; ++k) j << (k ? ", " : "") << "\"" << kPhases[k] << "\": " << Num(r.server_us[k]);
      j << "}}";
    }
    j << "\n]}\n";
    if (!write(json_path, j.str())) {
      std::fprintf(stderr, "fusebox-perf: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  if (!csv_path.empty()) {
    std::ostringstream c;
    c << "op,dtype,shape,input,mode,callers,rate,calls,ok,calls_per_s,late,p50_us,p90_us,p99_us,p99_9_us,errors";
    for (int k = 0; k < kNumPhases; ++k) c << ",server_" << kPhases[k];
    c << "\n";
    for (const Run& r : runs) {
      std::string errs;
      for (auto [code, k] : r.result.errors) errs += (errs.empty() ? "" : " ") + CodeName(code) + ":" + std::to_string(k);
      c << op_name << "," << dtype_name << "," << shape_str.str() << "," << (use_shm ? "shm" : by_handle ? "handle" : "inline")
        << "," << (streaming ? "stream" : rate > 0 ? "open" : "closed") << "," << r.callers << "," << Num(r.rate) << ","
        << r.result.calls << "," << r.result.latency_us.size() << "," << Num(r.result.calls_per_s()) << ","
        << r.result.late;
      for (double q : kQuantiles) c << "," << Num(load::Percentile(r.result.latency_us, q));
      c << "," << errs;
      for (int k = 0; k < kNumPhases; ++k) c << "," << Num(r.server_us[k]);
      c << "\n";
    }
    if (!write(csv_path, c.str())) {
      std::fprintf(stderr, "fusebox-perf: cannot write %s\n", csv_path.c_str());
      return 1;
    }
  }
  return any_error ? 1 : 0;
}
