#include "datapath/tcp/admission.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <system_error>
#include <vector>

#include "common/base/logging.h"

namespace trellis {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string PeerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  } else if (ss.ss_family == AF_UNIX) {
    // The local socket: the peer has no address; its process id names it.
    ucred cred{};
    socklen_t clen = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) return "local socket";
    return "local socket, pid " + std::to_string(cred.pid);
  }
  return std::string(host) + ":" + std::to_string(port);
}

}  // namespace

struct TcpAdmission::Pending {
  int fd = -1;
  uint64_t serial = 0;
  std::string peer;
  std::unique_ptr<TlsStream> tls;  // set when TLS is on
  bool handshaking = false;        // TLS handshake not finished yet
  uint32_t events = 0;             // epoll interest now
  std::vector<uint8_t> hello;      // the bytes so far
  size_t need = tcpwire::kHelloFixedBytes;
};

bool TcpAdmission::LogLimit::Allow(int64_t now_ms) {
  if (now_ms - last_ms < 1000) {
    ++left_out;
    return false;
  }
  last_ms = now_ms;
  return true;
}

void TcpAdmission::Log(LogLimit& limit, const std::string& line) {
  const int64_t left_out = limit.left_out;
  if (!limit.Allow(NowMs())) return;
  limit.left_out = 0;
  if (left_out > 0) {
    TLOG_WARN << line << " (and " << left_out << " more like it since the last such line)";
  } else {
    TLOG_WARN << line;
  }
}

TcpAdmission::TcpAdmission(std::vector<int> listen_fds, TcpAdmissionLimits limits, TlsPtr tls,
                           Hooks hooks)
    : listen_fds_(std::move(listen_fds)),
      limits_(limits),
      tls_(std::move(tls)),
      hooks_(std::move(hooks)) {}

StatusOr<std::unique_ptr<TcpAdmission>> TcpAdmission::Start(std::vector<int> listen_fds,
                                                            TcpAdmissionLimits limits,
                                                            TlsPtr tls, Hooks hooks) {
  std::unique_ptr<TcpAdmission> a(
      new TcpAdmission(std::move(listen_fds), limits, std::move(tls), std::move(hooks)));
  if (limits.max_pending < 1 || limits.max_connections < 1 || limits.hello_timeout_ms < 1) {
    return InvalidArgumentError(
        "tcp listener: max_pending, max_connections and hello_timeout_ms must be >= 1");
  }
  for (int fd : a->listen_fds_) {
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
      return UnavailableError(std::string("tcp listener: fcntl: ") + std::strerror(errno));
    }
  }
  a->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  a->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (a->epoll_fd_ < 0 || a->wake_fd_ < 0) {
    return UnavailableError(std::string("tcp listener: ") + std::strerror(errno));
  }
  std::vector<int> watched = a->listen_fds_;
  watched.push_back(a->wake_fd_);
  for (int fd : watched) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(a->epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return UnavailableError(std::string("tcp listener: epoll_ctl: ") + std::strerror(errno));
    }
  }
  TcpAdmission* raw = a.get();
  try {
    a->loop_ = std::thread([raw] {
      pthread_setname_np(pthread_self(), "pserver-tcp-acc");
      raw->Loop();
    });
  } catch (const std::system_error& e) {
    return UnavailableError(std::string("tcp listener: no thread: ") + e.what());
  }
  return a;
}

