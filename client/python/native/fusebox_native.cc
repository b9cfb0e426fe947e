// libfusebox_native: the Python client's native transport, a C ABI over the C++ client
// (client/cpp) that fusebox_client/_native.py loads with ctypes. grpcio copies a message's
// bytes several times on each side (lab/notes/python-client.md); through this library a large
// op call costs what it costs the C++ client: the request goes out as slices that point at the
// caller's arrays, and the reply is gathered once, on the client's copy threads, straight into
// memory the caller allocated. ctypes releases the GIL for every call here.
//
// Errors: fbx_call returns the gRPC status code (0 = OK) and writes the message to `msg`.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "client/cpp/fusebox_client.h"
#include "kernels/cpu/parallel_copy.h"

namespace {

using fusebox::HostPieces;
using fusebox::client::Client;

struct Handle {
  std::unique_ptr<Client> client;
  int copy_threads = 0;  // the client's, for the replies' gathers
};

struct Reply {
  grpc::ByteBuffer buffer;
  std::vector<grpc::Slice> slices;  // buffer's, kept referenced while the pieces point at them
  HostPieces pieces;
  size_t size = 0;
  int copy_threads = 0;  // its Handle's
};

std::string Text(const char* p, size_t n) { return p ? std::string(p, n) : std::string(); }

void WriteMessage(const std::string& text, char* msg, size_t cap) {
  if (msg == nullptr || cap == 0) return;
  const size_t n = std::min(text.size(), cap - 1);
  std::memcpy(msg, text.data(), n);
  msg[n] = '\0';
}

}  // namespace

#define FBX_API __attribute__((visibility("default")))

extern "C" {

// A client of `target` ("host:port" or "unix:PATH"). PEM texts with their lengths (null: none);
// tls != 0 or any PEM or server_name turns TLS on. max_message_bytes: -1 = no limit.
// copy_threads: threads that gather a large reply (0 = min(4, cores / 2)). Never null.
FBX_API void* fbx_open(const char* target, const char* token, const char* root, size_t root_len,
               const char* chain, size_t chain_len, const char* key, size_t key_len,
               const char* server_name, int tls, int max_message_bytes, int copy_threads) {
  Client::Options o;
  o.max_message_bytes = max_message_bytes;
  o.auth_token = token ? token : "";
  o.tls.enabled = tls != 0;
  o.tls.root_certs = Text(root, root_len);
  o.tls.cert_chain = Text(chain, chain_len);
  o.tls.private_key = Text(key, key_len);
  o.tls.server_name = server_name ? server_name : "";
  o.copy_threads = copy_threads;
  auto* h = new Handle;
  h->client = Client::Create(target, o);
  h->copy_threads = copy_threads;
  return h;
}

FBX_API void fbx_close(void* handle) { delete static_cast<Handle*>(handle); }

// One unary call of `method` ("/package.Service/Method") with the request's bytes in n pieces
// (sent without a copy; they stay valid until this returns). handle_hint: a handle the call
// names (its replica's header is sent), or null. timeout_s <= 0: the client's default (60 s).
// On OK (0) *reply holds the reply's bytes (fbx_reply_size / fbx_reply_copy / fbx_reply_free).
FBX_API int fbx_call(void* handle, const char* method, const void* const* data, const size_t* sizes,
             int n, const char* handle_hint, double timeout_s, void** reply, char* msg,
             size_t msg_cap) {
  auto* h = static_cast<Handle*>(handle);
  *reply = nullptr;
  HostPieces request;
  request.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) request.push_back({data[i], sizes[i]});
  auto r = std::make_unique<Reply>();
  const auto timeout = std::chrono::milliseconds(
      timeout_s > 0 ? std::max<int64_t>(1, static_cast<int64_t>(timeout_s * 1e3)) : 0);
  const absl::Status st = h->client->CallEncoded(method, request, &r->buffer, timeout,
                                                 handle_hint ? handle_hint : "");
  if (!st.ok()) {
    WriteMessage(std::string(st.message()), msg, msg_cap);
    return static_cast<int>(st.code());
  }
  if (!r->buffer.Dump(&r->slices).ok()) {
    WriteMessage("the reply could not be read", msg, msg_cap);
    return static_cast<int>(absl::StatusCode::kInternal);
  }
  for (const grpc::Slice& s : r->slices) {
    r->pieces.push_back({s.begin(), s.size()});
    r->size += s.size();
  }
  r->copy_threads = h->copy_threads;
  *reply = r.release();
  return 0;
}

FBX_API size_t fbx_reply_size(const void* reply) { return static_cast<const Reply*>(reply)->size; }

// Copies bytes [offset, offset + n) of the reply to dst; 1 on success, 0 past its end.
FBX_API int fbx_reply_copy(const void* reply, size_t offset, void* dst, size_t n) {
  const auto* r = static_cast<const Reply*>(reply);
  if (offset > r->size || n > r->size - offset) return 0;
  return fusebox::GatherPieces(r->pieces, offset, dst, n, r->copy_threads) ? 1 : 0;
}

FBX_API void fbx_reply_free(void* reply) { delete static_cast<Reply*>(reply); }

}  // extern "C"
