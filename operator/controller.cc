#include "operator/controller.h"

#include <algorithm>

#include "common/base/logging.h"
#include "operator/desired.h"

namespace trellis::op {

Controller::Controller(KubeClient& client, Reconciler& reconciler, ControllerOptions options,
                       std::function<void(double)> reconcile_observer, ObjectCache* cache)
    : client_(client),
      reconciler_(reconciler),
      options_(std::move(options)),
      reconcile_observer_(std::move(reconcile_observer)),
      cache_(cache) {}

Controller::~Controller() { Stop(); }

void Controller::Start() {
  watch_jobs_ = std::thread([this] {
    WatchLoop(kTrainingJobs, "", false, &jobs_synced_, cache_ ? &cache_->jobs : nullptr);
  });
  // Only pods that carry the job label: the operator never watches the whole cluster's pods.
  watch_pods_ = std::thread([this] { WatchLoop(kPods, kLabelJob, true, &pods_synced_, cache_ ? &cache_->pods : nullptr); });
  if (cache_) {
    const Resource* owned[3] = {&kServices, &kConfigMaps, &kSecrets};
    ObjectStore* stores[3] = {&cache_->services, &cache_->configmaps, &cache_->secrets};
    for (int i = 0; i < 3; ++i) {
      watch_owned_.emplace_back([this, r = owned[i], store = stores[i]] {
        WatchLoop(*r, kLabelJob, true, /*synced=*/nullptr, store, /*optional=*/true);
      });
    }
  }
  reconcile_ = std::thread([this] { ReconcileLoop(); });
}

void Controller::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_ && !reconcile_.joinable()) return;
    stopping_ = true;
  }
  cv_.SignalAll();
  cancel_.cancel();
  for (std::thread* t : {&watch_jobs_, &watch_pods_, &reconcile_}) {
    if (t->joinable()) t->join();
  }
  for (std::thread& t : watch_owned_) {
    if (t.joinable()) t.join();
  }
}

void Controller::Enqueue(const Key& key, Clock::time_point due) {
  {
    MutexLock lock(&mu_);
    known_.insert(key);
    auto it = queue_.find(key);
    if (it == queue_.end() || due < it->second) queue_[key] = due;
  }
  cv_.SignalAll();
}

void Controller::Sleep(std::chrono::milliseconds d) {
  MutexLock lock(&mu_);
  const auto deadline = std::chrono::steady_clock::now() + d;
  while (!stopping_) {
    if (!cv_.WaitUntil(&mu_, deadline)) break;
  }
}

void Controller::WatchLoop(const Resource& r, const std::string& selector, bool pods, std::atomic<bool>* synced,
                           ObjectStore* store, bool optional) {
  auto stopping = [&] {
    MutexLock lock(&mu_);
    return stopping_;
  };
  // The job a watched object belongs to.
  auto key_of = [&](const Json& obj) -> std::optional<Key> {
    const std::string ns = Str(obj, {"metadata", "namespace"}, "default");
    const std::string name = pods ? Str(obj, {"metadata", "labels", kLabelJob}) : Str(obj, {"metadata", "name"});
    if (name.empty()) return std::nullopt;
    return Key{ns, name};
  };
  std::chrono::milliseconds backoff = options_.backoff_initial;
  std::string rv;  // empty: list first
  while (!stopping()) {
    if (rv.empty()) {
      auto list = client_.List(r, options_.watch_namespace, selector);
      if (!list.ok() && optional && store && list.status().code() == StatusCode::kPermissionDenied) {
        TLOG_WARN << "cannot list " << r.plural << " (" << list.status().message()
                  << "): reading them from the API server on every reconcile instead; the chart's ClusterRole "
                     "grants list and watch";
        store->Disable();
        if (synced) *synced = true;
        return;
      }
      if (!list.ok()) {
        TLOG_WARN << "list " << r.plural << " failed: " << list.status().message() << "; retrying in "
                  << backoff.count() << " ms";
        Sleep(backoff);
        backoff = std::min(backoff * 2, options_.backoff_max);
        continue;
      }
      ++counters_.relists;
      rv = Str(*list, {"metadata", "resourceVersion"});
      if (store) {
        store->Replace(*list);
        store->MarkSynced();
      }
      if (const Json* items = At(*list, {"items"}); items && items->is_array()) {
        for (size_t i = 0; i < items->size(); ++i) {
          if (auto k = key_of(items->at(i))) Enqueue(*k, Clock::now());
        }
      }
      if (synced) *synced = true;
      if (rv.empty()) rv = "0";
    }
    bool got_event = false;
    Status s = client_.Watch(
        r, options_.watch_namespace, selector, rv, options_.watch_timeout_seconds,
        [&](const std::string& type, const Json& obj) {
          got_event = true;
          std::string v = Str(obj, {"metadata", "resourceVersion"});
          if (!v.empty()) rv = v;
          if (type == "BOOKMARK") return;
          if (store) store->Apply(type, obj);
          if (!pods && type == "DELETED") {
            MutexLock lock(&mu_);
            const Key gone{Str(obj, {"metadata", "namespace"}, "default"), Str(obj, {"metadata", "name"})};
            known_.erase(gone);
            resync_.erase(gone);
            return;  // its objects go with it (ownerReferences)
          }
          if (auto k = key_of(obj)) Enqueue(*k, Clock::now());
        },
        cancel_.get_token());
    if (stopping()) break;
    if (s.ok()) {
      backoff = options_.backoff_initial;
      continue;  // the server closed the stream on time: resume from rv
    }
    ++counters_.watch_restarts;
    if (s.code() == StatusCode::kOutOfRange) {
      TLOG_INFO << "watch " << r.plural << ": resourceVersion " << rv << " is too old (410 Gone), relisting";
      rv.clear();
      continue;
    }
    if (got_event) backoff = options_.backoff_initial;
    TLOG_WARN << "watch " << r.plural << " broke: " << s.message() << "; resuming from resourceVersion " << rv
              << " in " << backoff.count() << " ms";
    Sleep(backoff);
    backoff = std::min(backoff * 2, options_.backoff_max);
  }
}

