// Small network helpers: free ports for tests and local runs, host:port parsing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include <string_view>

#include "common/base/status.h"

namespace trellis {

struct HostPort {
  std::string host;
  int port = 0;
  std::string ToString() const;  // "127.0.0.1:5000", "[::1]:5000"
};

// Parses "host:port" or "[v6addr]:port". Errors name the input: "bad address 'x': ...".
StatusOr<HostPort> ParseHostPort(std::string_view text);

// A TCP port on `host` that was free a moment ago (bind to port 0, read it back, close).
// Another process may take it before the caller binds: prefer binding to port 0 directly where
// the caller owns the socket.
StatusOr<int> PickFreePort(const std::string& host = "127.0.0.1");
// `n` distinct such ports, all held at once while they are picked: picked one after another,
// the kernel may hand the same free port out twice (two programs of one job then collide).
StatusOr<std::vector<int>> PickFreePorts(const std::string& host, size_t n);

// A listening TCP socket (SOCK_CLOEXEC, SO_REUSEADDR, backlog 128) on host:port; port 0 picks
// one, written to *bound_port. An empty host means every address. `before_bind` (optional) may
// set socket options that must precede bind/listen (e.g. buffer sizes).
StatusOr<int> ListenTcp(const std::string& host, int port, int* bound_port,
                        const std::function<void(int fd)>& before_bind = {});

}  // namespace trellis
