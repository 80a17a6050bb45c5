// Picks the local group's implementation at run time: NCCL when it was built (CUDA present at
// build time) and this process sees a device per local rank, else shared memory.
#include "worker-lib/src/local_group.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "common/config/env_names.h"
#include "common/base/logging.h"

#ifdef TRELLIS_HAVE_NCCL
#include "worker-lib/cuda/nccl_local_group.h"
#include "worker-lib/cuda/twobit_cuda.h"
#endif

namespace trellis {

namespace {

// Without a scheduler: rank 0's key crosses a small shm group as floats (copied bitwise),
// the first word holding the length.
StatusOr<std::string> ExchangeOverShm(const LocalGroupOptions& options, const std::string& key) {
  LocalGroupOptions boot = options;
  boot.channel += "-id";
  boot.chunk_bytes = 4096;
  boot.exchange_key = nullptr;
  TRELLIS_ASSIGN_OR_RETURN(auto group, OpenShmLocalGroup(boot));
  std::vector<float> words(1 + kMaxGroupKeyBytes / sizeof(float));
  if (options.rank == 0) {
    const uint32_t n = static_cast<uint32_t>(key.size());
    std::memcpy(words.data(), &n, sizeof n);
    std::memcpy(words.data() + 1, key.data(), key.size());
  }
  TRELLIS_RETURN_IF_ERROR(group->Broadcast(words.data(), static_cast<int64_t>(words.size()), 0));
  uint32_t n = 0;
  std::memcpy(&n, words.data(), sizeof n);
  if (n > kMaxGroupKeyBytes) return InternalError("local group key length " + std::to_string(n));
  return std::string(reinterpret_cast<const char*>(words.data() + 1), n);
}

}  // namespace

StatusOr<std::string> ExchangeGroupKey(const LocalGroupOptions& options, const std::string& key) {
  if (options.rank == 0 && (key.empty() || key.size() > kMaxGroupKeyBytes)) {
    return InvalidArgumentError("local group key must be 1 to " +
                                std::to_string(kMaxGroupKeyBytes) + " bytes, got " +
                                std::to_string(key.size()));
  }
  StatusOr<std::string> got =
      options.exchange_key
          ? options.exchange_key(options.name + "/" + options.channel, options.rank,
                                 options.rank == 0 ? key : std::string())
          : ExchangeOverShm(options, key);
  if (!got.ok()) {
    return got.status().Annotate("local group " + options.name + " channel " + options.channel +
                                 ": exchanging the group key");
  }
  // The key comes from a peer: check it rather than trust it.
  if (got->empty() || got->size() > kMaxGroupKeyBytes) {
    return InvalidArgumentError("local group " + options.name + ": got a key of " +
                                std::to_string(got->size()) + " bytes");
  }
  return got;
}

LocalBackendChoice ChooseLocalBackend(int devices, int group_size, bool force_cpu) {
  if (force_cpu) return {false, std::string(kEnvLocalBackend) + "=shm"};
  if (devices < 1) return {false, "no CUDA device"};
  const std::string seen = "this process sees " + std::to_string(devices) + " CUDA device" +
                           (devices == 1 ? "" : "s") + " for a local group of " +
                           std::to_string(group_size);
  if (devices < group_size) return {false, seen + " (NCCL needs one device per local rank)"};
  return {true, seen};
}

StatusOr<std::unique_ptr<LocalGroup>> OpenLocalGroup(const LocalGroupOptions& options,
                                                     bool force_cpu) {
#ifdef TRELLIS_HAVE_NCCL
  const int devices = force_cpu ? 0 : CudaDeviceCount();
#else
  const int devices = 0;
#endif
  const LocalBackendChoice choice = ChooseLocalBackend(devices, options.size, force_cpu);
#ifdef TRELLIS_HAVE_NCCL
  if (choice.nccl) {
    LocalGroupOptions o = options;
    o.exchange_key = [options](const std::string&, int, const std::string& key) {
      return ExchangeGroupKey(options, key);
    };
    return OpenNcclLocalGroup(o);
  }
#endif
  // GPUs present but too few: the user probably expected NCCL, so say why not (once: every
  // process opens a group per channel).
  static std::atomic<bool> told{false};
  if (devices > 0 && !told.exchange(true)) {
    TLOG_WARN << "local group " << options.name << ": shared memory instead of NCCL: "
              << choice.why;
  }
  return OpenShmLocalGroup(options);
}

}  // namespace trellis
