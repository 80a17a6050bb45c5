#include "common/metrics_http.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "common/net.h"

namespace trellis {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kIoTimeout = std::chrono::seconds(5);  // a stuck client delays others at most this
constexpr size_t kMaxRequest = 16 * 1024;

int MillisLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

// Waits until `fd` is ready for `events`, the deadline passes or `stop_fd` fires.
bool WaitReady(int fd, short events, int stop_fd, Clock::time_point deadline) {
  pollfd p[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
  int n = ::poll(p, 2, MillisLeft(deadline));
  return n > 0 && (p[0].revents & (events | POLLHUP | POLLERR)) != 0 && (p[1].revents & POLLIN) == 0;
}

void SendAll(int fd, const std::string& data, int stop_fd, Clock::time_point deadline) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!WaitReady(fd, POLLOUT, stop_fd, deadline)) return;
    } else {
      return;
    }
  }
}

std::string Response(int code, const char* reason, const char* type, const std::string& body, bool head) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
                  "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  if (!head) r += body;
  return r;
}

}  // namespace

StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& host, int port,
                                                                       const MetricsRegistry& metrics,
                                                                       std::function<bool()> healthy) {
  if (port < 0 || port > 65535) {
    return InvalidArgumentError("metrics port: want 0..65535, got " + std::to_string(port));
  }
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer(metrics, std::move(healthy)));
  auto fd = ListenTcp(host, port, &s->port_);
  if (!fd.ok()) return fd.status().Annotate("cannot serve /metrics on " + host + ":" + std::to_string(port));
  s->listen_fd_ = *fd;
  s->stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->stop_fd_ < 0) return InternalError(std::string("eventfd: ") + std::strerror(errno));
  MetricsHttpServer* self = s.get();
  s->thread_ = std::thread([self] {
    pthread_setname_np(pthread_self(), "trellis-metrics");
    self->Loop();
  });
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof one);
    thread_.join();
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

void MetricsHttpServer::Loop() {
  while (true) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents & POLLIN) return;
    if ((p[0].revents & POLLIN) == 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;  // the client gave up, or out of descriptors for a moment
    Serve(fd);
    ::close(fd);
  }
}

void MetricsHttpServer::Serve(int fd) {
  const auto deadline = Clock::now() + kIoTimeout;
  std::string req;
  char buf[2048];
  while (req.find("\r\n\r\n") == std::string::npos) {
    if (req.size() > kMaxRequest || !WaitReady(fd, POLLIN, stop_fd_, deadline)) return;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return;
    req.append(buf, static_cast<size_t>(n));
  }
  // Request line: METHOD SP target SP version. Only the path matters; a query is ignored.
  const size_t sp1 = req.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : req.find(' ', sp1 + 1);
  if (sp2 == std::string::npos) {
    SendAll(fd, Response(400, "Bad Request", "text/plain", "bad request\n", false), stop_fd_, deadline);
    return;
  }
  const std::string method = req.substr(0, sp1);
  std::string path = req.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  const bool head = method == "HEAD";
  std::string out;
  if (method != "GET" && !head) {
    out = Response(405, "Method Not Allowed", "text/plain", "GET only\n", false);
  } else if (path == "/metrics") {
    out = Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", metrics_.Serialize(), head);
  } else if (path == "/healthz") {
    const bool ok = !healthy_ || healthy_();
    out = ok ? Response(200, "OK", "text/plain", "ok\n", head)
             : Response(503, "Service Unavailable", "text/plain", "not healthy\n", head);
  } else {
    out = Response(404, "Not Found", "text/plain", "not found: try /metrics or /healthz\n", head);
  }
  SendAll(fd, out, stop_fd_, deadline);
}

}  // namespace trellis
