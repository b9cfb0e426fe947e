// fusebox-rpc-bench: loopback RPC benchmark of inline GeLU through the C++
// client against a running server. For each case (payload size x concurrent
// callers x request path) it warms up, then calls until a count or a time bound
// is reached, and prints one Markdown table row: client latency p50/p99, calls/s,
// payload GB/s, and the server's own median total/kernel time (the difference is
// the RPC path: serialization, copies, transport).
//
// --floor measures the RPC-path floor instead: fusebox's inline GeLU of one payload size
// (through fusebox_client, what users link) against fusebox-rpc-echo (plain gRPC, the same
// library and build flags) echoing the same number of bytes, unary and over a bidirectional
// stream, and as raw bytes (no protobuf on either side: the floor for bulk inline calls). Every
// caller has a connection of its own (a channel with its own subchannel pool).
// Per caller count, each round measures the targets back to back in an order that
// rotates round by round; a round gives one fusebox/echo ratio per metric, and the report
// is the median ratio over the rounds with a distribution-free 95% interval (order
// statistics of the rounds; client/cpp/loadgen.h).
//
// --transfer measures bulk transfers: fusebox's Upload and Download of one large tensor through
// fusebox_client with each count of --connections (1: the plain one-stream Upload / Download;
// N: ranges on N connections, the client's parallel path), against fusebox-rpc-echo's Sink and
// Source moving the same bytes as N parallel streams of 4 MiB messages on N connections. Every
// round measures every target back to back; the report is each target's median GB/s over the
// rounds and fusebox's ratio to the echo with the same N. Downloads are measured twice:
// DownloadInto a buffer touched before (ranges on N connections, as the echo's client reads into
// buffers it reuses), and Download into a new HostTensor, whose fresh pages it pays for.
//
// In --floor mode, with --stream_window W > 0 (the default 16), two streaming targets join the
// floor's: fusebox's GeLU over Execute (an ExecuteStream per caller, W
// calls in flight) and the echo's stream with the same window (W messages written ahead of the
// answers read), reported against the echo's stream and against fusebox's unary calls. With
// --unix unix:PATH, fusebox's unary GeLU through a second server on that unix socket joins too,
// reported against the TCP one.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>

#include "client/cpp/fusebox_client.h"
#include "client/cpp/loadgen.h"
#include "echo.grpc.pb.h"

namespace fc = fusebox::client;
namespace load = fusebox::client::load;
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

usage: fusebox-rpc-bench --floor --server HOST:PORT --echo HOST:PORT [options]
  fusebox's inline GeLU against fusebox-rpc-echo (plain gRPC) at the same request size:
  its unary Blob echo, its stream, and its raw-bytes echo (no protobuf copy on either side)
  --floor_bytes SIZE   request payload (default 4KiB)
  --floor_callers LIST caller counts, each run per target per round (default 1,8,16,64);
                       latency p50/p99 are reported for the first, calls/s for every one
  --rounds N           rounds (default 10; 6 or more for a 95% interval)
  --round_seconds S    measured seconds per target, caller count and round (default 0.5)
  --warmup_seconds S   before each of those (default 0.1 here)
  --stream_window W    also fusebox's Execute stream and the echo's stream with W calls in
                       flight per caller (default 16; 0 leaves both out)
