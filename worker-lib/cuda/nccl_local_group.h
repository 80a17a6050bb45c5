// The NCCL local group: the same collectives as the shared-memory group (local_group.h), run by
// NCCL on the pod's GPUs. Buffers stay host memory (the Worker API takes host pointers and the
// parts go to the network from the host): each call stages through device buffers.
// Local rank l uses device l % CudaDeviceCount(). The NCCL unique id travels from local rank 0
// through options.exchange_key, which must be set: OpenLocalGroup sets it to ExchangeGroupKey
// (the scheduler in a real pod, else a small shared-memory group). Kept a hook so this library
// needs nothing from libtrellis.
#pragma once

#include <memory>

#include "worker-lib/src/local_group.h"

namespace trellis {

StatusOr<std::unique_ptr<LocalGroup>> OpenNcclLocalGroup(const LocalGroupOptions& options);

}  // namespace trellis
