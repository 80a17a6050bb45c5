// A TCP relay on 127.0.0.1 whose worker-to-server direction can be held: while held, nothing the
// worker sends reaches the server, so the worker's socket fills and its sends block, exactly as
// on a slow link whose queue is full; Release() lets everything through. Holding makes "what is
// already on the wire" and "what still waits in the worker's queue" deterministic, without
// timing. The relay's receive buffer is small, so little gets past a hold.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/base/status.h"
#include "datapath/tcp/wire.h"

namespace trellis::testing {

class HeldLink {
 public:
  // Relays every connection made to port() to 127.0.0.1:target_port.
  static StatusOr<std::unique_ptr<HeldLink>> Start(int target_port) {
    std::unique_ptr<HeldLink> l(new HeldLink(target_port));
    TRELLIS_ASSIGN_OR_RETURN(l->listen_fd_, tcpwire::Listen("127.0.0.1", 0, &l->port_));
    int small = 32 << 10;  // inherited by accepted sockets
    setsockopt(l->listen_fd_, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    l->acceptor_ = std::thread([raw = l.get()] { raw->AcceptLoop(); });
    return l;
  }
  ~HeldLink() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    ::shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    ::close(listen_fd_);
    {
      std::lock_guard lock(mu_);
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : pipes_) t.join();
    for (int fd : fds_) ::close(fd);
  }

  int port() const { return port_; }
  void Hold() {
    std::lock_guard lock(mu_);
    held_ = true;
  }
  void Release() {
    {
      std::lock_guard lock(mu_);
      held_ = false;
    }
    cv_.notify_all();
  }

 private:
  explicit HeldLink(int target_port) : target_port_(target_port) {}

  void AcceptLoop() {
    while (true) {
      int worker = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (worker < 0) return;  // shut down
      auto server = tcpwire::Connect("127.0.0.1", target_port_, 10000);
      std::lock_guard lock(mu_);
      if (stopping_ || !server.ok()) {
        ::close(worker);
        if (server.ok()) ::close(*server);
        return;
      }
      fds_.push_back(worker);
      fds_.push_back(*server);
      pipes_.emplace_back([this, worker, s = *server] { Pipe(worker, s, /*holdable=*/true); });
      pipes_.emplace_back([this, worker, s = *server] { Pipe(s, worker, /*holdable=*/false); });
    }
  }

  void Pipe(int from, int to, bool holdable) {
    std::vector<char> buf(16 << 10);
    while (true) {
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !holdable || !held_; });
        if (stopping_) break;
      }
      ssize_t n = ::read(from, buf.data(), buf.size());
      if (n <= 0) break;
      iovec iov{buf.data(), static_cast<size_t>(n)};
      if (!tcpwire::SendAll(to, &iov, 1).ok()) break;
    }
    ::shutdown(to, SHUT_WR);
  }

  const int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;              // GUARDED_BY(mu_)
  bool stopping_ = false;          // GUARDED_BY(mu_)
  std::vector<int> fds_;           // GUARDED_BY(mu_)
  std::vector<std::thread> pipes_; // GUARDED_BY(mu_) while the acceptor runs
};

}  // namespace trellis::testing