Prints a Markdown table: each target's medians over the rounds, and fusebox's ratio to
each echo with its 95% interval (and Execute's to the windowed echo stream and to unary).
  --unix unix:PATH     also fusebox's unary GeLU through a second fusebox server listening on
                       that unix socket (the first is --server), against the TCP one
--server and --echo take any gRPC target: HOST:PORT, or unix:PATH for a unix socket.


usage: fusebox-rpc-bench --transfer --server HOST:PORT --echo HOST:PORT [options]
  fusebox's Upload and Download of one tensor against the echo's Sink and Source
  --transfer_bytes SIZE  the tensor (default 1GiB)
  --connections LIST     connection counts (default 1,4); 1 is the plain one-stream path
  --range_mib N          the client's range size for N > 1 (default 8)
  --rounds N             rounds (default 3)
Prints a Markdown table: per connection count, the median GB/s over rounds of fusebox's
upload and download and of the echo's sink and source, and fusebox / echo.
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

struct Case {
  int64_t bytes;
  int callers;
  fc::RequestPath path;
};


// The floor mode: see the file's header.
struct FloorOptions {
  std::string fusebox, echo;
  int64_t bytes = 4096;
  std::vector<int> callers = {1, 8, 16, 64};
  int rounds = 10;
  double round_seconds = 0.5, warmup_seconds = 0.1;
  int stream_window = 16;  // 0: no streaming targets
  std::string unix_target;  // a second fusebox server, on a unix socket; empty: none
};

// A channel that shares no connection with any other (gRPC reuses a connection among channels
// whose arguments are equal, unless each has its own subchannel pool).
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt("grpc.use_local_subchannel_pool", 1);
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

int RunFloor(const FloorOptions& o) {
  using fusebox::bench::Blob;
  using fusebox::bench::Echo;
  const int most = *std::max_element(o.callers.begin(), o.callers.end());
  const auto ready = std::chrono::system_clock::now() + std::chrono::seconds(10);

  // fusebox: one Client per caller, float32 GeLU of bytes / 4 elements, sent inline.
  fc::Client::Options copts;
  copts.channel_args.emplace_back("grpc.use_local_subchannel_pool", 1);
  copts.default_timeout = std::chrono::milliseconds(60000);
  std::vector<std::unique_ptr<fc::Client>> fb;
  std::vector<fc::OpResult> fb_results(static_cast<size_t>(most));
  for (int i = 0; i < most; ++i) {
    fb.push_back(fc::Client::Create(o.fusebox, copts));
    if (!fb.back()->WaitForReady(std::chrono::seconds(10))) {
      std::fprintf(stderr, "fusebox-rpc-bench: cannot connect to %s\n", o.fusebox.c_str());
      return 1;
    }
  }
  std::vector<float> values(static_cast<size_t>(o.bytes / 4));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 64) / 8.0f - 4.0f;
  const fc::HostTensor in =
      fc::HostTensor::FromFloats(fusebox::DType::kFloat32, {static_cast<int64_t>(values.size())}, values);

  // The echo: a stub per caller for unary calls, another channel per caller for its stream.
  Blob request;
  request.set_data(in.data);  // the same bytes as fusebox's payload
  grpc::ByteBuffer raw_request;  // the same Blob, serialized once: sent as is by kEchoRaw
  {
    bool own = false;
    grpc::SerializationTraits<Blob>::Serialize(request, &raw_request, &own);
  }
  const grpc::internal::RpcMethod raw_method("/fusebox.bench.Echo/EchoBytes",
                                             grpc::internal::RpcMethod::NORMAL_RPC);
  struct EchoCaller {
    std::shared_ptr<grpc::Channel> channel;  // unary's, for the raw calls too
    std::unique_ptr<Echo::Stub> unary, streaming;
    grpc::ByteBuffer raw_response;
    Blob response;
    std::unique_ptr<grpc::ClientContext> stream_ctx;
    std::unique_ptr<grpc::ClientReaderWriter<Blob, Blob>> stream;
  };
  std::vector<EchoCaller> echo(static_cast<size_t>(most));
  for (auto& e : echo) {
    auto u = OwnChannel(o.echo), st = OwnChannel(o.echo);
    if (!u->WaitForConnected(ready) || !st->WaitForConnected(ready)) {
      std::fprintf(stderr, "fusebox-rpc-bench: cannot connect to %s\n", o.echo.c_str());
      return 1;
    }
    e.channel = u;
    e.unary = Echo::NewStub(u);
    e.streaming = Echo::NewStub(st);
  }

  enum Target { kFusebox, kEchoUnary, kEchoStream, kFuseboxExecute, kEchoWindow, kFuseboxUnix,
                kEchoRaw, kTargets };
  const std::string window = std::to_string(o.stream_window);
  const std::string kNames[kTargets] = {
      "fusebox GeLU (fusebox_client)", "echo unary", "echo stream",
      "fusebox GeLU over Execute (window " + window + ")", "echo stream (window " + window + ")",
      "fusebox GeLU over " + o.unix_target, "echo raw bytes"};
  std::vector<Target> active = {kFusebox, kEchoUnary, kEchoStream, kEchoRaw};
  if (o.stream_window > 0) active.insert(active.end(), {kFuseboxExecute, kEchoWindow});
  if (!o.unix_target.empty()) active.push_back(kFuseboxUnix);
  auto is_active = [&](Target t) { return std::find(active.begin(), active.end(), t) != active.end(); };
  const int targets = static_cast<int>(active.size());
  // --unix: a client per caller on the unix socket, as fb on TCP.
  std::vector<std::unique_ptr<fc::Client>> fb_unix;
  for (int i = 0; !o.unix_target.empty() && i < most; ++i) {
    fb_unix.push_back(fc::Client::Create(o.unix_target, copts));
    if (!fb_unix.back()->WaitForReady(std::chrono::seconds(10))) {
      std::fprintf(stderr, "fusebox-rpc-bench: cannot connect to %s\n", o.unix_target.c_str());
      return 1;
    }
  }
  std::atomic<bool> failed{false};
  std::string error;
  std::mutex error_mu;
  auto fail = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(error_mu);
    if (!failed.exchange(true)) error = what;
    return 1;
  };
  // The server's own Timing at the first caller count (per caller: total, queue, kernel), to
  // tell the server's part of fusebox's round trip from the RPC path's.
  std::vector<std::array<std::vector<double>, 3>> server_us(static_cast<size_t>(most));
  std::vector<std::array<std::vector<double>, 1>> execute_us(static_cast<size_t>(most));
  bool first_count = true;
  auto call = [&](Target t, int c, bool measured) -> int {
    const size_t i = static_cast<size_t>(c);
    switch (t) {
      case kFusebox: {
        const absl::Status st = fb[i]->Call(fc::Op::kGelu, {in}, &fb_results[i]);
        if (!st.ok()) return fail("fusebox: " + st.ToString());
        if (measured && first_count) {
          const fc::Timing& tm = fb_results[i].timing;
          server_us[i][0].push_back(tm.total_us);
          server_us[i][1].push_back(tm.queue_us);
          server_us[i][2].push_back(tm.kernel_us);
        }
        return 0;
      }
      case kFuseboxUnix: {
        const absl::Status st = fb_unix[i]->Call(fc::Op::kGelu, {in}, &fb_results[i]);
        return st.ok() ? 0 : fail("fusebox over unix: " + st.ToString());
      }
      case kEchoUnary: {
        grpc::ClientContext ctx;
        const grpc::Status st = echo[i].unary->Unary(&ctx, request, &echo[i].response);
        return st.ok() ? 0 : fail("echo: " + st.error_message());
      }
      case kEchoRaw: {
        grpc::ClientContext ctx;
        const grpc::Status st = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
            echo[i].channel.get(), raw_method, &ctx, raw_request, &echo[i].raw_response);
        return st.ok() ? 0 : fail("echo raw: " + st.error_message());
      }
      default: {
        EchoCaller& e = echo[i];
        if (!e.stream) {
          e.stream_ctx = std::make_unique<grpc::ClientContext>();
          e.stream = e.streaming->Stream(e.stream_ctx.get());
        }
        if (!e.stream->Write(request) || !e.stream->Read(&e.response)) return fail("echo stream broke");
        return 0;
      }
    }
  };

  // stats[target][caller count index][round]: p50, p99 (us) and calls/s.
  struct Stat { double p50, p99, rate; };
  std::vector<std::vector<std::vector<Stat>>> stats(
      kTargets, std::vector<std::vector<Stat>>(o.callers.size()));
  // Caller counts in the order given, all rounds of one before the next: a server's latency at
  // one caller is higher for a while after a burst of many (fusebox's is), and the first count
  // is the latency measurement, so no round of it follows a larger count.
  // The windowed targets: a stream per caller for one round, W calls in flight on it.
  auto windowed = [&](Target t, int callers) {
    std::vector<std::unique_ptr<fc::ExecuteStream>> fs;
    std::vector<std::unique_ptr<grpc::ClientContext>> ectx;
    std::vector<std::unique_ptr<grpc::ClientReaderWriter<Blob, Blob>>> es;
    std::vector<uint64_t> taken(static_cast<size_t>(callers), 0);
    std::vector<fc::ExecuteResult> answers(static_cast<size_t>(callers));
    std::vector<Blob> replies(static_cast<size_t>(callers));
    for (int c = 0; c < callers; ++c) {
      if (t == kFuseboxExecute) {
        fs.push_back(fb[static_cast<size_t>(c)]->Execute(o.stream_window));
      } else {
        ectx.push_back(std::make_unique<grpc::ClientContext>());
        es.push_back(echo[static_cast<size_t>(c)].streaming->Stream(ectx.back().get()));
      }
    }
    auto send = [&](int c, uint64_t seq, bool) -> int {
      const size_t i = static_cast<size_t>(c);
      if (t == kFuseboxExecute) return static_cast<int>(fs[i]->Submit(seq, fc::Op::kGelu, {in}).code());
      return es[i]->Write(request) ? 0 : 14;
    };
    auto take = [&](int c, bool measured, uint64_t* seq) -> int {
      const size_t i = static_cast<size_t>(c);
      if (t == kEchoWindow) {  // the echo answers in order
        if (!es[i]->Read(&replies[i])) return -1;
        *seq = taken[i]++;
        return 0;
      }
      if (!fs[i]->Next(&answers[i])) return -1;
      *seq = answers[i].id;
      if (!answers[i].status.ok()) {
        fail("fusebox Execute: " + answers[i].status.ToString());
        return static_cast<int>(answers[i].status.code());
      }
      if (measured && first_count) {
        const fc::Timing& tm = answers[i].result.timing;
        execute_us[i][0].push_back(tm.total_us);
      }
      return 0;
    };
    load::Result res =
        load::StreamLoop(callers, o.stream_window, o.warmup_seconds, o.round_seconds, send, take);
    for (auto& f : fs) {
      if (absl::Status st = f->Finish(); !st.ok()) fail("fusebox Execute ended: " + st.ToString());
    }
    for (auto& e : es) {
      e->WritesDone();
      if (grpc::Status st = e->Finish(); !st.ok()) fail("echo stream ended: " + st.error_message());
    }
    return res;
  };
  for (size_t ci = 0; ci < o.callers.size(); ++ci) {
    first_count = ci == 0;
    for (int r = 0; r < o.rounds; ++r) {
      for (int k = 0; k < targets; ++k) {
        const Target t = active[static_cast<size_t>((k + r) % targets)];
        load::Result res =
            t == kFuseboxExecute || t == kEchoWindow
                ? windowed(t, o.callers[ci])
                : load::ClosedLoop(o.callers[ci], o.warmup_seconds, o.round_seconds,
                                   [&](int c, bool measured) { return call(t, c, measured); });
        if (failed) {
          std::fprintf(stderr, "fusebox-rpc-bench: call failed: %s\n", error.c_str());
          return 1;
        }
        stats[t][ci].push_back({load::Percentile(res.latency_us, 0.5),
                                load::Percentile(res.latency_us, 0.99), res.calls_per_s()});
      }
    }
    std::fprintf(stderr, "fusebox-rpc-bench: %d callers done\n", o.callers[ci]);
  }
  for (auto& e : echo) {
    if (!e.stream) continue;
    e.stream->WritesDone();
    (void)e.stream->Finish();
  }

  // One row per metric: each target's median over the rounds, then fusebox's per-round ratio
  // to each echo (median [95% interval]).
  auto median = [](std::vector<double> v) { return load::MedianWithInterval(std::move(v)).median; };
  auto ratio_cell = [](std::vector<double> ratios) {
    const load::MedianInterval m = load::MedianWithInterval(std::move(ratios));
    char buf[96];
    if (m.ok) std::snprintf(buf, sizeof buf, "%.2f [%.2f, %.2f]", m.median, m.lo, m.hi);
    else std::snprintf(buf, sizeof buf, "%.2f [too few rounds]", m.median);
    return std::string(buf);
  };
  // Columns: each target's median, then the ratios of the pairs below.
  struct Pair { Target num, den; const char* name; };
  std::vector<Pair> pairs = {{kFusebox, kEchoUnary, "fusebox / echo unary"},
                             {kFusebox, kEchoStream, "fusebox / echo stream"},
                             {kFusebox, kEchoRaw, "fusebox / echo raw bytes"}};
  if (is_active(kFuseboxExecute)) {
    pairs.push_back({kFuseboxExecute, kEchoWindow, "Execute / echo stream (window)"});
    pairs.push_back({kFuseboxExecute, kFusebox, "Execute / fusebox unary"});
  }
  if (is_active(kFuseboxUnix)) pairs.push_back({kFuseboxUnix, kFusebox, "unix / TCP (fusebox unary)"});
  const std::vector<Target> order = {kEchoUnary, kEchoStream, kEchoRaw, kFusebox, kEchoWindow,
                                     kFuseboxExecute, kFuseboxUnix};
  std::printf("| metric |");
  for (Target t : order) if (is_active(t)) std::printf(" %s |", kNames[t].c_str());
  for (const Pair& p : pairs) std::printf(" %s |", p.name);
  std::printf("\n|---|");
  for (size_t i = 0; i < static_cast<size_t>(targets) + pairs.size(); ++i) std::printf("---|");
  std::printf("\n");
  auto row = [&](const std::string& name, size_t ci, double Stat::*field) {
    std::printf("| %s |", name.c_str());
    for (Target t : order) {
      if (!is_active(t)) continue;
      std::vector<double> v;
      for (const Stat& st : stats[t][ci]) v.push_back(st.*field);
      std::printf(field == &Stat::rate ? " %.0f |" : " %.1f |", median(v));
    }
    for (const Pair& p : pairs) {
      std::vector<double> ratios;
      for (size_t r = 0; r < stats[p.num][ci].size(); ++r) {
        ratios.push_back(stats[p.num][ci][r].*field / stats[p.den][ci][r].*field);
      }
      std::printf(" %s |", ratio_cell(ratios).c_str());
    }
    std::printf("\n");
  };
  const std::string one = std::to_string(o.callers[0]) + (o.callers[0] == 1 ? " caller" : " callers");
  row("p50 us, " + one, 0, &Stat::p50);
  row("p99 us, " + one, 0, &Stat::p99);
  for (size_t ci = 0; ci < o.callers.size(); ++ci) {
    row("calls/s, " + std::to_string(o.callers[ci]) + (o.callers[ci] == 1 ? " caller" : " callers"),
        ci, &Stat::rate);
  }
  std::vector<double> phase[3];
  for (const auto& per : server_us) {
    for (int k = 0; k < 3; ++k) phase[k].insert(phase[k].end(), per[k].begin(), per[k].end());
  }
  std::printf("\nfusebox server's own Timing at %s, median over every measured call: total_us %.1f "
              "(queue_us %.1f, kernel_us %.1f)\n",
              one.c_str(), load::Percentile(phase[0], 0.5), load::Percentile(phase[1], 0.5),
              load::Percentile(phase[2], 0.5));
  if (is_active(kFuseboxExecute)) {
    std::vector<double> total;
    for (const auto& per : execute_us) total.insert(total.end(), per[0].begin(), per[0].end());
    std::printf("fusebox server's own total_us over Execute (window %d) at %s: median %.1f\n",
                o.stream_window, one.c_str(), load::Percentile(total, 0.5));
  }
  return 0;
}

