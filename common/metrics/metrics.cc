#include "common/metrics/metrics.h"

#include <exception>
#include <type_traits>
#include <utility>

#include <prometheus/text_serializer.h>

#include "common/base/logging.h"

namespace trellis {
namespace {

std::map<std::string, std::string> ConstantLabels(const MetricLabels& l) {
  std::map<std::string, std::string> out;
  if (!l.job.empty()) out["job"] = l.job;
  if (!l.role.empty()) out["role"] = l.role;
  if (l.rank >= 0) out["rank"] = std::to_string(l.rank);
  return out;
}

const char* KindName(int kind) {
  static const char* kNames[] = {"counter", "gauge", "histogram"};
  return kNames[kind];
}

}  // namespace

MetricsRegistry::MetricsRegistry(MetricLabels labels)
    : labels_(std::move(labels)), registry_(std::make_shared<prometheus::Registry>()) {
  // The one family registered here; its fixed, valid name cannot make prometheus-cpp throw
  // except for invalid constant labels (a job name is validated long before, but be safe).
  try {
    registration_errors_ = &prometheus::BuildCounter()
                                .Name("trellis_metrics_registration_errors_total")
                                .Help("Metric registrations refused (invalid name or label, type clash)")
                                .Labels(ConstantLabels(labels_))
                                .Register(*registry_)
                                .Add({});
    families_["trellis_metrics_registration_errors_total"] = {Kind::kCounter, nullptr};
  } catch (const std::exception& e) {
    errors_.push_back(std::string("constant labels: ") + e.what());
    detached_counters_.push_back(std::make_unique<prometheus::Counter>());
    registration_errors_ = detached_counters_.back().get();
    TLOG_ERROR << "metrics: constant labels refused: " << e.what();
  }
}

void MetricsRegistry::RecordError(const std::string& message) {
  errors_.push_back(message);
  registration_errors_->Increment();
  TLOG_ERROR << "metrics: " << message;
}

template <typename T>
prometheus::Family<T>* MetricsRegistry::FamilyFor(Kind kind, const std::string& name,
                                                  const std::string& help) {
  auto it = families_.find(name);
  if (it != families_.end()) {
    if (it->second.family == nullptr) {
      RecordError(name + ": reserved for the registry's own use");
      return nullptr;
    }
    if (it->second.kind != kind) {
      RecordError(name + ": already registered as a " + KindName(static_cast<int>(it->second.kind)) +
                  ", not a " + KindName(static_cast<int>(kind)));
      return nullptr;
    }
    return static_cast<prometheus::Family<T>*>(it->second.family);
  }
  prometheus::Family<T>* family = nullptr;
  try {
    if constexpr (std::is_same_v<T, prometheus::Counter>) {
      family = &prometheus::BuildCounter().Name(name).Help(help).Labels(ConstantLabels(labels_)).Register(*registry_);
    } else if constexpr (std::is_same_v<T, prometheus::Gauge>) {
      family = &prometheus::BuildGauge().Name(name).Help(help).Labels(ConstantLabels(labels_)).Register(*registry_);
    } else {
      family = &prometheus::BuildHistogram().Name(name).Help(help).Labels(ConstantLabels(labels_)).Register(*registry_);
    }
  } catch (const std::exception& e) {
    RecordError("'" + name + "': " + e.what());
    return nullptr;
  }
  families_[name] = {kind, family};
  return family;
}

prometheus::Counter& MetricsRegistry::Counter(const std::string& name, const std::string& help,
                                              const Labels& extra_labels) {
  MutexLock lock(&mu_);
  if (auto* f = FamilyFor<prometheus::Counter>(Kind::kCounter, name, help)) {
    try {
      return f->Add(extra_labels);
    } catch (const std::exception& e) {
      RecordError("'" + name + "' labels: " + e.what());
    }
  }
  detached_counters_.push_back(std::make_unique<prometheus::Counter>());
  return *detached_counters_.back();
}

prometheus::Gauge& MetricsRegistry::Gauge(const std::string& name, const std::string& help,
                                          const Labels& extra_labels) {
  MutexLock lock(&mu_);
  if (auto* f = FamilyFor<prometheus::Gauge>(Kind::kGauge, name, help)) {
    try {
      return f->Add(extra_labels);
    } catch (const std::exception& e) {
      RecordError("'" + name + "' labels: " + e.what());
    }
  }
  detached_gauges_.push_back(std::make_unique<prometheus::Gauge>());
  return *detached_gauges_.back();
}

prometheus::Histogram& MetricsRegistry::Histogram(const std::string& name, const std::string& help,
                                                  const std::vector<double>& buckets,
                                                  const Labels& extra_labels) {
  MutexLock lock(&mu_);
  if (auto* f = FamilyFor<prometheus::Histogram>(Kind::kHistogram, name, help)) {
    try {
      return f->Add(extra_labels, buckets);
    } catch (const std::exception& e) {
      RecordError("'" + name + "' labels: " + e.what());
    }
  }
  detached_histograms_.push_back(std::make_unique<prometheus::Histogram>(buckets));
  return *detached_histograms_.back();
}

std::vector<double> MetricsRegistry::LatencyBuckets() {
  std::vector<double> b;
  for (double v = 1e-6; v < 10.0; v *= 2) b.push_back(v);  // 1 µs .. 8.39 s: 24 buckets
  b.push_back(10.0);
  return b;
}

void MetricsRegistry::OnCollect(std::function<void()> hook) {
  MutexLock lock(&mu_);
  hooks_.push_back(std::move(hook));
}

std::string MetricsRegistry::Serialize() const {
  MutexLock collect(&collect_mu_);
  std::vector<std::function<void()>> hooks;
  {
    MutexLock lock(&mu_);
    hooks = hooks_;
  }
  // Hooks run without mu_, so they may look up series.
  for (const auto& h : hooks) h();
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

std::vector<std::string> MetricsRegistry::errors() const {
  MutexLock lock(&mu_);
  return errors_;
}

}  // namespace trellis
