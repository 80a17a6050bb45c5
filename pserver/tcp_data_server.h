// The parameter server's raw-TCP bulk face (protocol in datapath/tcp_wire.h), beside the gRPC
// DataService and over the same SliceStore.
//
// Threads: before its hello a connection costs none: one loop (pserver/tcp_admission.h) accepts,
// runs the TLS handshake, reads hellos without blocking, closes connections without a whole
// hello after `limits.hello_timeout_ms`, and caps pending and total connections. Once its token
// and rank are checked (CheckWorker), a worker's connection becomes a link
// (datapath/tcp_server_link.h: one reader, one writer, the read-ahead and unsent-answer bounds)
// whose requests go to the connection's front door (pserver/front_door.h, as the gRPC service's
// do): served through the server's serving queue one at a time, highest priority first (arrival
// order where priorities tie); a request with nothing waiting in the queue is served on the
// reader itself when it is small or when nothing more has arrived on the connection, else by the
// pool while the reader reads ahead. Answers go back through the link, straight from the
// store's result buffers. When a thread cannot be created, that one connection is refused (a
// log line); the server goes on.
//
// Errors: a request the store refuses (or a bulk that does not parse) gets an error frame and the
// connection goes on; bytes that do not parse as a frame (bad magic, unknown op, oversized
// length, a truncated frame) get an error frame and that connection is closed; other connections
// are not affected. A connection's descriptor is closed as soon as its threads end.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/base/status.h"
#include "common/tls/tls.h"
#include "pserver/serving_queue.h"
#include "pserver/slice_store.h"
#include "pserver/tcp_admission.h"

namespace trellis {

struct TcpDataServerOptions {
  std::string listen_host = "0.0.0.0";
  int port = 0;                   // 0: pick a free port
  std::string token;              // expected in the hello; empty: no check
  int64_t slice_bytes = 4 << 20;  // bounds a payload (as the gRPC receive limit)
  TlsPtr tls;  // mutual TLS handshake before the hello (common/tls/tls_stream.h); nullptr: plaintext
  TcpAdmissionLimits limits;  // hello deadline, pending and total caps
  // Also listen on a local socket (datapath/tcp_wire.h: a Unix socket under a fresh random
  // name) for workers in this network namespace: same hello, caps and links. When it cannot be
  // opened the server goes on with TCP alone (a log line). Not with TLS: the record layer's
  // kernel offload (kTLS) exists for TCP only, so a TLS job keeps its bytes on TCP.
  bool local_socket = false;
  // Per connection: requests read and not served yet, and (its bytes) answers not sent yet.
  ReadAheadLimit read_ahead;
};

class TcpDataServer {
 public:
  // `store` and `serving` outlive the server.
  static StatusOr<std::unique_ptr<TcpDataServer>> Start(SliceStore* store, ServingQueue* serving,
                                                        const TcpDataServerOptions& options);
  ~TcpDataServer();  // Stop()

  int port() const { return port_; }
  // The local socket's name; empty when there is none.
  const std::string& local_name() const { return local_name_; }
  // Closes the listener and every connection (shutdown(2), then joins their threads);
  // idempotent. Answers that arrive later for a closed connection are dropped.
  void Stop();

  struct Connection;  // internal: an admitted worker's link and front door

 private:
  TcpDataServer(SliceStore* store, ServingQueue* serving, TcpDataServerOptions options);
  Status CheckHello(const tcpwire::Hello& hello) const;
  void Admit(AdmittedConnection c);  // admission loop thread: the worker's threads
  void Reap();                       // admission loop thread: joins connections that ended

  SliceStore* const store_;
  ServingQueue* const serving_;
  const TcpDataServerOptions options_;
  int port_ = 0;
  std::string local_name_;
  std::unique_ptr<TcpAdmission> admission_;
  std::atomic<size_t> open_{0};  // admitted connections whose descriptor is still open
  std::mutex mu_;
  std::vector<Connection> connections_;  // GUARDED_BY(mu_)
  bool stopped_ = false;                                  // GUARDED_BY(mu_)
};

}  // namespace trellis