TcpAdmission::~TcpAdmission() {
  Stop();
  for (int fd : listen_fds_) ::close(fd);
  for (int fd : {epoll_fd_, wake_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

void TcpAdmission::Wake() {
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

void TcpAdmission::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  Wake();
  if (loop_.joinable()) loop_.join();
  // No more connections complete into the backlog (Linux: a listening socket stops listening).
  for (int fd : listen_fds_) ::shutdown(fd, SHUT_RDWR);
  // Connections already queued: a TCP listener's shutdown resets them, a Unix one's does not
  // (its peers would wait out their handshake timeout). Accept and close what is left.
  for (int listen_fd : listen_fds_) {
    int fd;
    while ((fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC)) >= 0 || errno == EINTR) {
      if (fd >= 0) ::close(fd);
    }
  }
}

bool TcpAdmission::IsListener(int fd) const {
  return std::find(listen_fds_.begin(), listen_fds_.end(), fd) != listen_fds_.end();
}

void TcpAdmission::WatchListeners(uint32_t events) {
  for (int fd : listen_fds_) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    (void)epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
  }
}

void TcpAdmission::Loop() {
  epoll_event events[64];
  while (true) {
    int64_t now = NowMs();
    // Deadlines come in accept order; entries of connections already gone are dropped here.
    while (!due_.empty()) {
      auto it = pending_.find(due_.front().fd);
      if (it != pending_.end() && it->second->serial == due_.front().serial) break;
      due_.pop_front();
    }
    int64_t wait = due_.empty() ? -1 : std::max<int64_t>(0, due_.front().at_ms - now);
    if (accept_paused_until_ms_ > 0) {
      const int64_t resume = std::max<int64_t>(0, accept_paused_until_ms_ - now);
      wait = wait < 0 ? resume : std::min(wait, resume);
    }
    const int n = epoll_wait(epoll_fd_, events, 64, static_cast<int>(std::min<int64_t>(wait, INT_MAX)));
    if (n < 0 && errno != EINTR) {
      TLOG_ERROR << "tcp listener: epoll_wait: " << std::strerror(errno);
      poll(nullptr, 0, 100);
    }
    now = NowMs();
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) {
        uint64_t v;
        (void)!::read(wake_fd_, &v, sizeof v);
        {
          MutexLock lock(&mu_);
          if (stopped_) {
            std::vector<int> fds;
            for (const auto& [pfd, p] : pending_) fds.push_back(pfd);
            for (int pfd : fds) Close(pfd);
            return;
          }
        }
        if (hooks_.on_wake) hooks_.on_wake();
      } else if (IsListener(fd)) {
        Accept(fd, now);
      } else if (pending_.count(fd) != 0) {
        Progress(fd);
      }
    }
    if (accept_paused_until_ms_ > 0 && now >= accept_paused_until_ms_) {
      accept_paused_until_ms_ = 0;
      WatchListeners(EPOLLIN);
    }
    while (!due_.empty() && due_.front().at_ms <= now) {
      const Due d = due_.front();
      due_.pop_front();
      auto it = pending_.find(d.fd);
      if (it == pending_.end() || it->second->serial != d.serial) continue;
      const Pending& p = *it->second;
      Log(deadline_log_, "closing data connection from " + p.peer + ": no whole hello within " +
                             std::to_string(limits_.hello_timeout_ms) + " ms (" +
                             (p.handshaking ? std::string("TLS handshake unfinished")
                                            : std::to_string(p.hello.size()) + " of " +
                                                  std::to_string(p.need) + " bytes") +
                             ")");
      Close(d.fd);
    }
  }
}

void TcpAdmission::Accept(int listen_fd, int64_t now) {
  while (true) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // Out of descriptors or memory: the peers wait in the backlog; accepting again right away
      // would spin (the listener stays readable).
      Log(resource_log_, std::string("tcp listener: accept: ") + std::strerror(errno) +
                             "; accepting again in 100 ms");
      WatchListeners(0);
      accept_paused_until_ms_ = now + 100;
      return;
    }
    const size_t admitted = hooks_.admitted ? hooks_.admitted() : 0;
    std::string why;
    if (pending_.size() >= static_cast<size_t>(limits_.max_pending)) {
      why = std::to_string(pending_.size()) + " connections wait for their hello (cap " +
            std::to_string(limits_.max_pending) + ")";
    } else if (pending_.size() + admitted >= static_cast<size_t>(limits_.max_connections)) {
      why = std::to_string(pending_.size() + admitted) + " data connections open (cap " +
            std::to_string(limits_.max_connections) + ")";
    }
    if (!why.empty()) {
      Log(cap_log_, "refusing data connection from " + PeerName(fd) + ": " + why);
      ::close(fd);
      continue;
    }
    auto p = std::make_unique<Pending>();
    p->fd = fd;
    p->serial = next_serial_++;
    p->peer = PeerName(fd);
    if (tls_) {
      auto s = TlsStream::Begin(*tls_->server_ctx, fd);
      if (!s.ok()) {
        Log(resource_log_, "refusing data connection from " + p->peer + ": " +
                               s.status().ToString());
        ::close(fd);
        continue;
      }
      p->tls = std::move(*s);
      p->handshaking = true;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      Log(resource_log_, "refusing data connection from " + p->peer + ": epoll_ctl: " +
                             std::strerror(errno));
      ::close(fd);
      continue;
    }
    p->events = EPOLLIN;
    due_.push_back({now + limits_.hello_timeout_ms, fd, p->serial});
    pending_[fd] = std::move(p);
  }
}

