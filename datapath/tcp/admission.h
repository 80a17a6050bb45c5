// What a TCP data connection costs the parameter server before its hello (issue 16 §1): no
// thread, bounded memory and time. One loop ("pserver-tcp-acc", epoll) accepts, runs the mutual
// TLS handshake when TLS is on and reads the hello, all without blocking; a connection without a
// whole hello `hello_timeout_ms` after its accept is closed. Pending (pre-hello) and total
// connections are capped; a connection over a cap is closed at once. Every refusal is logged,
// at most one line a second per kind (the next line counts the ones left out). A hello that
// passes `check` is handed to `admit` with its descriptor; nothing else ever gets a thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "common/tls/tls.h"
#include "common/tls/tls_stream.h"
#include "datapath/tcp/wire.h"

namespace trellis {

struct TcpAdmissionLimits {
  int64_t hello_timeout_ms = 10000;  // from accept to a whole hello (TLS handshake included)
  int max_pending = 512;             // connections before their hello
  int max_connections = 4096;        // all connections, pending or admitted
};

// A connection whose hello passed: its descriptor (blocking when plaintext; non-blocking under
// TLS, which TlsStream requires), the TLS stream when TLS is on, the worker's rank.
struct AdmittedConnection {
  int fd = -1;
  std::unique_ptr<TlsStream> tls;
  int32_t rank = -1;
  std::string peer;
};

class TcpAdmission {
 public:
  struct Hooks {
    // Token and rank; a refusal is sent to the peer as an error frame, then it is closed.
    std::function<Status(const tcpwire::Hello&)> check;
    // Takes the connection (its descriptor included, even when it cannot serve it). Loop thread.
    std::function<void(AdmittedConnection)> admit;
    // Admitted connections still open (counted against max_connections).
    std::function<size_t()> admitted;
    // Runs on the loop thread after Wake() (the owner reaps ended connections there).
    std::function<void()> on_wake;
  };

  // Takes the listening descriptors (the TCP port's and the local socket's; closed by the
  // destructor, also when Start fails): one loop admits from all of them under one set of caps.
  // `tls`: handshake first; nullptr: plaintext.
  static StatusOr<std::unique_ptr<TcpAdmission>> Start(std::vector<int> listen_fds,
                                                       TcpAdmissionLimits limits, TlsPtr tls,
                                                       Hooks hooks);
  ~TcpAdmission();  // Stop(), then closes its descriptors

  void Wake();  // thread-safe: on_wake soon, on the loop thread
  // Stops accepting, closes every pending connection and joins the loop; idempotent.
  void Stop() EXCLUDES(mu_);

 private:
  struct Pending;
  // At most one line a second of each kind under a flood.
  struct LogLimit {
    int64_t last_ms = -1000000;
    int64_t left_out = 0;
    bool Allow(int64_t now_ms);  // false: counted in left_out
  };

  TcpAdmission(std::vector<int> listen_fds, TcpAdmissionLimits limits, TlsPtr tls, Hooks hooks);
  void Loop();
  bool IsListener(int fd) const;
  void Accept(int listen_fd, int64_t now);
  void WatchListeners(uint32_t events);  // EPOLLIN, or 0 while accepting is paused
  void Progress(int fd);                   // handshake / hello bytes as far as they go
  void Refuse(int fd, const Status& why);  // error frame, FIN, close
  void Close(int fd);                      // drops a pending connection
  void Watch(Pending& p, uint32_t events);  // epoll interest of a pending connection
  void Log(LogLimit& limit, const std::string& line);

  const std::vector<int> listen_fds_;
  const TcpAdmissionLimits limits_;
  const TlsPtr tls_;
  const Hooks hooks_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread loop_;
  Mutex mu_;
  bool stopped_ GUARDED_BY(mu_) = false;

  // Owned by the loop thread.
  std::unordered_map<int, std::unique_ptr<Pending>> pending_;  // by descriptor
  // Deadlines in accept order, which is deadline order: (deadline, fd, serial of that fd's
  // Pending, so a reused descriptor is not mistaken for the one that expired).
  struct Due {
    int64_t at_ms;
    int fd;
    uint64_t serial;
  };
  std::deque<Due> due_;
  uint64_t next_serial_ = 0;
  int64_t accept_paused_until_ms_ = 0;  // out of descriptors: accept again after this
  LogLimit cap_log_, deadline_log_, refused_log_, resource_log_;
};

}  // namespace trellis
