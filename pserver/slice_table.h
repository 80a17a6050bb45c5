// The shard map installed on this server and the slices of it held here. Read by every request
// (a reader's hold of its lock, so requests run in parallel), written only by an install, which
// may add keys (deferred init) or, at a server resize, lay the same slices out on other servers
// (a map of a newer world epoch): a slice that moves away is retired, still found by
// FindRetired for its handover, and one that moves in is made waiting for it
// (pserver/slice_handover.h). No slice is ever freed: a Slice* found stays valid for the table's
// life.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "pserver/slice.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

class SliceTable {
 public:
  // Slices are made for `slots` worker ranks, counting the steps of the world current then.
  SliceTable(int32_t server_rank, int32_t slots, const WorldSchedule* worlds)
      : server_rank_(server_rank), slots_(slots), worlds_(worlds) {}
  SliceTable(const SliceTable&) = delete;
  SliceTable& operator=(const SliceTable&) = delete;

  // Keeps the slices of `map` assigned to this server. Installing an equal map again is a no-op;
  // a map that adds keys to the installed one (deferred init: same settings, every installed key
  // laid out the same) adds their slices; a map of a newer world epoch with the same keys and
  // slices (a server resize; any number of servers) moves them: the slices it gives another
  // server are retired, those it gives this one are made waiting for their state
  // (SliceMove::from_server). Any other map is FAILED_PRECONDITION (every worker relays the same
  // scheduler map). *slices and *bytes: what is held here after it.
  Status Install(const v1::ShardMap& map, int64_t* slices, int64_t* bytes) EXCLUDES(mu_);

  // The table's lock; a reader's hold is enough for everything below.
  SharedMutex* mu() const RETURN_CAPABILITY(mu_) { return &mu_; }
  bool installed() const REQUIRES_SHARED(mu_) { return !installed_.empty(); }
  // The slice held here, or null.
  Slice* Find(uint64_t key, uint32_t slice) const REQUIRES_SHARED(mu_);
  // Whether the installed map has the key (held here or not).
  bool InMap(uint64_t key) const REQUIRES_SHARED(mu_) { return all_keys_.count(key) != 0; }
  // Why Find(key, slice) is null: no map yet, a key or slice the map lacks, or another server's.
  Status Describe404(uint64_t key, uint32_t slice) const REQUIRES_SHARED(mu_);
  // A slice a server resize moved away from here (its handover's source), or null.
  Slice* FindRetired(uint64_t key, uint32_t slice) const REQUIRES_SHARED(mu_);
  // Every slice a server resize moved away from here.
  std::vector<Slice*> Retired() const REQUIRES_SHARED(mu_);
  // The installed map's world epoch (v1::ShardMap::world_epoch).
  int64_t world_epoch() const REQUIRES_SHARED(mu_) { return map_.world_epoch(); }
  // Every slice held here, key by key.
  std::vector<Slice*> All() const REQUIRES_SHARED(mu_);
  int64_t num_slices() const REQUIRES_SHARED(mu_) { return num_slices_; }

 private:
  Status CheckExtension(const v1::ShardMap& map) const REQUIRES_SHARED(mu_);
  // A server resize's map: the installed keys and slices, on servers in [0, num_servers).
  Status CheckRelayout(const v1::ShardMap& map) const REQUIRES_SHARED(mu_);
  // Retires the slices held here that `map` gives another server.
  void RetireMovedAway(const v1::ShardMap& map) REQUIRES(mu_);

  const int32_t server_rank_;
  const int32_t slots_;
  const WorldSchedule* const worlds_;
  mutable SharedMutex mu_;
  std::string installed_ GUARDED_BY(mu_);  // the serialized map, for the equality check
  // key -> slice index -> the slices held here.
  std::unordered_map<uint64_t, std::unordered_map<uint32_t, std::unique_ptr<Slice>>> keys_
      GUARDED_BY(mu_);
  struct KeyInfo {
    std::string name;
    const v1::KeyShards* shards;  // points into map_
  };
  v1::ShardMap map_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, KeyInfo> all_keys_ GUARDED_BY(mu_);  // every key of the map
  int64_t num_slices_ GUARDED_BY(mu_) = 0;
  // Slices a server resize moved away (key -> slice index), and those retired twice (moved away,
  // back, and away again), kept only so that no Slice* dangles.
  std::unordered_map<uint64_t, std::unordered_map<uint32_t, std::unique_ptr<Slice>>> retired_
      GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Slice>> graveyard_ GUARDED_BY(mu_);
};

}  // namespace trellis
