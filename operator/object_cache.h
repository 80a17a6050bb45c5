// The operator's cache of the objects it watches, as controller-runtime's informers keep one: the
// watches fill it (a LIST replaces a store, each event updates it), the operator's own writes go
// into it at once (the API server's answer), and the reconciler reads from it. An idle operator
// then makes no API request: a resync reconciles from the cache and writes only a difference.
//
// The cache may lag the server (an event not yet arrived): a write made from a stale read loses
// with 409 Conflict or AlreadyExists, and the reconciler reads that object afresh (Refresh).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/base/mutex.h"
#include "operator/json_util.h"

namespace trellis::op {

// Whether resourceVersion `a` is older than `b`. Versions are opaque to clients, but every API
// server on etcd gives decimal revisions; anything else counts as "not older" (newest wins).
bool OlderVersion(const std::string& a, const std::string& b);

// The objects of one resource, by namespace and name; thread-safe.
class ObjectStore {
 public:
  struct Options {
    // Keep only metadata (name, namespace, labels, ownerReferences, uid, resourceVersion,
    // deletionTimestamp) and `keep_fields` below the top level: for Secrets the operator needs
    // to know they exist, not to hold every job's token in memory.
    bool metadata_only = false;
    std::vector<std::string> keep_fields;
    // Index by this label (e.g. trellis.io/job-name): ListByLabel is then O(matching).
    std::string index_label;
  };
  ObjectStore() : options_() {}
  explicit ObjectStore(Options o) : options_(std::move(o)) {}

  // A LIST's answer: the store becomes exactly its items (a relist after 410 Gone forgets what
  // went). Items lack apiVersion and kind in a LIST; they get the list's ("PodList": "Pod").
  void Replace(const Json& list) EXCLUDES(mu_);
  // A watch event: ADDED and MODIFIED put the object, DELETED removes it; BOOKMARK is ignored.
  void Apply(const std::string& type, const Json& object) EXCLUDES(mu_);
  // An object as the API server answered one of the operator's own writes: put unless the store
  // already holds a newer version of it (its watch event came first).
  void Written(const Json& object) EXCLUDES(mu_);

  std::optional<Json> Get(const std::string& ns, const std::string& name) const EXCLUDES(mu_);
  // The objects in `ns` whose index label is `value` (the store's index_label).
  std::vector<Json> ListByLabel(const std::string& ns, const std::string& value) const EXCLUDES(mu_);
  std::vector<Json> List() const EXCLUDES(mu_);
  size_t size() const EXCLUDES(mu_);

  // Set once the first LIST has filled it. A store that could not be filled (its watch is not
  // permitted) is `disabled`: the reader goes to the API server instead.
  void MarkSynced() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    synced_ = true;
  }
  bool synced() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return synced_;
  }
  void Disable() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    disabled_ = true;
    synced_ = true;
  }
  bool usable() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return synced_ && !disabled_;
  }

 private:
  using Key = std::pair<std::string, std::string>;  // namespace, name
  Json Trim(const Json& object) const;
  void PutLocked(const Key& key, Json object) REQUIRES(mu_);
  void EraseLocked(const Key& key) REQUIRES(mu_);

  const Options options_;
  mutable Mutex mu_;
  std::map<Key, Json> objects_ GUARDED_BY(mu_);
  std::map<Key, std::set<std::string>> by_label_ GUARDED_BY(mu_);  // (ns, label value) -> names
  bool synced_ GUARDED_BY(mu_) = false;
  bool disabled_ GUARDED_BY(mu_) = false;
};

// The stores the operator keeps: its TrainingJobs and the objects they own (by the
// trellis.io/job-name label).
struct ObjectCache {
  ObjectCache();
  ObjectStore jobs;
  ObjectStore pods;
  ObjectStore services;
  ObjectStore configmaps;
  ObjectStore secrets;
  bool synced() const {
    return jobs.synced() && pods.synced() && services.synced() && configmaps.synced() && secrets.synced();
  }
};

}  // namespace trellis::op
