// The key-shard map: which server holds which slice of which key. A pure function of the
// declared keys and the job's settings, so every worker (and a restarted scheduler) computes
// the same map from the same input.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

inline constexpr std::string_view kDispatchRoundRobin = "roundRobin";
inline constexpr std::string_view kDispatchHash = "hash";
inline constexpr std::string_view kDispatchBalanced = "balanced";

// A peer could ask for billions of slices (huge key, tiny slices); refuse instead of running
// out of memory.
inline constexpr int64_t kMaxTotalSlices = 50'000'000;

// Bytes per element; 0 for DTYPE_UNSPECIFIED or an unknown value.
int64_t DTypeSize(v1::DType dtype);
// "float32"; "dtype(N)" for unknown values.
std::string DTypeName(v1::DType dtype);

// The fixed hash of the `hash` dispatcher: SplitMix64's finalizer of the key id
// (Steele, Lea, Flood 2014). Stable across platforms and releases, unlike std::hash.
uint64_t SplitMix64(uint64_t x);

// Checks one worker's declaration on its own: ids unique, num_elements >= 1, dtype known.
Status ValidateKeys(const std::vector<v1::KeySpec>& keys);
// Same, for keys already sorted by id (no copies: the scheduler checks 10^4-key declarations
// from every worker).
Status ValidateSortedKeys(const std::vector<const v1::KeySpec*>& sorted);
// Pointers to `keys`, sorted by id.
std::vector<const v1::KeySpec*> SortedById(const google::protobuf::RepeatedPtrField<v1::KeySpec>& keys);
std::vector<const v1::KeySpec*> SortedById(const std::vector<v1::KeySpec>& keys);

// Checks the dispatcher name, the number of servers (>= 1) and slice_bytes (>= 4 and a multiple
// of every element size in use).
Status ValidateShardSettings(std::string_view dispatch, int32_t num_servers, int64_t slice_bytes);

// Checks a map handed back by a worker after a scheduler restart against the job's settings:
// same servers, dispatch and slice size; keys valid and sorted by id; each key's slices
// numbered 0.., contiguous, covering the key, on servers in range.
Status ValidateShardMap(const v1::ShardMap& map, int32_t num_servers, std::string_view dispatch,
                        int64_t slice_bytes);
// The map's deterministic encoding: equal maps give equal bytes.
std::string ShardMapBytes(const v1::ShardMap& map);

// A key of at least kHalvedKeyMinBytes that would make one or two slices is cut into two
// halves: the server sums and answers the first while the second is still on the wire, where
// one slice is received whole before its answer starts back (a 1 MiB key alone went from
// 0.57-0.70x to 0.88-1.14x of a TCP echo, docs/performance.md). Not above
// kHalvedKeyMaxSliceBytes: a sliceBytes that large asks for whole tensors.
inline constexpr int64_t kHalvedKeyMinBytes = 1 << 20;
inline constexpr int64_t kHalvedKeyMaxSliceBytes = 8 << 20;
// The elements per slice of key k (the last slice shorter).
int64_t SliceElements(const v1::KeySpec& k, int64_t slice_bytes);

// Builds the map. Keys are sorted by id first, so the declaration order does not matter.
// Every key is cut into slices of SliceElements (the last one shorter). Then:
//   roundRobin: slice j of the global sequence (all keys in id order, their slices in order)
//               goes to server j mod S (the P3 rule);
//   hash:       every slice of key k goes to server SplitMix64(k.id) mod S;
//   balanced:   slices, largest first (ties: lower key id, then lower slice index), each onto
//               the least-loaded server so far (ties: lowest rank). The busiest server then
//               holds at most ceil(total/S) + the largest slice.
// server_bytes reports the bytes assigned to each server.
StatusOr<v1::ShardMap> BuildShardMap(std::vector<v1::KeySpec> keys, int32_t num_servers,
                                     std::string_view dispatch, int64_t slice_bytes);

// Adds keys declared after `base` was built (deferred init). The slices of `base` never move
// (their servers hold their state); the added keys are laid out by BuildShardMap as a map of
// their own with base's settings (roundRobin starts again at server 0 for them) and merged in
// id order. An added id already in `base` is INVALID_ARGUMENT.
StatusOr<v1::ShardMap> ExtendShardMap(const v1::ShardMap& base, std::vector<v1::KeySpec> added);

// A server resize's map (docs/elastic.md#servers): base's keys, sliced as in base, laid out
// afresh on `num_servers` with base's dispatch, in force from world `world_epoch`.
StatusOr<v1::ShardMap> RelayoutShardMap(const v1::ShardMap& base, int32_t num_servers,
                                        int64_t world_epoch);

}  // namespace trellis
