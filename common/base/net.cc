#include "common/base/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <vector>

namespace trellis {

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

StatusOr<HostPort> ParseHostPort(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("bad address '" + std::string(text) + "': " + why);
  };
  HostPort hp;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("missing ']'");
    hp.host = std::string(text.substr(1, close - 1));
    if (close + 1 >= text.size() || text[close + 1] != ':') return bad("expected host:port");
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("expected host:port");
    hp.host = std::string(text.substr(0, colon));
    if (hp.host.find(':') != std::string::npos) return bad("IPv6 addresses need brackets: [addr]:port");
    port_text = text.substr(colon + 1);
  }
  if (hp.host.empty()) return bad("empty host");
  int port = 0;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || ptr != port_text.data() + port_text.size()) {
    return bad("port is not a number");
  }
  if (port < 1 || port > 65535) return bad("port must be in 1..65535");
  hp.port = port;
  return hp;
}

namespace {
// The sockets PickFreePorts holds, closed when it returns (however it returns).
struct HeldSockets {
  std::vector<int> fds;
  ~HeldSockets() {
    for (int fd : fds) ::close(fd);
  }
};
}  // namespace

StatusOr<std::vector<int>> PickFreePorts(const std::string& host, size_t n) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return InvalidArgumentError("PickFreePort: not an IPv4 address: " + host);
  }
  HeldSockets held;  // every socket stays bound until all ports are read
  std::vector<int> ports;
  for (size_t i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return InternalError(std::string("socket: ") + strerror(errno));
    held.fds.push_back(fd);
    sockaddr_in a = addr;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      return UnavailableError("bind " + host + ":0: " + strerror(errno));
    }
    socklen_t len = sizeof(a);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return InternalError(std::string("getsockname: ") + strerror(errno));
    }
    ports.push_back(static_cast<int>(ntohs(a.sin_port)));
  }
  return ports;
}

StatusOr<int> PickFreePort(const std::string& host) {
  TRELLIS_ASSIGN_OR_RETURN(std::vector<int> ports, PickFreePorts(host, 1));
  return ports[0];
}

StatusOr<int> ListenTcp(const std::string& host, int port, int* bound_port,
                        const std::function<void(int fd)>& before_bind) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    return InvalidArgumentError("cannot resolve listen host '" + host + "': " + gai_strerror(rc));
  }
  std::string last = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last = std::string("socket: ") + strerror(errno);
      continue;
    }
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (before_bind) before_bind(fd);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      last = std::string("bind/listen: ") + strerror(errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    *bound_port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                                 : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return UnavailableError("cannot listen on " + host + ":" + service + ": " + last);
}

}  // namespace trellis
