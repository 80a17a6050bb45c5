// One Prometheus registry per process (no singleton): created at start-up by main() or
// Worker::Create and handed to the code that updates its series. Every series carries the
// process's constant labels job, role and rank (docs/metrics.md).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "common/base/mutex.h"

namespace trellis {

// Constant labels of every series of one process. An empty `job` or a negative `rank` leaves
// that label out (the operator watches many jobs; the scheduler and launcher have no rank).
struct MetricLabels {
  std::string job;
  std::string role;
  int32_t rank = -1;
};

class MetricsRegistry {
 public:
  using Labels = std::map<std::string, std::string>;

  explicit MetricsRegistry(MetricLabels labels);
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The series `name{extra_labels}`; the same name and labels again return the same series.
  // Register at start-up and keep the reference: the lookup takes a lock.
  // An invalid name or label, or a name already used with another type, never throws: the error
  // is logged, counted in trellis_metrics_registration_errors_total, kept in errors(), and the
  // call returns a detached series that works but is never exported.
  prometheus::Counter& Counter(const std::string& name, const std::string& help,
                               const Labels& extra_labels = {});
  prometheus::Gauge& Gauge(const std::string& name, const std::string& help,
                           const Labels& extra_labels = {});
  prometheus::Histogram& Histogram(const std::string& name, const std::string& help,
                                   const std::vector<double>& buckets,
                                   const Labels& extra_labels = {});

  // Exponential bucket bounds for latencies: 1 µs, 2 µs, 4 µs ... ~8.4 s, then 10 s.
  static std::vector<double> LatencyBuckets();

  // Called before every Serialize(), to sample gauges that mirror state kept elsewhere
  // (queue depth, counters owned by another object). Must not call back into this registry's
  // Serialize. Runs on the scraping thread.
  void OnCollect(std::function<void()> hook);

  // Text exposition format 0.0.4 of every series.
  std::string Serialize() const;

  prometheus::Registry& registry() { return *registry_; }
  const MetricLabels& labels() const { return labels_; }
  // Registration errors so far (tests and start-up checks).
  std::vector<std::string> errors() const;

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  struct FamilyEntry {
    Kind kind;
    void* family;  // prometheus::Family<T>* of `kind`, owned by registry_
  };
  template <typename T>
  prometheus::Family<T>* FamilyFor(Kind kind, const std::string& name, const std::string& help)
      REQUIRES(mu_);
  void RecordError(const std::string& message) REQUIRES(mu_);

  const MetricLabels labels_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter* registration_errors_ = nullptr;

  // Serialises hook runs so two scrapes never sample into the same gauge at once.
  mutable Mutex collect_mu_ ACQUIRED_BEFORE(mu_);
  mutable Mutex mu_;
  std::map<std::string, FamilyEntry> families_ GUARDED_BY(mu_);  // name -> family
  std::vector<std::string> errors_ GUARDED_BY(mu_);
  // Detached series handed out on errors: owned here, never exported.
  std::deque<std::unique_ptr<prometheus::Counter>> detached_counters_ GUARDED_BY(mu_);
  std::deque<std::unique_ptr<prometheus::Gauge>> detached_gauges_ GUARDED_BY(mu_);
  std::deque<std::unique_ptr<prometheus::Histogram>> detached_histograms_ GUARDED_BY(mu_);
  std::vector<std::function<void()>> hooks_ GUARDED_BY(mu_);
};

}  // namespace trellis
