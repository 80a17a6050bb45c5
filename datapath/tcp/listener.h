// The server's raw-TCP listener: the TCP port (and, when asked, a local socket beside it), one
// admission loop for both (admission.h: no thread before a whole hello, deadlines, caps), and a
// link per admitted worker (server_link.h: one reader, one writer, the read-ahead and
// unsent-answer bounds) whose requests go to the receiver the server opens for it.
//
// What a worker may do is the server's: `check` judges its hello (token, rank), `open` makes the
// receiver of its requests, which answers through the link (hold it weakly). When a thread
// cannot be created, that one connection is refused (a log line); the listener goes on. A
// connection's descriptor is closed as soon as its threads end; ended links are reaped (joined,
// their receiver cleared) on the admission thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "common/tls/tls.h"
#include "datapath/link.h"
#include "datapath/tcp/admission.h"
#include "datapath/tcp/server_link.h"
#include "datapath/tcp/wire.h"

namespace trellis::link {

struct TcpListenerOptions {
  std::string listen_host = "0.0.0.0";
  int port = 0;              // 0: pick a free port
  uint64_t max_payload = 0;  // a request with a larger payload ends its connection
  TlsPtr tls;  // mutual TLS handshake before the hello (common/tls/tls_stream.h); null: plaintext
  TcpAdmissionLimits limits;  // hello deadline, pending and total caps
  // Also listen on a local socket (a Unix socket under a fresh random name, address.h) for
  // workers in this network namespace: same hello, caps and links. When it cannot be opened the
  // listener goes on with TCP alone (a log line). Not with TLS: the record layer's kernel
  // offload (kTLS) exists for TCP only, so a TLS job keeps its bytes on TCP.
  bool local_socket = false;
  // Per connection: requests read and not served yet, and (its bytes) answers not sent yet.
  ReadAheadLimit read_ahead;
};

struct TcpWorkerAdmission {
  // Token and rank; a refusal is sent to the worker as an error frame, then it is closed.
  std::function<Status(const tcpwire::Hello&)> check;
  // The receiver of an admitted worker's requests (admission thread).
  std::function<std::shared_ptr<RequestReceiver>(int32_t rank, std::shared_ptr<AnswerSink> sink)>
      open;
};

class TcpListener {
 public:
  static StatusOr<std::unique_ptr<TcpListener>> Start(const TcpListenerOptions& options,
                                                      TcpWorkerAdmission admission);
  ~TcpListener();  // Stop()

  int port() const { return port_; }
  // The local socket's name; empty when there is none.
  const std::string& local_name() const { return local_name_; }
  // Closes the listener and every connection (shutdown(2), then joins their threads);
  // idempotent. Answers that arrive later for a closed connection are dropped.
  void Stop() EXCLUDES(mu_);

 private:
  struct Connection {  // an admitted worker's link and the receiver of its requests
    std::shared_ptr<TcpServerLink> link;
    std::shared_ptr<RequestReceiver> receiver;
  };

  TcpListener(TcpListenerOptions options, TcpWorkerAdmission admission);
  void Admit(AdmittedConnection c) EXCLUDES(mu_);  // admission thread: the worker's threads
  void Reap() EXCLUDES(mu_);  // admission thread: joins connections that ended

  const TcpListenerOptions options_;
  const TcpWorkerAdmission admission_;
  int port_ = 0;
  std::string local_name_;
  std::unique_ptr<TcpAdmission> loop_;
  std::atomic<size_t> open_{0};  // admitted connections whose descriptor is still open
  Mutex mu_;
  std::vector<Connection> connections_ GUARDED_BY(mu_);
  bool stopped_ GUARDED_BY(mu_) = false;
};

}  // namespace trellis::link
