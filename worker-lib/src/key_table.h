// The keys of one worker: what the program declared (DeclareKey) and, once the scheduler's shard
// map placed them, their KeyStates. Declaration goes in rounds: the first FinishDeclarations
// places every key; a later one (deferred init) places the keys declared since, which until then
// are "late" (an operation on one says to call FinishDeclarations again).
//
// Keys only grow; a KeyState never moves or goes away, so a pointer found under the lock stays
// valid without it. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "trellis/trellis.h"
#include "trellis/v1/scheduler.pb.h"
#include "worker-lib/src/key_state.h"

namespace trellis {

class KeyTable {
 public:
  // Sets a newly placed key's push encoding (WorkerCompression::ChooseEncoding).
  using ChooseEncoding = std::function<Status(KeyState*)>;
  // The scheduler's placement of every declared key (WorkerSetup::declare).
  using Declare = std::function<StatusOr<v1::ShardMap>(const std::vector<v1::KeySpec>&)>;
  // Hands a checked map to the servers; `first`: the first round (ServerSet::Open), else a
  // later one (ServerSet::InstallShardMap).
  using Install = std::function<Status(const v1::ShardMap& map, bool first)>;

  // A map must be for `num_servers` servers and, when `slice_bytes_override` > 0, that slice size.
  KeyTable(int32_t num_servers, int64_t slice_bytes_override, ChooseEncoding choose_encoding);
  KeyTable(const KeyTable&) = delete;
  KeyTable& operator=(const KeyTable&) = delete;

  Status DeclareKey(const KeyDecl& key) EXCLUDES(decl_mu_);
  // One declaration round: every declared key to `declare`, the map checked against the
  // declarations, `install`ed, then its new keys placed here. After a failed later round the
  // keys it added are undeclared again (the program may declare them again).
  Status FinishDeclarations(const Declare& declare, const Install& install) EXCLUDES(decl_mu_);
  // A round succeeded once: operations may start.
  bool finished() const { return finished_.load(); }

  // The placed key, or null: undeclared, or declared after the last round (Late).
  KeyState* Find(KeyId key) const EXCLUDES(keys_mu_);
  bool Late(KeyId key) const EXCLUDES(keys_mu_);

  // A slice a server resize moves: the key's, from server `from` to server `to`.
  struct SliceMoveOf {
    const KeyState* key;
    uint32_t slice;
    int32_t from;
    int32_t to;
  };
  // A server resize (docs/elastic.md#servers): every placed key's slices go to the servers `map`
  // gives them, and later maps are for its servers. Returns the slices whose server changed.
  // `map` must lay out exactly the placed keys, sliced as they are (INTERNAL naming the first
  // that is not; nothing changes then). REQUIRES: no operation in flight (a step boundary).
  StatusOr<std::vector<SliceMoveOf>> Relayout(const v1::ShardMap& map) EXCLUDES(decl_mu_, keys_mu_);

  // Every key's push count so far, by key id (crash recovery: a donor's counts).
  std::vector<std::pair<KeyId, int64_t>> PushSteps() const EXCLUDES(keys_mu_);
  // A rejoiner continues the donor's counts. Keys absent here are an error naming them.
  Status SetPushSteps(const std::vector<std::pair<KeyId, int64_t>>& steps) EXCLUDES(keys_mu_);

 private:
  Status RoundLocked(bool first, const Declare& declare, const Install& install)
      REQUIRES(decl_mu_);
  // The KeyStates of `map`'s keys new to this worker (all of them the `first` time), checked
  // against the declarations.
  StatusOr<std::vector<std::unique_ptr<KeyState>>> PlaceLocked(const v1::ShardMap& map,
                                                              bool first) REQUIRES(decl_mu_);

  std::atomic<int32_t> num_servers_;  // the servers in force (a server resize changes it)
  const int64_t slice_bytes_override_;
  const ChooseEncoding choose_encoding_;

  // Held for a whole round, the scheduler's and the servers' calls included: one at a time.
  Mutex decl_mu_ ACQUIRED_BEFORE(keys_mu_);
  std::map<KeyId, KeyDecl> declared_ GUARDED_BY(decl_mu_);
  std::atomic<bool> finished_{false};  // the first round succeeded
  mutable SharedMutex keys_mu_;  // shared: a lookup (every operation); exclusive: a round's end
  std::unordered_map<KeyId, std::unique_ptr<KeyState>> keys_ GUARDED_BY(keys_mu_);
  std::set<KeyId> late_ GUARDED_BY(keys_mu_);  // declared after the first map, not in one yet
};

}  // namespace trellis
