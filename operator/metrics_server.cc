#include "operator/metrics_server.h"

#include <exception>
#include <set>

#include <prometheus/text_serializer.h>

namespace trellis::op {

OperatorMetrics::OperatorMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  reconcile_seconds_ = &prometheus::BuildHistogram()
                            .Name("trellis_operator_reconcile_duration_seconds")
                            .Help("Time of one reconcile of one TrainingJob")
                            .Register(*registry_)
                            .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5});
  jobs_ = &prometheus::BuildGauge()
               .Name("trellis_operator_jobs")
               .Help("TrainingJobs by phase, as this operator last wrote them")
               .Register(*registry_);
  for (const char* p : {"Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"}) {
    jobs_->Add({{"phase", p}});
  }
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_).Add({});
  };
  api_errors_ = counter("trellis_operator_api_errors_total", "Kubernetes API requests that failed");
  watch_restarts_ = counter("trellis_operator_watch_restarts_total", "Watches reopened after a break or 410 Gone");
  reconciles_ = counter("trellis_operator_reconciles_total", "Reconciles of one TrainingJob");
}

namespace {
void Advance(prometheus::Counter* c, uint64_t total) {
  const double delta = static_cast<double>(total) - c->Value();
  if (delta > 0) c->Increment(delta);
}
}  // namespace

void OperatorMetrics::ObserveReconcile(double seconds) { reconcile_seconds_->Observe(seconds); }

void OperatorMetrics::SetJobPhase(const std::string& job, const std::string& phase) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = phases_.find(job);
  const std::string old = it == phases_.end() ? "" : it->second;
  if (old == phase) return;
  // Only the six phases are labels (bounded); anything else is not counted.
  static const std::set<std::string> kPhases = {"Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"};
  if (kPhases.count(old)) jobs_->Add({{"phase", old}}).Decrement();
  if (kPhases.count(phase)) jobs_->Add({{"phase", phase}}).Increment();
  if (phase.empty()) {
    phases_.erase(job);
  } else {
    phases_[job] = phase;
  }
}

void OperatorMetrics::SetApiErrors(uint64_t n) { Advance(api_errors_, n); }
void OperatorMetrics::SetWatchRestarts(uint64_t n) { Advance(watch_restarts_, n); }
void OperatorMetrics::SetReconciles(uint64_t n) { Advance(reconciles_, n); }

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& host, int port,
                                                              OperatorMetrics& metrics,
                                                              std::function<void()> before_scrape,
                                                              std::function<bool()> healthy) {
  using web::http::http_request;
  using web::http::status_codes;
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  try {
    s->listener_ = std::make_unique<web::http::experimental::listener::http_listener>(
        "http://" + host + ":" + std::to_string(port));
    s->listener_->support(web::http::methods::GET, [&metrics, before_scrape, healthy](http_request req) {
      const std::string path = req.relative_uri().path();
      if (path == "/healthz") {
        const bool ok = healthy ? healthy() : true;
        req.reply(ok ? status_codes::OK : status_codes::ServiceUnavailable, ok ? "ok\n" : "not synced\n");
      } else if (path == "/metrics") {
        if (before_scrape) before_scrape();
        req.reply(status_codes::OK, prometheus::TextSerializer().Serialize(metrics.registry().Collect()),
                  "text/plain; version=0.0.4");
      } else {
        req.reply(status_codes::NotFound, "not found\n");
      }
    });
    s->listener_->open().wait();
  } catch (const std::exception& e) {
    return UnavailableError("cannot serve /metrics on " + host + ":" + std::to_string(port) + ": " + e.what());
  }
  return s;
}

MetricsServer::~MetricsServer() {
  try {
    if (listener_) listener_->close().wait();
  } catch (const std::exception&) {
  }
}

}  // namespace trellis::op
