// The operator's metrics, registered once at start-up on the process's MetricsRegistry
// (role "operator", no job or rank: one operator watches many jobs). Served by
// common/metrics_http like every other process.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/base/mutex.h"
#include "common/metrics/metrics.h"

namespace trellis::op {

class OperatorMetrics {
 public:
  explicit OperatorMetrics(MetricsRegistry& registry);
  void ObserveReconcile(double seconds);
  // The phase of a job ("namespace/name") now; "" when it is gone. trellis_operator_jobs counts
  // the jobs this operator has reconciled by their current phase.
  void SetJobPhase(const std::string& job, const std::string& phase) EXCLUDES(mu_);
  // Sampled at scrape time from the client and controller counters.
  void SetApiErrors(uint64_t n);
  void SetWatchRestarts(uint64_t n);
  void SetReconciles(uint64_t n);
  // trellis_operator_api_requests_total{verb,resource}: KubeClient::RequestCounts().
  void SetApiRequests(const std::map<std::pair<std::string, std::string>, uint64_t>& counts);

 private:
  prometheus::Gauge& Jobs(const std::string& phase);  // trellis_operator_jobs{phase}

  MetricsRegistry& registry_;
  prometheus::Histogram& reconcile_seconds_;
  Mutex mu_;
  std::map<std::string, std::string> phases_ GUARDED_BY(mu_);  // job -> phase
  // Counters mirror totals kept elsewhere: advanced by the difference at scrape time.
  prometheus::Counter& api_errors_;
  prometheus::Counter& watch_restarts_;
  prometheus::Counter& reconciles_;
};

}  // namespace trellis::op
