// A local group: the G training processes of one pod (local ranks 0..G-1), and the three
// collectives the hierarchical exchange needs. Two implementations behind one interface:
// shared memory on the CPU (always built; local_group_shm.cc) and NCCL on GPUs (built with
// CUDA, worker-lib/cuda/nccl_local_group.*; chosen at run time when there is a device per rank).
//
// Every collective is blocking and must be called by all G ranks in the same order with the
// same element count (the same program issues them). Buffers are host memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/base/status.h"

namespace trellis {

// Local rank l's part of an n-element tensor: contiguous, the first n % G parts one longer.
// A part may be empty when n < G.
struct PartRange {
  int64_t begin = 0;
  int64_t count = 0;
};
inline PartRange LocalPart(int64_t n, int group_size, int local_rank) {
  const int64_t g = group_size, base = n / g, extra = n % g, l = local_rank;
  return {l * base + (l < extra ? l : extra), base + (l < extra ? 1 : 0)};
}

class LocalGroup {
 public:
  virtual ~LocalGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* kind() const = 0;  // "shm" or "nccl"

  // Sums `in` (n elements) over the group; this rank's part of the sum goes to `part`
  // (LocalPart(n, size, rank).count elements). Summation order is local rank 0..G-1.
  virtual Status ReduceScatter(const float* in, int64_t n, float* part) = 0;
  // Every rank gives its part (`part`, LocalPart count elements); `out` gets all n elements.
  // `part` may point into `out` at its own range.
  virtual Status AllGather(const float* part, int64_t n, float* out) = 0;
  // `root`'s n elements end up in `data` on every rank.
  virtual Status Broadcast(float* data, int64_t n, int root) = 0;
};

// Hands a group's bootstrap key (the NCCL unique id) from local rank 0 to the others: rank 0
// passes its key and gets it back, the others pass "" and get rank 0's. `group` names the group
// and channel ("<name>/<channel>"). Worker::Create wires it to the scheduler (PublishGroupKey /
// GetGroupKey, group_key_exchange.h).
using GroupKeyExchange =
    std::function<StatusOr<std::string>(const std::string& group, int rank, const std::string& key)>;

struct LocalGroupOptions {
  // Shared by the G processes and unique on the host while they run: the agent passes
  // TRELLIS_LOCAL_GROUP = <job>-<pod>-<incarnation>.
  std::string name;
  std::string channel = "0";  // one group per channel; channels run independently
  int rank = 0;
  int size = 1;
  int64_t timeout_ms = 120000;  // a peer that does not arrive in time fails the collective
  int64_t chunk_bytes = 1 << 20;  // shm staging per rank and buffer (two buffers)
  // How the NCCL group's unique id travels; unset (groups built by hand, without a scheduler):
  // over a small shm group of the same processes, channel "<channel>-id".
  GroupKeyExchange exchange_key;
};

// POSIX shared memory named LocalGroupShmName(name, channel) (common/process/local_group_name.h).
// Rank 0 unlinks the name once all G ranks have attached, so nothing is left behind even if a
// process dies later; the agent removes the names of a group that died before that.
StatusOr<std::unique_ptr<LocalGroup>> OpenShmLocalGroup(const LocalGroupOptions& options);


// Local rank 0's `key` (1..kMaxGroupKeyBytes bytes; ignored on the other ranks) on every rank:
// through options.exchange_key when set, else over an shm group "<channel>-id". No GPU needed;
// the NCCL open uses it for the unique id.
inline constexpr size_t kMaxGroupKeyBytes = 1024;
StatusOr<std::string> ExchangeGroupKey(const LocalGroupOptions& options, const std::string& key);

// Which implementation a group of `group_size` ranks gets when this process sees `devices` CUDA
// devices (0 in a build without CUDA). NCCL needs a device per rank (rank l takes device
// l % devices, and NCCL refuses two ranks on one GPU: "Duplicate GPU detected"), so a group
// larger than the devices seen, e.g. gpusPerWorker: 2 where the process sees one GPU, gets shm.
// `why` says why, for the log.
struct LocalBackendChoice {
  bool nccl = false;
  std::string why;
};
LocalBackendChoice ChooseLocalBackend(int devices, int group_size, bool force_cpu);

// The implementation ChooseLocalBackend picks (NCCL only when built with CUDA); falling back to
// shm although devices exist is logged once per process. The NCCL unique id travels by
// ExchangeGroupKey. `force_cpu` keeps the CPU path (TRELLIS_LOCAL_BACKEND=shm).
StatusOr<std::unique_ptr<LocalGroup>> OpenLocalGroup(const LocalGroupOptions& options,
                                                     bool force_cpu);

}  // namespace trellis