void TcpAdmission::Watch(Pending& p, uint32_t events) {
  if (p.events == events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = p.fd;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, p.fd, &ev) == 0) p.events = events;
}

void TcpAdmission::Progress(int fd) {
  Pending& p = *pending_.at(fd);
  if (p.handshaking) {
    short wait = 0;
    Status st = p.tls->Continue(&wait);
    if (!st.ok()) {
      Log(refused_log_, "refusing data connection from " + p.peer + ": " + st.ToString());
      Close(fd);
      return;
    }
    if (wait != 0) {
      Watch(p, wait == POLLOUT ? EPOLLOUT : EPOLLIN);
      return;
    }
    p.handshaking = false;
    Watch(p, EPOLLIN);  // the hello may already be inside the TLS stream: read on
  }
  while (p.hello.size() < p.need) {
    uint8_t buf[tcpwire::kHelloFixedBytes + tcpwire::kMaxTokenBytes];
    const size_t want = p.need - p.hello.size();
    size_t got = 0;
    Status st;
    if (p.tls) {
      st = p.tls->Read(buf, want, /*wait=*/false, &got);
    } else {
      // Exactly what the hello still lacks: whatever follows it stays in the socket for the
      // connection's reader.
      const ssize_t r = recv(fd, buf, want, MSG_DONTWAIT);
      if (r > 0) {
        got = static_cast<size_t>(r);
      } else if (r == 0) {
        st = UnavailableError("connection closed by the peer");
      } else if (errno == EINTR) {
        continue;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        st = UnavailableError(std::string("recv: ") + std::strerror(errno));
      }
    }
    if (!st.ok()) {
      // A peer that connects and leaves without a byte (a port probe) is not worth a line.
      if (!p.hello.empty()) {
        Log(refused_log_, "closing data connection from " + p.peer + ": " + st.message() +
                              " after " + std::to_string(p.hello.size()) + " of " +
                              std::to_string(p.need) + " hello bytes");
      }
      Close(fd);
      return;
    }
    if (got == 0) return;  // the rest later (or the deadline)
    p.hello.insert(p.hello.end(), buf, buf + got);
    if (p.hello.size() == tcpwire::kHelloFixedBytes) {
      uint32_t token_bytes = 0;
      if (Status fixed = tcpwire::CheckHelloFixed(p.hello.data(), &token_bytes); !fixed.ok()) {
        Refuse(fd, fixed);
        return;
      }
      p.need += token_bytes;
    }
  }
  tcpwire::Hello hello;
  Status st = tcpwire::DecodeHello(p.hello.data(), p.hello.size(), &hello);
  if (st.ok() && hooks_.check) st = hooks_.check(hello);
  if (!st.ok()) {
    Refuse(fd, st);
    return;
  }
  AdmittedConnection c;
  c.fd = fd;
  c.tls = std::move(p.tls);
  c.rank = hello.rank;
  c.peer = p.peer;
  (void)epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  pending_.erase(fd);
  // Plaintext connections are served with blocking calls; a TLS stream wants its socket
  // non-blocking (it waits with poll itself).
  if (!c.tls) (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  hooks_.admit(std::move(c));
}

void TcpAdmission::Refuse(int fd, const Status& why) {
  Pending& p = *pending_.at(fd);
  Log(refused_log_, "refusing data connection from " + p.peer + ": " + why.ToString());
  std::vector<uint8_t> frame = wire::EncodeStatusFrame(static_cast<wire::Op>(0), 0, why);
  // A few hundred bytes into a fresh socket's send buffer: neither call waits on the peer.
  if (p.tls) {
    iovec iov{frame.data(), frame.size()};
    (void)p.tls->WriteAll(&iov, 1);
  } else {
    (void)!send(fd, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  // FIN after the verdict, and what the peer sent beyond its hello read away: closing with
  // unread bytes would reset the connection and could cost the peer the verdict.
  ::shutdown(fd, SHUT_WR);
  char sink[4096];
  for (int i = 0; i < 16 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
  }
  Close(fd);
}

void TcpAdmission::Close(int fd) {
  auto it = pending_.find(fd);
  if (it == pending_.end()) return;
  (void)epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  pending_.erase(it);  // the TLS stream first: it never closes the descriptor itself
  ::close(fd);
}

}  // namespace trellis
