// /metrics (Prometheus text format) and /healthz for the operator, over cpprestsdk's listener.
// Every metric family is registered once here, at start-up.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <string>

#include <cpprest/http_listener.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "common/status.h"

namespace trellis::op {

class OperatorMetrics {
 public:
  OperatorMetrics();
  prometheus::Registry& registry() { return *registry_; }
  void ObserveReconcile(double seconds);
  // The phase of a job ("namespace/name") now; "" when it is gone. trellis_operator_jobs counts
  // the jobs this operator has reconciled by their current phase.
  void SetJobPhase(const std::string& job, const std::string& phase);
  // Sampled at scrape time from the client and controller counters.
  void SetApiErrors(uint64_t n);
  void SetWatchRestarts(uint64_t n);
  void SetReconciles(uint64_t n);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Histogram* reconcile_seconds_ = nullptr;
  prometheus::Family<prometheus::Gauge>* jobs_ = nullptr;
  std::mutex mu_;
  std::map<std::string, std::string> phases_;  // GUARDED_BY(mu_): job -> phase
  // Counters mirror totals kept elsewhere: advanced by the difference at scrape time.
  prometheus::Counter* api_errors_ = nullptr;
  prometheus::Counter* watch_restarts_ = nullptr;
  prometheus::Counter* reconciles_ = nullptr;
};

// Serves GET /metrics and GET /healthz (200 when `healthy()`, else 503) on host:port.
class MetricsServer {
 public:
  static StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& host, int port, OperatorMetrics& metrics,
                                                         std::function<void()> before_scrape,
                                                         std::function<bool()> healthy);
  ~MetricsServer();

 private:
  MetricsServer() = default;
  std::unique_ptr<web::http::experimental::listener::http_listener> listener_;
};

}  // namespace trellis::op
