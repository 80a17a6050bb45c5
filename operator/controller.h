// The control loop: list + watch TrainingJobs and their pods (resourceVersion, bookmarks, relist
// after 410 Gone, reconnect with back-off), a work queue of job keys with delayed requeues, and
// one reconcile thread. Threads: "watch-jobs", "watch-pods", "reconcile".
//
// With an ObjectCache it also watches the jobs' Services, ConfigMaps and Secrets (by the
// trellis.io/job-name label) and keeps every watched object in the cache, which the Reconciler
// reads: the periodic resync then reconciles from memory, and an idle operator makes no request
// but its watches. Reconciling starts once every watch has listed. A store whose watch the
// operator's RBAC does not allow (403) is disabled: the Reconciler reads those objects from the
// API server, as without a cache.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <cpprest/http_client.h>

#include "common/base/mutex.h"
#include "operator/kube_client.h"
#include "operator/object_cache.h"
#include "operator/reconciler.h"

namespace trellis::op {

struct ControllerOptions {
  std::string watch_namespace;  // empty: every namespace
  std::chrono::milliseconds resync{std::chrono::seconds(30)};  // reconcile every job this often anyway
  int watch_timeout_seconds = 300;  // the server ends a watch after this; we resume from the version
  // Back-off of a broken watch, and of a job whose reconcile failed (per job).
  std::chrono::milliseconds backoff_initial{200};
  std::chrono::milliseconds backoff_max{std::chrono::seconds(30)};
};

struct ControllerCounters {
  std::atomic<uint64_t> reconciles{0};
  std::atomic<uint64_t> reconcile_errors{0};
  std::atomic<uint64_t> watch_restarts{0};  // a watch that had to be reopened (break, 410, error)
  std::atomic<uint64_t> relists{0};
};

class Controller {
 public:
  // `reconcile_observer` gets the reconcile latency (seconds) after each reconcile.
  Controller(KubeClient& client, Reconciler& reconciler, ControllerOptions options,
             std::function<void(double seconds)> reconcile_observer = {}, ObjectCache* cache = nullptr);
  ~Controller();  // Stop()s

  void Start();
  void Stop() EXCLUDES(mu_);
  const ControllerCounters& counters() const { return counters_; }
  // True once both watches have listed at least once (the /healthz readiness).
  bool synced() const { return jobs_synced_.load() && pods_synced_.load() && (!cache_ || cache_->synced()); }

 private:
  using Key = std::pair<std::string, std::string>;  // namespace, name
  void Enqueue(const Key& key, Clock::time_point due) EXCLUDES(mu_);
  // `synced` (may be null): set once listed; `store`: the cache store this watch fills (may be
  // null; it records its own sync); `optional`: a 403 disables the store instead of retrying forever.
  void WatchLoop(const Resource& r, const std::string& selector, bool pods, std::atomic<bool>* synced,
                 ObjectStore* store = nullptr, bool optional = false) EXCLUDES(mu_);
  void ReconcileLoop() EXCLUDES(mu_);
  // Until `d` has passed or Stop().
  void Sleep(std::chrono::milliseconds d) EXCLUDES(mu_);

  KubeClient& client_;
  Reconciler& reconciler_;
  ControllerOptions options_;
  std::function<void(double)> reconcile_observer_;
  ObjectCache* cache_;  // may be null
  ControllerCounters counters_;
  std::atomic<bool> jobs_synced_{false};
  std::atomic<bool> pods_synced_{false};

  Mutex mu_;
  CondVar cv_;  // signalled on a new queue entry and on Stop()
  std::map<Key, Clock::time_point> queue_ GUARDED_BY(mu_);  // earliest due time per job
  std::set<Key> known_ GUARDED_BY(mu_);                     // jobs seen, for the resync
  std::set<Key> resync_ GUARDED_BY(mu_);                    // the resync's jobs not reconciled yet
  bool stopping_ GUARDED_BY(mu_) = false;
  std::map<Key, std::chrono::milliseconds> error_backoff_;  // reconcile thread only

  pplx::cancellation_token_source cancel_;
  std::thread watch_jobs_, watch_pods_, reconcile_;
  std::vector<std::thread> watch_owned_;  // Services, ConfigMaps, Secrets (with a cache)
};

}  // namespace trellis::op