// The transfer mode: see the file's header.
struct TransferOptions {
  std::string fusebox, echo;
  int64_t bytes = int64_t{1} << 30;
  std::vector<int> connections = {1, 4};
  int64_t range_bytes = int64_t{8} << 20;
  int rounds = 3;
};

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The echo's Sink (up) or Source (down) moving `bytes` as n streams of 4 MiB messages, each on
// a stub of its own connection; returns the seconds it took, or -1 on an error.
double EchoTransfer(const std::vector<std::unique_ptr<fusebox::bench::Echo::Stub>>& stubs,
                    int64_t bytes, bool up) {
  constexpr int64_t kMessage = int64_t{4} << 20;
  const int n = static_cast<int>(stubs.size());
  std::atomic<bool> failed{false};
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      const int64_t share = bytes / n + (i < bytes % n ? 1 : 0);
      grpc::ClientContext ctx;
      if (up) {
        fusebox::bench::Count count;
        auto w = stubs[i]->Sink(&ctx, &count);
        fusebox::bench::Blob blob;
        std::string payload(static_cast<size_t>(std::min(kMessage, share)), 'p');
        for (int64_t sent = 0; sent < share;) {
          const int64_t m = std::min(kMessage, share - sent);
          blob.set_data(payload.data(), static_cast<size_t>(m));
          if (!w->Write(blob)) break;
          sent += m;
        }
        w->WritesDone();
        if (!w->Finish().ok() || count.bytes() < share) failed = true;
      } else {
        fusebox::bench::SourceRequest req;
        req.set_bytes(share);
        req.set_message_bytes(kMessage);
        auto r = stubs[i]->Source(&ctx, req);
        fusebox::bench::Blob blob;
        int64_t got = 0;
        while (r->Read(&blob)) got += static_cast<int64_t>(blob.data().size());
        if (!r->Finish().ok() || got != share) failed = true;
      }
    });
  }
  for (auto& t : threads) t.join();
  return failed ? -1 : Seconds(t0, Clock::now());
}

