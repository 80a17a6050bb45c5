#include "pserver/slice_table.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

namespace trellis {
namespace {

std::string SliceName(uint64_t key, const std::string& key_name, uint32_t slice) {
  std::string s = "key " + std::to_string(key);
  if (!key_name.empty()) s += " (" + key_name + ")";
  return s + " slice " + std::to_string(slice);
}

// Whether two maps cut a key into the same slices (and, with `same_servers`, place them alike).
bool SlicedAlike(const v1::KeyShards& a, const v1::KeyShards& b, bool same_servers) {
  if (a.key().num_elements() != b.key().num_elements() || a.key().dtype() != b.key().dtype() ||
      a.slices_size() != b.slices_size()) {
    return false;
  }
  for (int i = 0; i < a.slices_size(); ++i) {
    const auto& x = a.slices(i);
    const auto& y = b.slices(i);
    if (x.index() != y.index() || x.offset() != y.offset() || x.num_elements() != y.num_elements() ||
        (same_servers && x.server() != y.server())) {
      return false;
    }
  }
  return true;
}

}  // namespace

Status SliceTable::Install(const v1::ShardMap& map, int64_t* slices, int64_t* bytes) {
  std::string serialized;
  {
    google::protobuf::io::StringOutputStream sos(&serialized);
    google::protobuf::io::CodedOutputStream cos(&sos);
    cos.SetSerializationDeterministic(true);
    map.SerializeToCodedStream(&cos);
  }
  WriterMutexLock lock(&mu_);
  if (installed_ != serialized) {
    const bool relayout = !installed_.empty() && map.world_epoch() != map_.world_epoch();
    // Where each installed slice was before: a slice a resize brings here comes from there.
    std::unordered_map<uint64_t, std::vector<int32_t>> was_on;
    if (relayout) {
      TRELLIS_RETURN_IF_ERROR(CheckRelayout(map));
      for (const auto& ks : map_.keys()) {
        auto& servers = was_on[ks.key().id()];
        for (const auto& sa : ks.slices()) servers.push_back(sa.server());
      }
    } else if (!installed_.empty()) {
      TRELLIS_RETURN_IF_ERROR(CheckExtension(map));
    } else if (map.num_servers() <= server_rank_) {
      return InvalidArgumentError("shard map is for " + std::to_string(map.num_servers()) +
                                  " servers, this is server " +
                                  std::to_string(server_rank_));
    }
    for (const auto& ks : map.keys()) {
      for (const auto& sa : ks.slices()) {
        if (sa.server() == server_rank_ && sa.num_elements() <= 0) {
          return InvalidArgumentError("shard map: " +
                                      SliceName(ks.key().id(), ks.key().name(), sa.index()) +
                                      " has " + std::to_string(sa.num_elements()) + " elements");
        }
      }
    }
    // A first map, or one that adds keys (deferred init): slices already held stay as they are.
    // A resize's map first retires those it moves away.
    if (relayout) RetireMovedAway(map);
    map_ = map;
    all_keys_.clear();
    for (const auto& ks : map_.keys()) {
      const auto& k = ks.key();
      all_keys_[k.id()] = KeyInfo{k.name(), &ks};
      for (const auto& sa : ks.slices()) {
        if (sa.server() != server_rank_ || keys_[k.id()].count(sa.index()) != 0) continue;
        auto slice = std::make_unique<Slice>(k.id(), sa.index(),
                                             SliceName(k.id(), k.name(), sa.index()),
                                             sa.num_elements(), slots_, worlds_->Current());
        if (relayout) {
          MutexLock slice_lock(&slice->mu);
          slice->move.from_server = was_on.at(k.id()).at(sa.index());
          // Moved away earlier and back now: the old one is no handover's source any more.
          if (auto r = retired_.find(k.id()); r != retired_.end()) {
            if (auto it = r->second.find(sa.index()); it != r->second.end()) {
              graveyard_.push_back(std::move(it->second));
              r->second.erase(it);
            }
          }
        }
        keys_[k.id()][sa.index()] = std::move(slice);
        ++num_slices_;
      }
    }
    installed_ = std::move(serialized);
  }
  *slices = num_slices_;
  *bytes = 0;
  for (const auto& [id, slices_of_key] : keys_) {
    for (const auto& [i, s] : slices_of_key) *bytes += s->num_elements * 4;
  }
  return Status::Ok();
}

Status SliceTable::CheckExtension(const v1::ShardMap& map) const {
  const auto differs = [&](const std::string& what) {
    return FailedPreconditionError("shard map differs from the one already installed on server " +
                                   std::to_string(server_rank_) + ": " + what +
                                   " (all workers must relay the same map; a later map may only "
                                   "add keys)");
  };
  if (map.slice_bytes() != map_.slice_bytes() || map.dispatch() != map_.dispatch() ||
      map.num_servers() != map_.num_servers()) {
    return differs("other settings");
  }
  std::unordered_map<uint64_t, const v1::KeyShards*> now;
  for (const auto& ks : map.keys()) now[ks.key().id()] = &ks;
  for (const auto& old : map_.keys()) {
    auto it = now.find(old.key().id());
    if (it == now.end()) return differs("key " + std::to_string(old.key().id()) + " is missing");
    const v1::KeyShards& ks = *it->second;
    if (ks.key().name() != old.key().name() || !SlicedAlike(ks, old, /*same_servers=*/true)) {
      return differs("key " + std::to_string(old.key().id()) + " is laid out otherwise");
    }
  }
  return Status::Ok();
}

Status SliceTable::CheckRelayout(const v1::ShardMap& map) const {
  const int64_t installed = map_.world_epoch();  // read here: the lambda is not seen to hold mu_
  const auto refused = [&](const std::string& what) {
    return FailedPreconditionError(
        "shard map of world epoch " + std::to_string(map.world_epoch()) +
        " cannot replace the one installed on server " + std::to_string(server_rank_) +
        " (world epoch " + std::to_string(installed) + "): " + what);
  };
  if (map.world_epoch() < map_.world_epoch()) return refused("it is older");
  if (map.slice_bytes() != map_.slice_bytes()) return refused("another sliceBytes");
  if (map.num_servers() < 1) return refused("no servers");
  if (map.keys_size() != map_.keys_size()) return refused("other keys");
  for (int i = 0; i < map.keys_size(); ++i) {
    const v1::KeyShards& ks = map.keys(i);
    const v1::KeyShards& old = map_.keys(i);
    if (ks.key().id() != old.key().id() || !SlicedAlike(ks, old, /*same_servers=*/false)) {
      return refused("key " + std::to_string(old.key().id()) + " is not sliced the same");
    }
    for (const auto& a : ks.slices()) {
      if (a.server() < 0 || a.server() >= map.num_servers()) {
        return refused("key " + std::to_string(ks.key().id()) + " slice " + std::to_string(a.index()) +
                       " on server " + std::to_string(a.server()) + " of " +
                       std::to_string(map.num_servers()));
      }
    }
  }
  return Status::Ok();
}

void SliceTable::RetireMovedAway(const v1::ShardMap& map) {
  for (const auto& ks : map.keys()) {
    auto held = keys_.find(ks.key().id());
    if (held == keys_.end()) continue;
    for (const auto& sa : ks.slices()) {
      if (sa.server() == server_rank_) continue;
      auto it = held->second.find(sa.index());
      if (it == held->second.end()) continue;
      {
        MutexLock slice_lock(&it->second->mu);
        it->second->move.to_server = sa.server();
      }
      auto& slot = retired_[ks.key().id()][sa.index()];
      if (slot) graveyard_.push_back(std::move(slot));
      slot = std::move(it->second);
      held->second.erase(it);
      --num_slices_;
    }
    if (held->second.empty()) keys_.erase(held);
  }
}

std::vector<Slice*> SliceTable::Retired() const {
  std::vector<Slice*> out;
  for (const auto& [key, slices] : retired_) {
    for (const auto& [index, s] : slices) out.push_back(s.get());
  }
  return out;
}

Slice* SliceTable::FindRetired(uint64_t key, uint32_t slice) const {
  auto it = retired_.find(key);
  if (it == retired_.end()) return nullptr;
  auto jt = it->second.find(slice);
  return jt == it->second.end() ? nullptr : jt->second.get();
}

Slice* SliceTable::Find(uint64_t key, uint32_t slice) const {
  auto it = keys_.find(key);
  if (it == keys_.end()) return nullptr;
  auto jt = it->second.find(slice);
  return jt == it->second.end() ? nullptr : jt->second.get();
}

Status SliceTable::Describe404(uint64_t key, uint32_t slice) const {
  if (installed_.empty()) {
    return FailedPreconditionError("unknown key " + std::to_string(key) +
                                   ": no shard map installed on server " +
                                   std::to_string(server_rank_) + " yet");
  }
  auto it = all_keys_.find(key);
  if (it == all_keys_.end()) {
    return NotFoundError("unknown key " + std::to_string(key) + " (not in the shard map)");
  }
  const auto& ks = *it->second.shards;
  std::string name = SliceName(key, it->second.name, slice);
  if (slice >= static_cast<uint32_t>(ks.slices_size())) {
    return NotFoundError("unknown " + name + ": the key has " +
                         std::to_string(ks.slices_size()) + " slices");
  }
  return NotFoundError(name + " is held by server " +
                       std::to_string(ks.slices(slice).server()) + ", not server " +
                       std::to_string(server_rank_));
}

std::vector<Slice*> SliceTable::All() const {
  std::vector<Slice*> all;
  all.reserve(static_cast<size_t>(num_slices_));
  for (const auto& [key, slices] : keys_) {
    for (const auto& [index, s] : slices) all.push_back(s.get());
  }
  return all;
}

}  // namespace trellis
