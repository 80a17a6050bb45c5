// The parameter server's raw-TCP bulk face (protocol in pserver/tcp_wire.h), beside the gRPC
// DataService and over the same SliceStore.
//
// Threads: one acceptor ("pserver-tcp-acc"); per worker connection one reader ("pserver-tcp-rd")
// that reads each request's payload into the connection's reusable, pre-faulted buffer and
// hands it to the store (which sums from it), and one writer ("pserver-tcp-wr") that sends the
// answers highest priority first with sendmsg straight from the store's result buffers. A reader
// never waits on a write, so two peers that both write a lot cannot deadlock.
//
// Errors: a request the store refuses gets an error frame and the connection goes on; bytes that
// do not parse as a frame (bad magic, unknown op, oversized length, a truncated frame) get an
// error frame and that connection is closed; other connections are not affected.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/tls.h"
#include "pserver/slice_store.h"

namespace trellis {

struct TcpDataServerOptions {
  std::string listen_host = "0.0.0.0";
  int port = 0;                   // 0: pick a free port
  std::string token;              // expected in the hello; empty: no check
  int64_t slice_bytes = 4 << 20;  // bounds a payload (as the gRPC receive limit)
  TlsPtr tls;  // mutual TLS handshake before the hello (common/tls_stream.h); nullptr: plaintext
};

class TcpDataServer {
 public:
  // `store` outlives the server.
  static StatusOr<std::unique_ptr<TcpDataServer>> Start(SliceStore* store,
                                                        const TcpDataServerOptions& options);
  ~TcpDataServer();  // Stop()

  int port() const { return port_; }
  // Closes the listener and every connection (shutdown(2), then joins their threads);
  // idempotent. Answers that arrive later for a closed connection are dropped.
  void Stop();

  struct Connection;  // internal

 private:
  TcpDataServer(SliceStore* store, TcpDataServerOptions options);
  void AcceptLoop();
  void ReapLocked();  // joins connections whose threads ended; REQUIRES: mu_ held

  SliceStore* const store_;
  const TcpDataServerOptions options_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::shared_ptr<Connection>> connections_;  // GUARDED_BY(mu_)
  bool stopped_ = false;                                  // GUARDED_BY(mu_)
};

}  // namespace trellis
