// GET /metrics (text format 0.0.4) and /healthz (200 "ok", or 503 when `healthy` says no) for a
// MetricsRegistry, plus the routes a process adds (the operator's /sd/targets). A deliberately tiny HTTP/1.1 server on one named thread ("trellis-metrics"):
// one request per connection; the clients of the moment are served side by side by one poll
// loop, each within 5 s of its accept (then dropped), at most 64 at once (a new one pushes out
// the oldest), so slow or silent clients cannot hold up a scrape. A scrape costs nothing between
// scrapes and stopping is immediate.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics/metrics.h"
#include "common/base/status.h"

namespace trellis {

// A further GET path. `body` gets the request's Host header ("" when absent) and must answer from
// memory: it runs on the server's one thread, between scrapes.
struct HttpRoute {
  std::string path;
  std::string content_type;
  std::function<std::string(const std::string& host)> body;
};

class MetricsHttpServer {
 public:
  // Serves on host:port (port 0: the kernel picks one; see port(); an empty host: every
  // address). `metrics` must outlive the server. `healthy` is called per /healthz request;
  // empty means always healthy.
  static StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, int port,
                                                            const MetricsRegistry& metrics,
                                                            std::function<bool()> healthy = {},
                                                            std::vector<HttpRoute> routes = {});
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttpServer(const MetricsRegistry& metrics, std::function<bool()> healthy, std::vector<HttpRoute> routes)
      : metrics_(metrics), healthy_(std::move(healthy)), routes_(std::move(routes)) {}
  struct Client;
  void Loop();
  // Reads or writes what `events` allows; false when the client is done or gone.
  bool Step(Client* c, short events);
  std::string Answer(const std::string& request) const;

  const MetricsRegistry& metrics_;
  const std::function<bool()> healthy_;
  const std::vector<HttpRoute> routes_;
  int listen_fd_ = -1;  // owned
  int stop_fd_ = -1;    // owned eventfd: written once to stop Loop
  int port_ = 0;
  std::thread thread_;
};

}  // namespace trellis
