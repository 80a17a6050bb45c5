#include "operator/object_cache.h"

#include <charconv>

#include "operator/desired.h"

namespace trellis::op {
namespace {

std::optional<uint64_t> Decimal(const std::string& s) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

bool OlderVersion(const std::string& a, const std::string& b) {
  auto x = Decimal(a), y = Decimal(b);
  return x && y && *x < *y;
}

Json ObjectStore::Trim(const Json& object) const {
  if (options_.metadata_only) {
    // Built from the parts kept: the rest (a Secret's data, a Service's spec) is never copied.
    Json out = Json::object();
    for (const char* k : {"apiVersion", "kind"}) {
      if (const Json* v = At(object, {k})) out[k] = *v;
    }
    for (const char* k : {"name", "namespace", "uid", "resourceVersion", "labels", "ownerReferences",
                          "deletionTimestamp"}) {
      if (const Json* v = At(object, {"metadata", k})) Put(out, {"metadata", k}, *v);
    }
    for (const std::string& k : options_.keep_fields) {
      if (const Json* v = At(object, {k.c_str()})) out[k] = *v;
    }
    return out;
  }
  Json out = object;
  if (out.is_object() && out.has_field("metadata") && out.at("metadata").is_object()) {
    // The server-side-apply bookkeeping is most of a small object's size, and nothing reads it.
    // (cpprestsdk's erase throws for a key that is not there.)
    Json& meta = out.at("metadata");
    if (meta.has_field("managedFields")) meta.erase("managedFields");
    constexpr char kLastApplied[] = "kubectl.kubernetes.io/last-applied-configuration";
    if (meta.has_field("annotations") && meta.at("annotations").is_object() &&
        meta.at("annotations").has_field(kLastApplied)) {
      meta.at("annotations").erase(kLastApplied);
    }
  }
  return out;
}

void ObjectStore::PutLocked(const Key& key, Json object) {
  if (!options_.index_label.empty()) {
    auto old = objects_.find(key);
    const std::string before = old == objects_.end() ? "" : Str(old->second, {"metadata", "labels", options_.index_label.c_str()});
    const std::string after = Str(object, {"metadata", "labels", options_.index_label.c_str()});
    if (old != objects_.end() && before != after) {
      auto it = by_label_.find({key.first, before});
      if (it != by_label_.end()) {
        it->second.erase(key.second);
        if (it->second.empty()) by_label_.erase(it);
      }
    }
    if (!after.empty()) by_label_[{key.first, after}].insert(key.second);
  }
  objects_[key] = std::move(object);
}

void ObjectStore::EraseLocked(const Key& key) {
  auto old = objects_.find(key);
  if (old == objects_.end()) return;
  if (!options_.index_label.empty()) {
    const std::string v = Str(old->second, {"metadata", "labels", options_.index_label.c_str()});
    auto it = by_label_.find({key.first, v});
    if (it != by_label_.end()) {
      it->second.erase(key.second);
      if (it->second.empty()) by_label_.erase(it);
    }
  }
  objects_.erase(old);
}

namespace {
std::pair<std::string, std::string> KeyOf(const Json& o) {
  return {Str(o, {"metadata", "namespace"}, "default"), Str(o, {"metadata", "name"})};
}
}  // namespace

void ObjectStore::Replace(const Json& list) {
  std::map<Key, Json> fresh;
  const std::string api_version = Str(list, {"apiVersion"});
  std::string kind = Str(list, {"kind"});
  if (kind.size() > 4 && kind.compare(kind.size() - 4, 4, "List") == 0) kind.resize(kind.size() - 4);
  const Json* items = At(list, {"items"});
  if (items && items->is_array()) {
    for (size_t i = 0; i < items->size(); ++i) {
      Key k = KeyOf(items->at(i));
      if (k.second.empty()) continue;
      Json o = Trim(items->at(i));
      if (!api_version.empty() && !At(o, {"apiVersion"})) o["apiVersion"] = JStr(api_version);
      if (!kind.empty() && !At(o, {"kind"})) o["kind"] = JStr(kind);
      fresh[k] = std::move(o);
    }
  }
  MutexLock lock(&mu_);
  objects_.clear();
  by_label_.clear();
  for (auto& [k, v] : fresh) PutLocked(k, std::move(v));
}

void ObjectStore::Apply(const std::string& type, const Json& object) {
  if (type != "ADDED" && type != "MODIFIED" && type != "DELETED") return;
  Key k = KeyOf(object);
  if (k.second.empty()) return;
  Json trimmed = type == "DELETED" ? Json() : Trim(object);
  MutexLock lock(&mu_);
  if (type == "DELETED") {
    EraseLocked(k);
  } else {
    PutLocked(k, std::move(trimmed));
  }
}

void ObjectStore::Written(const Json& object) {
  Key k = KeyOf(object);
  if (k.second.empty()) return;
  Json trimmed = Trim(object);
  const std::string rv = Str(object, {"metadata", "resourceVersion"});
  MutexLock lock(&mu_);
  auto it = objects_.find(k);
  if (it != objects_.end() && OlderVersion(rv, Str(it->second, {"metadata", "resourceVersion"}))) return;
  PutLocked(k, std::move(trimmed));
}

std::optional<Json> ObjectStore::Get(const std::string& ns, const std::string& name) const {
  MutexLock lock(&mu_);
  auto it = objects_.find({ns, name});
  if (it == objects_.end()) return std::nullopt;
  return it->second;
}

std::vector<Json> ObjectStore::ListByLabel(const std::string& ns, const std::string& value) const {
  std::vector<Json> out;
  MutexLock lock(&mu_);
  auto it = by_label_.find({ns, value});
  if (it == by_label_.end()) return out;
  for (const std::string& name : it->second) {
    auto o = objects_.find({ns, name});
    if (o != objects_.end()) out.push_back(o->second);
  }
  return out;
}

std::vector<Json> ObjectStore::List() const {
  std::vector<Json> out;
  MutexLock lock(&mu_);
  out.reserve(objects_.size());
  for (const auto& [k, v] : objects_) out.push_back(v);
  return out;
}

size_t ObjectStore::size() const {
  MutexLock lock(&mu_);
  return objects_.size();
}

ObjectCache::ObjectCache()
    : pods(ObjectStore::Options{false, {}, kLabelJob}),
      services(ObjectStore::Options{true, {}, kLabelJob}),
      // The job file is compared with the spec on every reconcile: its data is kept.
      configmaps(ObjectStore::Options{true, {"data"}, kLabelJob}),
      secrets(ObjectStore::Options{true, {}, kLabelJob}) {}

}  // namespace trellis::op
