// `fusebox`: command-line client. Runs one op on .npy files (or tensors the
// server holds) against a fusebox server, writes the .npy result and prints
// where the time went; uploads, downloads, frees and lists held tensors;
// `health` asks the server's grpc.health.v1 service.
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "client/cpp/connection_flags.h"
#include "client/cpp/fusebox_client.h"
#include "client/cpp/npy.h"
#include "fusebox/version.h"

namespace fc = fusebox::client;

namespace {

// Shown under every --help: what the options' help lines cannot say.
constexpr char kFooter[] = R"(
An input written @HANDLE is a tensor the server already holds (from upload or
--keep) instead of a file. An input or output written - is standard input or
output (the text that would go to stdout then goes to stderr). Each subcommand
has its own --help.

.npy conventions (NumPy has no bfloat16):
  '<f4' float32, '<f2' float16, '<u2' bfloat16 bit patterns (upper half of a float32),
  '<f8' accepted and narrowed to float32. C order, little-endian, format v1/v2/v3.
  A bfloat16 result is written as '<f4' (exact) unless --bf16_bits is given.

output: the result file, and on stdout the op, shapes and the server's timing
(queue, copy in, launch, kernel, copy out, total, in microseconds) plus the
client's round-trip time.

The on/off options (--tls, --allow_tf32, --keep, --bf16_bits, --progress,
--quiet) also take =true or =false (=1 / =0). An option given empty (--tls_ca=)
overrides its variable.

exit status: 0 success; 1 the call or a file failed (the gRPC code and the
server's message are printed); 2 bad command line.
)";

int Usage(const std::string& msg) {
  std::fprintf(stderr, "fusebox: %s\n(run `fusebox --help` for usage)\n", msg.c_str());
  return 2;
}

std::string ShapeString(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Progress of one transfer on stderr: a line rewritten in place on a terminal, a line per
// 10% elsewhere; shown from the start when forced, else once the transfer has taken 1 s.
class ProgressLine {
 public:
  ProgressLine(const char* what, bool forced, bool enabled)
      : what_(what), forced_(forced), enabled_(enabled), tty_(isatty(2) == 1),
        start_(std::chrono::steady_clock::now()) {}
  ~ProgressLine() {
    if (shown_ && tty_) std::fputc('\n', stderr);
  }
  void operator()(int64_t done, int64_t total) {
    if (!enabled_ || (!forced_ && !tty_)) return;
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - start_).count();
    if (!forced_ && s < 1.0) return;
    const int pct = total > 0 ? static_cast<int>(100 * done / total) : 100;
    const bool last = done >= total;
    if (tty_ ? (!last && now - last_ < std::chrono::milliseconds(200)) : (pct / 10 == last_pct_ / 10 && !last)) return;
    if (last && last_pct_ == 100) return;
    last_ = now;
    last_pct_ = pct;
    shown_ = true;
    std::fprintf(stderr, "%s%s: %.1f of %.1f MiB (%d%%), %.0f MiB/s%s", tty_ ? "\r" : "", what_,
                 done / 1048576.0, total / 1048576.0, pct, s > 0 ? done / 1048576.0 / s : 0.0,
                 tty_ ? "  " : "\n");
    std::fflush(stderr);
  }

 private:
  const char* what_;
  bool forced_, enabled_, tty_, shown_ = false;
  int last_pct_ = -1;
  std::chrono::steady_clock::time_point start_, last_;
};

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "fusebox: error: %s: %s\n", absl::StatusCodeToString(st.code()).c_str(),
               std::string(st.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  fc::ConnectionFlags conn = fc::ConnectionFlags::FromEnvironment();
  const std::string& server = conn.server;
  std::string output, dtype_name, impl_name = "default";
  bool allow_tf32 = false, bf16_bits = false, quiet = false, keep = false, progress = false;
  long chunk_mib = 4;
  int connections = 4;  // parallel transfers (Client::Options::transfer_connections)
  long timeout_ms = 60000;
  std::vector<std::string> inputs;

  CLI::App app("fusebox: run fusebox kernels on .npy files through a fusebox server.", "fusebox");
  app.set_version_flag("--version", "fusebox " FUSEBOX_VERSION " (commit " FUSEBOX_COMMIT ", "
                       FUSEBOX_BUILD_TYPE " build)");
  app.footer(kFooter);
  app.require_subcommand(1);
  app.fallthrough();  // the connection options may also follow the subcommand
  conn.AddTo(&app,
             "HOST:PORT or unix:PATH (default: $FUSEBOX_SERVER, else localhost:50051); several "
             "replicas without a proxy: ID=HOST:PORT,ID=HOST:PORT (calls naming a handle go "
             "to the replica ID it starts with)");
  app.add_option("--timeout_ms", timeout_ms, "deadline for the call")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--connections", connections,
                 "uploads and downloads of at least 64 MiB go as byte ranges on this many "
                 "connections at once (1: one stream)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_flag("-q,--quiet", quiet, "do not print the timing or progress");
  app.add_flag("--progress", progress,
               "a progress line on stderr for uploads and downloads (default: when stderr is a "
               "terminal and the transfer takes over a second)");

  auto add_output = [&](CLI::App* sub, bool required) {
    auto* o = sub->add_option("-o,--output", output, "where to write the result (.npy; - is stdout)");
    if (required) o->required();
    sub->add_flag("--bf16_bits", bf16_bits, "write a bfloat16 result as '<u2' bit patterns instead of float32");
  };
  auto add_dtype = [&](CLI::App* sub) {
    sub->add_option("--dtype", dtype_name,
                    "dtype to compute in (default: the input file's); converted on the client, "
                    "rounding to nearest even: float32, float16 or bfloat16");
  };
  auto add_op = [&](const char* name, const char* what, int min_inputs, int max_inputs,
                    const char* inputs_help) {
    CLI::App* sub = app.add_subcommand(name, what);
    sub->add_option("inputs", inputs, inputs_help)->required()->expected(min_inputs, max_inputs);
    add_output(sub, false);
    add_dtype(sub);
    sub->add_flag("--keep", keep,
                  "keep the result on the server; its handle is printed on the first line (-o is "
                  "then optional: given, the result is also downloaded)");
    return sub;
  };
  add_op("gelu", "tanh-form GeLU, elementwise, any shape", 1, 1, "IN.npy or @HANDLE");
  add_op("softmax", "softmax over the last axis (rank >= 1)", 1, 1, "IN.npy or @HANDLE");
  add_op("rowsum", "sum over the last axis (rank >= 1); the output is always float32", 1, 1,
         "IN.npy or @HANDLE");
  CLI::App* mm = add_op("matmul_relu", "relu(A @ B + BIAS): A [M,K], B [K,N], optional BIAS [N]",
                        2, 3, "A B [BIAS]: .npy files or @HANDLEs");
  mm->add_flag("--allow_tf32", allow_tf32, "float32 only: let a GPU use TF32 tensor cores");
  mm->add_option("--impl", impl_name, "on a GPU: the matmul implementation")
      ->check(CLI::IsMember({"default", "cublaslt", "tiled"}));
  CLI::App* up = app.add_subcommand("upload", "store a tensor on the server; prints its handle");
  up->add_option("inputs", inputs, "IN.npy (- is stdin)")->required()->expected(1);
  add_dtype(up);
  up->add_option("--chunk_mib", chunk_mib, "upload chunk size in MiB")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  CLI::App* down = app.add_subcommand("download", "fetch a held tensor into a .npy file");
  down->add_option("inputs", inputs, "HANDLE")->required()->expected(1);
  add_output(down, true);
  app.add_subcommand("free", "free held tensors")
      ->add_option("inputs", inputs, "HANDLE...")->required()->expected(1, -1);
  app.add_subcommand("list", "list the tensors this caller holds");
  app.add_subcommand("health", "print SERVING / NOT_SERVING; exit 0 only when SERVING");

  // `--tls_ca=` (empty) overrides its variable.
  std::vector<std::string> words = fc::WordsForCli11(argc, argv);
  try {
    app.parse(words);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return Usage(e.what());
  }
  const std::string op = app.get_subcommands().front()->get_name();
  if (std::count(inputs.begin(), inputs.end(), "-") > 1) {
    return Usage("standard input (-) can be only one of the inputs");
  }
  // With the result on stdout, what would be printed there goes to stderr.
  FILE* text = output == "-" ? stderr : stdout;
  std::optional<fusebox::DType> want;
  if (!dtype_name.empty()) {
    fusebox::DType d;
    if (!fc::ParseDType(dtype_name, &d)) return Usage("unknown --dtype '" + dtype_name + "'");
    want = d;
  }
  fc::CallOptions opts;
  opts.timeout = std::chrono::milliseconds(timeout_ms);
  opts.allow_tf32 = allow_tf32;
  opts.keep_on_server = keep;
  if (impl_name == "default") opts.impl = fc::MatmulImpl::kDefault;
  else if (impl_name == "cublaslt") opts.impl = fc::MatmulImpl::kCublasLt;
  else if (impl_name == "tiled") opts.impl = fc::MatmulImpl::kTiled;
  else return Usage("unknown --impl '" + impl_name + "'");

  fc::Client::Options copts;
  copts.transfer_connections = connections;
  if (const std::string m = conn.Mistake(); !m.empty()) return Usage(m);
  if (absl::Status st = conn.ApplyTo(&copts); !st.ok()) return Fail(st);
  // Several servers, "ID=HOST:PORT,...": a call naming a handle goes to the replica whose id
  // starts it, the rest to the first (a single call has no turn to take).
  std::unique_ptr<fc::Router> router;
  std::unique_ptr<fc::Client> client;
  if (server.find(',') != std::string::npos || server.find('=') != std::string::npos) {
    std::vector<std::string> targets = absl::StrSplit(server, ',');
    for (const auto& t : targets) {
      if (t.find('=') == std::string::npos || t.front() == '=') {
        return Usage("with several servers, name each one's replica: ID=HOST:PORT,ID=HOST:PORT");
      }
    }
    if (op == "health" || op == "list") return Usage(op + " takes one server");
    router = fc::Router::Create(targets, copts);
  } else {
    client = fc::Client::Create(server, copts);
  }
  auto pick = [&](const std::string& handle) -> absl::StatusOr<fc::Client*> {
    if (!router) return client.get();
    return router->For(handle);
  };

  if (op == "health") {
    if (!inputs.empty()) return Usage("health takes no inputs");
    auto h = client->Health("", std::chrono::milliseconds(timeout_ms));
    if (!h.ok()) return Fail(h.status());
    static const char* kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
    std::printf("%s\n", kNames[static_cast<int>(*h)]);
    return *h == fc::HealthStatus::kServing ? 0 : 1;
  }

  auto print_info = [&](const fc::TensorInfo& t) {
    std::printf("%s  %s %s  %lld bytes\n", t.handle.c_str(), fusebox::DTypeName(t.dtype),
                ShapeString(t.shape).c_str(), static_cast<long long>(t.size_bytes));
  };
  if (op == "upload") {
    if (inputs.size() != 1) return Usage("upload takes one .npy file");
    auto arr = fc::ReadNpy(inputs[0]);
    if (!arr.ok()) return Fail(arr.status());
    auto t = fc::NpyToTensor(std::move(*arr), want);
    if (!t.ok()) return Fail(t.status());
    auto c = pick("");
    if (!c.ok()) return Fail(c.status());
    ProgressLine line("upload", progress, !quiet);
    auto info = (*c)->Upload(*t, static_cast<int64_t>(chunk_mib) << 20, opts.timeout,
                             std::ref(line));
    if (!info.ok()) return Fail(info.status());
    print_info(*info);
    return 0;
  }
  if (op == "download") {
    if (inputs.size() != 1) return Usage("download takes one handle");
    if (output.empty()) return Usage("no output file: pass -o OUT.npy");
    auto c = pick(inputs[0]);
    if (!c.ok()) return Fail(c.status());
    absl::StatusOr<fc::HostTensor> t;
    {
      ProgressLine line("download", progress, !quiet);
      t = (*c)->Download(inputs[0], opts.timeout, std::ref(line));
    }
    if (!t.ok()) return Fail(t.status());
    const fusebox::DType dtype = t->dtype;
    const std::vector<int64_t> shape = t->shape;
    absl::Status st = fc::WriteNpy(output, fc::TensorToNpy(std::move(*t), bf16_bits));
    if (!st.ok()) return Fail(st);
    if (!quiet) std::fprintf(text, "%s %s written to %s\n", fusebox::DTypeName(dtype), ShapeString(shape).c_str(), output.c_str());
    return 0;
  }
  if (op == "free") {
    if (inputs.empty()) return Usage("free takes one or more handles");
    for (const auto& h : inputs) {
      auto c = pick(h);
      if (!c.ok()) return Fail(c.status());
      auto n = (*c)->FreeTensor(h);
      if (!n.ok()) return Fail(n.status());
      if (!quiet) std::printf("%s freed (%lld bytes)\n", h.c_str(), static_cast<long long>(*n));
    }
    return 0;
  }
  if (op == "list") {
    if (!inputs.empty()) return Usage("list takes no arguments");
    auto l = client->ListTensors();
    if (!l.ok()) return Fail(l.status());
    for (const auto& t : l->tensors) print_info(t);
    std::printf("%zu tensors, %lld of %lld bytes used\n", l->tensors.size(),
                static_cast<long long>(l->used_bytes), static_cast<long long>(l->quota_bytes));
    return 0;
  }

  size_t min_in = 1, max_in = 1;
  if (op == "matmul_relu") { min_in = 2; max_in = 3; }
  else if (op != "gelu" && op != "softmax" && op != "rowsum") return Usage("unknown op '" + op + "'");
  if (inputs.size() < min_in || inputs.size() > max_in) {
    return Usage(op + (op == "matmul_relu" ? " takes A.npy B.npy [BIAS.npy]" : " takes one input .npy"));
  }
  if (output.empty() && !keep) return Usage("no output file: pass -o OUT.npy (or --keep)");

  // Files become inline tensors; @HANDLE inputs refer to tensors the server holds.
  std::vector<fc::HostTensor> tensors(inputs.size());
  std::vector<fc::Arg> args;
  std::optional<fusebox::DType> first_dtype = want;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].size() > 1 && inputs[i][0] == '@') {
      args.push_back(fc::Arg::Handle(inputs[i].substr(1)));
      continue;
    }
    auto arr = fc::ReadNpy(inputs[i]);
    if (!arr.ok()) return Fail(arr.status());
    // Matmul operands must share one dtype: the first file's unless --dtype says.
    auto t = fc::NpyToTensor(std::move(*arr), first_dtype);
    if (!t.ok()) {
      return Fail(absl::Status(t.status().code(), inputs[i] + ": " + std::string(t.status().message())));
    }
    first_dtype = t->dtype;
    tensors[i] = std::move(*t);
    args.emplace_back(tensors[i]);
  }

  static const std::pair<const char*, fc::Op> kOps[] = {
      {"gelu", fc::Op::kGelu}, {"softmax", fc::Op::kSoftmax}, {"rowsum", fc::Op::kRowSum},
      {"matmul_relu", fc::Op::kMatmulRelu}};
  fc::Op which = fc::Op::kGelu;
  for (const auto& [name, o] : kOps) if (op == name) which = o;
  std::string routed;
  for (const auto& a : args) {
    if (!a.handle().empty() && routed.empty()) routed = a.handle();
  }
  auto c = pick(routed);
  if (!c.ok()) return Fail(c.status());
  fc::OpResult r;
  absl::Status st = (*c)->Call(which, args, &r, opts);
  if (!st.ok()) return Fail(st);

  if (keep) {
    // Printed even with -q: it is the result.
    std::fprintf(text, "%s\n", r.handle.c_str());
    if (!output.empty()) {
      ProgressLine line("download", progress, !quiet);
      auto t = (*c)->Download(r.handle, opts.timeout, std::ref(line));
      if (!t.ok()) return Fail(t.status());
      r.output = std::move(*t);
    }
  }
  if (!output.empty()) {
    const fusebox::DType dtype = r.output.dtype;
    const std::vector<int64_t> shape = r.output.shape;
    st = fc::WriteNpy(output, fc::TensorToNpy(std::move(r.output), bf16_bits));
    r.output.dtype = dtype;  // the bytes are gone; the summary below needs the rest
    r.output.shape = shape;
    if (!st.ok()) return Fail(st);
  }
  if (!quiet) {
    const fc::Timing& t = r.timing;
    if (output.empty()) {
      std::fprintf(text, "%s: %s -> kept on the server as %s\n", op.c_str(), inputs[0].c_str(), r.handle.c_str());
    } else {
      std::fprintf(text, "%s: %s -> %s %s written to %s\n", op.c_str(), inputs[0].c_str(),
                  fusebox::DTypeName(r.output.dtype), ShapeString(r.output.shape).c_str(), output.c_str());
    }
    std::fprintf(text, "server timing (us): queue %.1f  copy_in %.1f  launch %.1f  kernel %.1f  copy_out %.1f"
                "  total %.1f  [%s, %s, stream %d]\n",
                t.queue_us, t.copy_in_us, t.launch_us, t.kernel_us, t.copy_out_us, t.total_us,
                t.backend.c_str(), t.device.c_str(), t.stream);
    std::fprintf(text, "client round trip (us): %.1f\n", t.rpc_us);
  }
  return 0;
}
