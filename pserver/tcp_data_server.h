// The parameter server's raw-TCP face, beside the gRPC DataService and over the same SliceStore:
// the transport's listener (datapath/tcp/listener.h: the port, the local socket, admission
// before a hello, one link per worker) with the server's side of it: a hello passes CheckWorker
// (the job token, the worker's rank) and each admitted worker's requests go to a front door
// (pserver/front_door.h, as the gRPC service's do), served through the server's serving queue
// highest priority first, answered straight from the store's result buffers.
//
// Errors: a request the store refuses (or a bulk that does not parse) gets an error frame and the
// connection goes on; bytes that do not parse as a frame (bad magic, unknown op, oversized
// length, a truncated frame) get an error frame and that connection is closed; other connections
// are not affected.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/base/status.h"
#include "common/tls/tls.h"
#include "datapath/tcp/listener.h"
#include "pserver/serving_queue.h"
#include "pserver/slice_store.h"

namespace trellis {

struct TcpDataServerOptions {
  std::string listen_host = "0.0.0.0";
  int port = 0;                   // 0: pick a free port
  std::string token;              // expected in the hello; empty: no check
  int64_t slice_bytes = 4 << 20;  // bounds a payload (as the gRPC receive limit)
  TlsPtr tls;  // mutual TLS handshake before the hello (common/tls/tls_stream.h); null: plaintext
  TcpAdmissionLimits limits;  // hello deadline, pending and total caps
  bool local_socket = false;  // also a local socket (link::TcpListenerOptions::local_socket)
  // Per connection: requests read and not served yet, and (its bytes) answers not sent yet.
  ReadAheadLimit read_ahead;
};

class TcpDataServer {
 public:
  // `store` and `serving` outlive the server.
  static StatusOr<std::unique_ptr<TcpDataServer>> Start(SliceStore* store, ServingQueue* serving,
                                                        const TcpDataServerOptions& options);

  int port() const { return listener_->port(); }
  // The local socket's name; empty when there is none.
  const std::string& local_name() const { return listener_->local_name(); }
  // Closes the listener and every connection; idempotent (link::TcpListener::Stop).
  void Stop() { listener_->Stop(); }

 private:
  explicit TcpDataServer(std::unique_ptr<link::TcpListener> listener)
      : listener_(std::move(listener)) {}

  const std::unique_ptr<link::TcpListener> listener_;
};

}  // namespace trellis
