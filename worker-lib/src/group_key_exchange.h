// The local group key exchange of a real pod: through the job's scheduler (PublishGroupKey /
// GetGroupKey), so the pod's processes need nothing shared but the scheduler they already talk
// to. Worker::Create puts it in LocalGroupOptions::exchange_key.
#pragma once

#include <chrono>
#include <memory>

#include "scheduler/scheduler_client.h"
#include "worker-lib/src/local_group.h"

namespace trellis {

// Local rank 0 publishes its key and gets it back; the others wait up to `wait` for it.
// The function holds `client`.
GroupKeyExchange SchedulerGroupKeyExchange(std::shared_ptr<SchedulerClient> client,
                                           std::chrono::milliseconds wait);

}  // namespace trellis
