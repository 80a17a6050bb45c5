#include "operator/operator_metrics.h"

#include <set>

namespace trellis::op {
namespace {

// Only these phases are labels (bounded); anything else is not counted.
const std::set<std::string>& Phases() {
  static const std::set<std::string> kPhases = {"Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"};
  return kPhases;
}

void Advance(prometheus::Counter& c, uint64_t total) {
  const double delta = static_cast<double>(total) - c.Value();
  if (delta > 0) c.Increment(delta);
}

}  // namespace

OperatorMetrics::OperatorMetrics(MetricsRegistry& registry)
    : registry_(registry),
      reconcile_seconds_(registry.Histogram("trellis_operator_reconcile_duration_seconds",
                                            "Time of one reconcile of one TrainingJob",
                                            MetricsRegistry::LatencyBuckets())),
      api_errors_(registry.Counter("trellis_operator_api_errors_total", "Kubernetes API requests that failed")),
      watch_restarts_(registry.Counter("trellis_operator_watch_restarts_total",
                                       "Watches reopened after a break or 410 Gone")),
      reconciles_(registry.Counter("trellis_operator_reconciles_total", "Reconciles of one TrainingJob")) {
  for (const auto& p : Phases()) Jobs(p);
}

prometheus::Gauge& OperatorMetrics::Jobs(const std::string& phase) {
  return registry_.Gauge("trellis_operator_jobs", "TrainingJobs by phase, as this operator last wrote them",
                         {{"phase", phase}});
}

void OperatorMetrics::ObserveReconcile(double seconds) { reconcile_seconds_.Observe(seconds); }

void OperatorMetrics::SetJobPhase(const std::string& job, const std::string& phase) {
  MutexLock lock(&mu_);
  auto it = phases_.find(job);
  const std::string old = it == phases_.end() ? "" : it->second;
  if (old == phase) return;
  if (Phases().count(old)) Jobs(old).Decrement();
  if (Phases().count(phase)) Jobs(phase).Increment();
  if (phase.empty()) {
    phases_.erase(job);
  } else {
    phases_[job] = phase;
  }
}

void OperatorMetrics::SetApiErrors(uint64_t n) { Advance(api_errors_, n); }
void OperatorMetrics::SetWatchRestarts(uint64_t n) { Advance(watch_restarts_, n); }
void OperatorMetrics::SetReconciles(uint64_t n) { Advance(reconciles_, n); }

void OperatorMetrics::SetApiRequests(const std::map<std::pair<std::string, std::string>, uint64_t>& counts) {
  for (const auto& [key, n] : counts) {
    Advance(registry_.Counter("trellis_operator_api_requests_total",
                              "Kubernetes API requests made, by verb (as the API server counts them) and resource",
                              {{"verb", key.first}, {"resource", key.second}}),
            n);
  }
}

}  // namespace trellis::op