int RunTransfer(const TransferOptions& o) {
  fc::HostTensor t;
  t.dtype = fusebox::DType::kFloat32;
  t.shape = {o.bytes / 4};
  t.data.assign(static_cast<size_t>(o.bytes / 4 * 4), '\x3f');
  const double gb = static_cast<double>(t.data.size()) / 1e9;
  std::string dst(t.data.size(), '\0');  // DownloadInto's destination, touched once here
  std::printf("| connections | fusebox upload GB/s | echo sink GB/s | upload / sink | "
              "fusebox DownloadInto GB/s | echo source GB/s | DownloadInto / source | "
              "fusebox Download (new HostTensor) GB/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  for (int n : o.connections) {
    fc::Client::Options copts;
    copts.transfer_connections = n;
    copts.parallel_min_bytes = 0;  // n > 1: always the ranged path; n = 1: the plain one
    copts.range_bytes = o.range_bytes;
    copts.default_timeout = std::chrono::milliseconds(600000);
    auto client = fc::Client::Create(o.fusebox, copts);
    std::vector<std::unique_ptr<fusebox::bench::Echo::Stub>> echo;
    for (int i = 0; i < n; ++i) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetInt("fusebox.bench_connection", i);
      args.SetMaxReceiveMessageSize(-1);
      echo.push_back(fusebox::bench::Echo::NewStub(
          grpc::CreateCustomChannel(o.echo, grpc::InsecureChannelCredentials(), args)));
    }
    std::vector<double> up, down, down_new, sink, source;
    for (int r = 0; r < o.rounds; ++r) {
      auto t0 = Clock::now();
      auto info = client->Upload(t, 4 << 20, std::chrono::milliseconds(600000));
      auto t1 = Clock::now();
      if (!info.ok()) {
        std::fprintf(stderr, "upload: %s\n", info.status().ToString().c_str());
        return 1;
      }
      up.push_back(gb / Seconds(t0, t1));
      // Into memory that was touched before (as the echo's client reads into buffers it
      // reuses), then as a new HostTensor, whose fresh pages are part of its cost.
      t0 = Clock::now();
      const absl::Status into = client
                                    ->DownloadInto(info->handle, dst.data(), dst.size(), n,
                                                   std::chrono::milliseconds(600000))
                                    .status();
      t1 = Clock::now();
      if (!into.ok()) {
        std::fprintf(stderr, "download: %s\n", into.ToString().c_str());
        return 1;
      }
      down.push_back(gb / Seconds(t0, t1));
      t0 = Clock::now();
      auto back = client->Download(info->handle, std::chrono::milliseconds(600000));
      t1 = Clock::now();
      if (!back.ok() || back->data.size() != t.data.size()) {
        std::fprintf(stderr, "download: %s\n", back.status().ToString().c_str());
        return 1;
      }
      down_new.push_back(gb / Seconds(t0, t1));
      back = absl::StatusOr<fc::HostTensor>();  // its memory back before the echo runs
      client->FreeTensor(info->handle).IgnoreError();
      const double s_up = EchoTransfer(echo, o.bytes, true);
      const double s_down = EchoTransfer(echo, o.bytes, false);
      if (s_up < 0 || s_down < 0) {
        std::fprintf(stderr, "the echo failed\n");
        return 1;
      }
      sink.push_back(gb / s_up);
      source.push_back(gb / s_down);
    }
    const double mu = load::Percentile(up, 0.5), md = load::Percentile(down, 0.5);
    const double ms = load::Percentile(sink, 0.5), mo = load::Percentile(source, 0.5);
    std::printf("| %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", n, mu, ms, mu / ms, md,
                mo, md / mo, load::Percentile(down_new, 0.5));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string server, cases_arg = "4KiB:1,4KiB:8,64MiB:1", paths_arg = "zerocopy", dtype_arg = "float32";
  int64_t min_calls = 20, max_calls = 20000;
  double max_seconds = 5, warmup_seconds = 0.5;
  int channels = 1;
  bool reuse_output = true, header = true, phases = false;
  std::vector<std::pair<std::string, int>> channel_args;
  bool floor = false, warmup_set = false, transfer = false;
  FloorOptions fo;
  TransferOptions to;
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
    else if (a == "--warmup_seconds") { warmup_seconds = std::atof(v.c_str()); warmup_set = true; }
    else if (a == "--channels") channels = std::max(1, std::atoi(v.c_str()));
    else if (a == "--dtype") dtype_arg = v;
    else if (a == "--output_buffer") reuse_output = v != "fresh";
    else if (a == "--no_header") { header = false; if (eq == std::string::npos && !v.empty()) --i; }
    else if (a == "--phases") { phases = true; if (eq == std::string::npos && !v.empty()) --i; }
    else if (a == "--floor") { floor = true; if (eq == std::string::npos && !v.empty()) --i; }
    else if (a == "--echo") fo.echo = to.echo = v;
    else if (a == "--transfer") { transfer = true; if (eq == std::string::npos && !v.empty()) --i; }
    else if (a == "--transfer_bytes") to.bytes = ParseSize(v);
    else if (a == "--range_mib") to.range_bytes = std::max<int64_t>(1, std::atoll(v.c_str())) << 20;
    else if (a == "--connections") {
      to.connections.clear();
      for (const auto& c : Split(v, ',')) to.connections.push_back(std::max(1, std::atoi(c.c_str())));
      if (to.connections.empty()) { std::fprintf(stderr, "bad --connections\n"); return 2; }
    }
    else if (a == "--floor_bytes") fo.bytes = ParseSize(v);
    else if (a == "--stream_window") fo.stream_window = std::atoi(v.c_str());
    else if (a == "--unix") fo.unix_target = v;
    else if (a == "--rounds") fo.rounds = to.rounds = std::max(1, std::atoi(v.c_str()));
    else if (a == "--round_seconds") fo.round_seconds = std::atof(v.c_str());
    else if (a == "--floor_callers") {
      fo.callers.clear();
      for (const auto& c : Split(v, ',')) fo.callers.push_back(std::max(1, std::atoi(c.c_str())));
      if (fo.callers.empty()) { std::fprintf(stderr, "bad --floor_callers\n"); return 2; }
    }
    else if (a == "--channel_arg" && v.find('=') != std::string::npos)
      channel_args.emplace_back(v.substr(0, v.find('=')), std::atoi(v.c_str() + v.find('=') + 1));
    else { std::fprintf(stderr, "fusebox-rpc-bench: unknown option %s\n%s", a.c_str(), kUsage); return 2; }
  }
  if (server.empty()) { std::fprintf(stderr, "fusebox-rpc-bench: --server is required\n%s", kUsage); return 2; }
  if (transfer) {
    if (to.echo.empty()) { std::fprintf(stderr, "fusebox-rpc-bench: --transfer needs --echo\n%s", kUsage); return 2; }
    if (to.bytes < 4) { std::fprintf(stderr, "--transfer_bytes: at least 4\n"); return 2; }
    to.fusebox = server;
    return RunTransfer(to);
  }
  if (floor) {
    if (fo.echo.empty()) { std::fprintf(stderr, "fusebox-rpc-bench: --floor needs --echo\n%s", kUsage); return 2; }
    if (fo.bytes < 4 || fo.bytes % 4 != 0) { std::fprintf(stderr, "--floor_bytes: a multiple of 4\n"); return 2; }
    fo.fusebox = server;
    fo.warmup_seconds = warmup_set ? warmup_seconds : 0.1;
    return RunFloor(fo);
  }
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
                load::Percentile(lat, 0.5), load::Percentile(lat, 0.99),
                [&] { double s = 0; for (double v : lat) s += v; return s / std::max(1.0, calls); }(),
                calls / wall, gbs_in, 2 * gbs_in, load::Percentile(series[1], 0.5), load::Percentile(series[2], 0.5));
    if (phases) {
      for (int k = 3; k < kSeries; ++k) std::printf(" %.1f |", load::Percentile(series[k], 0.5));
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}
