// Which server holds which slice of which key, for the running job: the workers' key
// declarations that build the shard map (shard_map.h) once all agree, the rounds of keys
// declared after training started (deferred init) that extend it, and a map handed back by a
// worker after a scheduler restart. The map only changes here.
//
// Not thread-safe: SchedulerState calls it with its one lock held. Replies are never called
// here; they go into the caller's Deferred, to run once the lock is released.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "scheduler/clock.h"
#include "scheduler/deferred.h"
#include "scheduler/scheduler_config.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

class ShardAssignment {
 public:
  using TimePoint = Clock::TimePoint;
  using KeyPtrs = std::vector<const v1::KeySpec*>;
  using MapReply = Reply<std::shared_ptr<const v1::ShardMap>>;

  // `config` outlives the assignment.
  explicit ShardAssignment(const SchedulerConfig& config) : config_(config) {}

  // Worker `rank` declares `keys` (sorted by id and valid; nullptr: the same keys as the first
  // accepted declaration). Every worker gets the same map once all declared equal keys; a
  // mismatch fails every waiting and later declaration with FAILED_PRECONDITION naming the first
  // differing key. Keys differing from a built map's open a deferred-init round (Extend).
  // Returns true when the keys equal the first accepted declaration (they may still wait).
  // REQUIRES: the caller checked the worker (registered), the job (not failed) and shutdown.
  bool Declare(int32_t rank, const KeyPtrs* keys, TimePoint deadline, MapReply done,
               Deferred* deferred);
  // A map a worker hands back after a scheduler restart (Resume): installed when there is none,
  // else it must equal the installed one. Declarations waiting for it are answered.
  Status Install(int32_t rank, const v1::ShardMap& map, Deferred* deferred);
  bool has_map() const { return shard_map_ != nullptr; }
  // Whether keys declared after training started are being added (a round open).
  bool extending() const { return ext_rank_ >= 0; }
  // A server resize decided (world `world_epoch`, `servers` servers): the map's keys laid out
  // on them (RelayoutShardMap), which every later declaration gets. FAILED_PRECONDITION: no map
  // yet, or a deferred-init round open.
  StatusOr<std::shared_ptr<const v1::ShardMap>> Relayout(int32_t servers, int64_t world_epoch);

  // Declarations past their deadline fail (naming who did not declare).
  void Sweep(TimePoint now, Deferred* deferred);
  // Every waiting declaration fails with `status` (the job failed; shutdown).
  void FailAll(const Status& status, Deferred* deferred);
  TimePoint NextDeadline() const;
  size_t waiters() const { return declare_waiters_.size() + ext_waiters_.size(); }

 private:
  struct DeclareWaiter {
    int32_t rank;
    TimePoint deadline;
    MapReply done;
  };

  std::string KeyMismatch(int32_t rank_a, const KeyPtrs& a, int32_t rank_b,
                          const KeyPtrs& b) const;
  std::string MissingDeclarers() const;
  // Deferred init: `keys` (sorted) differ from the map's keys. Joins or opens the round.
  void Extend(int32_t rank, const KeyPtrs& keys, TimePoint deadline, MapReply done,
              Deferred* deferred);
  // "key 9 "late", key 10" : the open round's keys that are not in the map (at most 5 named).
  std::string AddedKeys() const;
  void CloseExtension(const Status& status, Deferred* deferred);

  const SchedulerConfig& config_;

  // Key declaration: the first declaration is the reference every later one must equal.
  std::vector<v1::KeySpec> reference_keys_;  // sorted by id
  KeyPtrs reference_ptrs_;                   // into reference_keys_
  int32_t reference_rank_ = -1;
  std::set<int32_t> declared_ranks_;
  std::shared_ptr<const v1::ShardMap> shard_map_;  // built once, then only extended
  Status keys_error_;                              // sticky once set
  std::vector<DeclareWaiter> declare_waiters_;

  // Keys declared after the map was built (deferred init), one round at a time: a worker
  // declares all its keys again, the map's plus the new ones. The round's declaration (from its
  // first declarer), who declared it, and who waits. Rounds fail alone; the map is untouched.
  std::vector<v1::KeySpec> ext_keys_;  // sorted by id
  KeyPtrs ext_ptrs_;                   // into ext_keys_
  int32_t ext_rank_ = -1;              // -1: no round open
  std::set<int32_t> ext_ranks_;
  std::vector<DeclareWaiter> ext_waiters_;
};

}  // namespace trellis
