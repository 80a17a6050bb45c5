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
    if (!installed_.empty()) {
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
    map_ = map;
    all_keys_.clear();
    for (const auto& ks : map_.keys()) {
      const auto& k = ks.key();
      all_keys_[k.id()] = KeyInfo{k.name(), &ks};
      for (const auto& sa : ks.slices()) {
        if (sa.server() != server_rank_ || keys_[k.id()].count(sa.index()) != 0) continue;
        keys_[k.id()][sa.index()] = std::make_unique<Slice>(
            k.id(), sa.index(), SliceName(k.id(), k.name(), sa.index()), sa.num_elements(),
            slots_, worlds_->Current());
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
    bool same = ks.key().name() == old.key().name() &&
                ks.key().num_elements() == old.key().num_elements() &&
                ks.key().dtype() == old.key().dtype() && ks.slices_size() == old.slices_size();
    for (int i = 0; same && i < ks.slices_size(); ++i) {
      const auto& a = ks.slices(i);
      const auto& b = old.slices(i);
      same = a.index() == b.index() && a.offset() == b.offset() &&
             a.num_elements() == b.num_elements() && a.server() == b.server();
    }
    if (!same) return differs("key " + std::to_string(old.key().id()) + " is laid out otherwise");
  }
  return Status::Ok();
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