void Controller::ReconcileLoop() {
  Clock::time_point next_resync = Clock::now() + options_.resync;
  MutexLock lock(&mu_);
  // With a cache, reconcile only once every watch has listed: a job read before its pods' store
  // is filled would look as if it had none.
  while (!stopping_ && cache_ && !synced()) cv_.WaitFor(&mu_, std::chrono::milliseconds(50));
  while (!stopping_) {
    const auto now = Clock::now();
    if (now >= next_resync) {
      resync_.insert(known_.begin(), known_.end());
      next_resync = now + options_.resync;
    }
    // What an event (or a requeue) asks for goes first; the resync's jobs fill the idle time, so
    // a change waits for one reconcile at most, never for a whole resync of every job.
    auto due = std::min_element(queue_.begin(), queue_.end(),
                                [](const auto& a, const auto& b) { return a.second < b.second; });
    Key key;
    if (due != queue_.end() && due->second <= now) {
      key = due->first;
      queue_.erase(due);
      resync_.erase(key);
    } else if (!resync_.empty()) {
      key = *resync_.begin();
      resync_.erase(resync_.begin());
    } else {
      auto until = due == queue_.end() ? next_resync : std::min(next_resync, due->second);
      cv_.WaitUntil(&mu_, until);
      continue;
    }
    lock.Unlock();
    const auto t0 = std::chrono::steady_clock::now();
    // The Reconciler turns a job's exceptions into its status; this guard only keeps the one
    // reconcile thread alive should anything still escape.
    StatusOr<std::optional<Clock::duration>> r = InternalError("reconcile threw");
    try {
      r = reconciler_.Reconcile(key.first, key.second);
    } catch (const std::exception& e) {
      r = InternalError(std::string("reconcile threw: ") + e.what());
    } catch (...) {
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++counters_.reconciles;
    if (reconcile_observer_) reconcile_observer_(secs);
    std::optional<Clock::time_point> again;
    if (!r.ok()) {
      ++counters_.reconcile_errors;
      // Per job: back-off doubling from backoff_initial to backoff_max, reset by a success.
      auto& delay = error_backoff_[key];
      delay = delay.count() == 0 ? options_.backoff_initial : std::min(delay * 2, options_.backoff_max);
      TLOG_WARN << "reconcile " << key.first << "/" << key.second << " failed: " << r.status().message()
                << "; retrying in " << delay.count() << " ms";
      again = Clock::now() + delay;
    } else {
      error_backoff_.erase(key);
      if (*r) again = Clock::now() + **r;
    }
    lock.Lock();
    if (again) {
      auto it = queue_.find(key);
      if (it == queue_.end() || *again < it->second) queue_[key] = *again;
    }
  }
}

}  // namespace trellis::op
