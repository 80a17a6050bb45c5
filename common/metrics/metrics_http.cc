#include "common/metrics/metrics_http.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <strings.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <vector>

#include "common/base/net.h"

namespace trellis {
namespace {

using Clock = std::chrono::steady_clock;
// Each client gets at most this from its accept to its answer sent; a slow or silent client costs
// only a slot, never the other clients' time (they are served side by side).
constexpr auto kClientTimeout = std::chrono::seconds(5);
constexpr size_t kMaxRequest = 16 * 1024;
// Clients at once; a new one beyond this pushes out the oldest (the slowest) one.
constexpr size_t kMaxClients = 64;

int MillisLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left) + 1;
}

std::string Response(int code, const char* reason, const char* type, const std::string& body, bool head) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
                  "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  if (!head) r += body;
  return r;
}

// The Host header's value, trimmed ("" when there is none or it is not a plain host[:port]).
std::string HostHeader(const std::string& req) {
  size_t at = 0;
  while ((at = req.find("\r\n", at)) != std::string::npos) {
    at += 2;
    if (req.size() - at < 5 || strncasecmp(req.c_str() + at, "host:", 5) != 0) continue;
    const size_t end = req.find("\r\n", at);
    std::string v = req.substr(at + 5, end == std::string::npos ? std::string::npos : end - at - 5);
    v.erase(0, v.find_first_not_of(" \t"));
    v.erase(v.find_last_not_of(" \t") + 1);
    // Echoed into JSON by the routes: only what a host and port may hold.
    const bool plain = v.size() <= 255 && std::all_of(v.begin(), v.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' || c == '[' || c == ']';
    });
    return plain ? v : std::string();
  }
  return "";
}

}  // namespace

StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& host, int port,
                                                                       const MetricsRegistry& metrics,
                                                                       std::function<bool()> healthy,
                                                                       std::vector<HttpRoute> routes) {
  if (port < 0 || port > 65535) {
    return InvalidArgumentError("metrics port: want 0..65535, got " + std::to_string(port));
  }
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer(metrics, std::move(healthy), std::move(routes)));
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

// One client: its request as it arrives, then its answer as the socket takes it.
struct MetricsHttpServer::Client {
  int fd = -1;  // owned
  Clock::time_point deadline;
  std::string in;
  std::string out;
  size_t sent = 0;
  bool answering = false;
};

void MetricsHttpServer::Loop() {
  std::vector<Client> clients;  // oldest first
  std::vector<pollfd> p;
  auto drop = [&](size_t i) {
    ::close(clients[i].fd);
    clients.erase(clients.begin() + static_cast<std::ptrdiff_t>(i));
  };
  while (true) {
    p.clear();
    p.push_back({stop_fd_, POLLIN, 0});
    p.push_back({listen_fd_, POLLIN, 0});
    Clock::time_point next = Clock::time_point::max();
    for (const Client& c : clients) {
      p.push_back({c.fd, static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
      next = std::min(next, c.deadline);
    }
    const int timeout = next == Clock::time_point::max() ? -1 : MillisLeft(next);
    if (::poll(p.data(), p.size(), timeout) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[0].revents & POLLIN) break;
    // Serve in reverse so that dropping a client does not shift the ones still to look at.
    const auto now = Clock::now();
    for (size_t i = clients.size(); i-- > 0;) {
      const short ev = p[i + 2].revents;
      if (ev != 0 && !Step(&clients[i], ev)) {
        drop(i);
      } else if (now >= clients[i].deadline) {
        drop(i);  // too slow: its time is up
      }
    }
    if (p[1].revents & POLLIN) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {  // else: the client gave up, or out of descriptors for a moment
        if (clients.size() >= kMaxClients) drop(0);
        Client c;
        c.fd = fd;
        c.deadline = Clock::now() + kClientTimeout;
        clients.push_back(std::move(c));
      }
    }
  }
  for (Client& c : clients) ::close(c.fd);
}

bool MetricsHttpServer::Step(Client* c, short events) {
  if (c->answering) {
    if ((events & (POLLOUT | POLLERR | POLLHUP)) == 0) return true;
    ssize_t n = ::send(c->fd, c->out.data() + c->sent, c->out.size() - c->sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    c->sent += static_cast<size_t>(n);
    return c->sent < c->out.size();  // done: the connection closes (Connection: close)
  }
  char buf[2048];
  ssize_t n = ::recv(c->fd, buf, sizeof buf, 0);
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  if (n == 0) return false;
  c->in.append(buf, static_cast<size_t>(n));
  if (c->in.find("\r\n\r\n") == std::string::npos) return c->in.size() <= kMaxRequest;
  c->out = Answer(c->in);
  c->answering = true;
  return true;
}

std::string MetricsHttpServer::Answer(const std::string& req) const {
  // Request line: METHOD SP target SP version. Only the path matters; a query is ignored.
  const size_t sp1 = req.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : req.find(' ', sp1 + 1);
  if (sp2 == std::string::npos) return Response(400, "Bad Request", "text/plain", "bad request\n", false);
  const std::string method = req.substr(0, sp1);
  std::string path = req.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  const bool head = method == "HEAD";
  if (method != "GET" && !head) return Response(405, "Method Not Allowed", "text/plain", "GET only\n", false);
  if (path == "/metrics") {
    return Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", metrics_.Serialize(), head);
  }
  if (path == "/healthz") {
    const bool ok = !healthy_ || healthy_();
    return ok ? Response(200, "OK", "text/plain", "ok\n", head)
              : Response(503, "Service Unavailable", "text/plain", "not healthy\n", head);
  }
  for (const auto& r : routes_) {
    if (path == r.path) return Response(200, "OK", r.content_type.c_str(), r.body(HostHeader(req)), head);
  }
  return Response(404, "Not Found", "text/plain", "not found: try /metrics or /healthz\n", head);
}

}  // namespace trellis
