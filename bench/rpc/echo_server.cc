// fusebox-rpc-echo: the RPC-path floor. A callback (async) gRPC server of fusebox.bench.Echo
// that returns each request's bytes, unary and over a bidirectional stream. It is built by the
// same CMake project as fusebox-server (same gRPC, protobuf and compiler flags) and listens the
// same way (prints "listening on HOST:PORT" first on stdout; port 0 picks a free one), so
// fusebox-rpc-bench --floor can time fusebox's RPCs against it on the same machine.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <pthread.h>

#include <grpcpp/grpcpp.h>

#include "echo.grpc.pb.h"

namespace {

using fusebox::bench::Blob;

class EchoService final : public fusebox::bench::Echo::CallbackService {
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, const Blob* request,
                                  Blob* response) override {
    // One copy of the payload, as fusebox's op RPCs copy the result into their response.
    response->set_data(request->data());
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerBidiReactor<Blob, Blob>* Stream(grpc::CallbackServerContext*) override {
    // Read one message, write it back, read the next: one message in flight per stream, which
    // is what a caller doing write-then-read sends.
    class Reactor final : public grpc::ServerBidiReactor<Blob, Blob> {
     public:
      Reactor() { StartRead(&in_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        out_.set_data(in_.data());
        StartWrite(&out_);
      }
      void OnWriteDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
          return;
        }
        StartRead(&in_);
      }
      void OnDone() override { delete this; }

     private:
      Blob in_, out_;
    };
    return new Reactor();
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string address = "127.0.0.1:0";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--address=", 10) == 0) {
      address = argv[i] + 10;
    } else {
      std::fprintf(stderr, "usage: fusebox-rpc-echo [--address=HOST:PORT]  (default 127.0.0.1:0)\n");
      return std::strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  // Serve until SIGTERM or SIGINT. Blocked before gRPC starts its threads, so that none of
  // them takes the signal.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  EchoService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  // fusebox-server lifts the message limits the same way (its default max is far above 4 MiB).
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    std::fprintf(stderr, "fusebox-rpc-echo: cannot listen on %s\n", address.c_str());
    return 1;
  }
  const std::string host = address.substr(0, address.rfind(':'));
  std::printf("fusebox-rpc-echo listening on %s:%d\n", host.c_str(), port);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  server->Shutdown();
  return 0;
}
