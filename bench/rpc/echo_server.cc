// fusebox-rpc-echo: the RPC-path floor. A callback (async) gRPC server of fusebox.bench.Echo
// that returns each request's bytes, unary and over a bidirectional stream. It is built by the
// same CMake project as fusebox-server (same gRPC, protobuf and compiler flags) and listens the
// same way (prints "listening on HOST:PORT" first on stdout; port 0 picks a free one), so
// fusebox-rpc-bench --floor can time fusebox's RPCs against it on the same machine.
#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <pthread.h>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include "echo.grpc.pb.h"

namespace {

using fusebox::bench::Blob;

// Blob{data = n bytes}, serialized: what Source sends, built once per size and shared.
grpc::ByteBuffer SerializedBlob(int64_t n) {
  Blob b;
  b.mutable_data()->resize(static_cast<size_t>(n), 'e');
  grpc::ByteBuffer out;
  bool own = false;
  grpc::SerializationTraits<Blob>::Serialize(b, &out, &own);
  return out;
}

using EchoBase = fusebox::bench::Echo::WithRawCallbackMethod_EchoBytes<
    fusebox::bench::Echo::WithRawCallbackMethod_Sink<
        fusebox::bench::Echo::WithRawCallbackMethod_Source<fusebox::bench::Echo::CallbackService>>>;

class EchoService final : public EchoBase {
 public:
  // Raw: the bytes are counted, never parsed or copied.
  grpc::ServerReadReactor<grpc::ByteBuffer>* Sink(grpc::CallbackServerContext*,
                                                  grpc::ByteBuffer* reply) override {
    class Reactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
     public:
      explicit Reactor(grpc::ByteBuffer* reply) : reply_(reply) { StartRead(&in_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          fusebox::bench::Count c;
          c.set_bytes(bytes_);
          bool own = false;
          grpc::SerializationTraits<fusebox::bench::Count>::Serialize(c, reply_, &own);
          Finish(grpc::Status::OK);
          return;
        }
        bytes_ += static_cast<int64_t>(in_.Length());
        in_.Clear();
        StartRead(&in_);
      }
      void OnDone() override { delete this; }

     private:
      grpc::ByteBuffer* const reply_;
      grpc::ByteBuffer in_;
      int64_t bytes_ = 0;
    };
    return new Reactor(reply);
  }

  // Raw: one prebuilt message whose slices every write shares.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Source(grpc::CallbackServerContext*,
                                                     const grpc::ByteBuffer* request) override {
    class Reactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
     public:
      explicit Reactor(const grpc::ByteBuffer* request) {
        fusebox::bench::SourceRequest req;
        grpc::ByteBuffer copy(*request);
        if (!grpc::SerializationTraits<fusebox::bench::SourceRequest>::Deserialize(&copy, &req)
                 .ok() ||
            req.bytes() < 0 || req.message_bytes() <= 0) {
          Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad SourceRequest"));
          return;
        }
        left_ = req.bytes();
        full_ = SerializedBlob(std::min(req.message_bytes(), std::max<int64_t>(left_, 1)));
        message_bytes_ = req.message_bytes();
        Next();
      }
      void OnWriteDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
          return;
        }
        Next();
      }
      void OnDone() override { delete this; }

     private:
      void Next() {
        if (left_ == 0) {
          Finish(grpc::Status::OK);
          return;
        }
        const int64_t n = std::min(left_, message_bytes_);
        out_ = n == message_bytes_ ? full_ : SerializedBlob(n);
        left_ -= n;
        StartWrite(&out_);
      }
      grpc::ByteBuffer full_, out_;
      int64_t left_ = 0, message_bytes_ = 1;
    };
    return new Reactor(request);
  }


  grpc::ServerUnaryReactor* EchoBytes(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    *response = *request;  // shares the slices
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

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
