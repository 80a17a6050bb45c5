// From an admitted operation to what the dispatcher sends: its wire op and priority (OpPlan),
// the handle's state (what it is called, its deadline, its completion), and one SliceTask per
// slice of the key, or per server for a server-wide command.
#pragma once

#include <climits>
#include <cstdint>
#include <memory>
#include <vector>

#include "worker-lib/src/key_state.h"
#include "worker-lib/src/op_request.h"
#include "worker-lib/src/op_state.h"
#include "worker-lib/src/worker_compression.h"
#include "worker-lib/src/worker_metrics.h"

namespace trellis {

// How an operation of a step goes on the wire.
struct OpPlan {
  wire::Op op;     // the request's op in its wire form (2-bit, packed: WorkerCompression::WireOp)
  int priority;    // 0 for all but broadcasts when the job turned priorities off
  bool compressed; // a push whose slices go as encoded frames
};

// An operation ready to go: its state and its slices.
struct Operation {
  std::shared_ptr<Handle::State> state;
  int priority = 0;
  std::vector<SliceTask> tasks;
};

class OpBuilder {
 public:
  // Broadcast, init and server commands go before any training traffic.
  static constexpr int kBroadcastPriority = INT_MAX - 1;

  OpBuilder(int64_t timeout_ms, bool priority_enabled, const WorkerCompression& compression,
            WorkerMetrics& series)
      : timeout_ms_(timeout_ms),
        priority_enabled_(priority_enabled),
        compression_(compression),
        series_(series) {}

  OpPlan Plan(const KeyState& k, const OpRequest& r, int64_t step) const;
  // The handle's state for `r` of `step`: its deadline from now; `done` runs after the
  // operation's latency and outcome went to the metrics.
  std::shared_ptr<Handle::State> NewOperation(const KeyState& k, const OpRequest& r,
                                              const OpPlan& plan, int64_t step,
                                              Callback done) const;
  // One task per slice of `k`; `frames`: the slices' encoded pushes when plan.compressed.
  Operation Slices(const KeyState& k, const OpRequest& r, const OpPlan& plan, int64_t step,
                   std::shared_ptr<Handle::State> state,
                   std::vector<WorkerCompression::Frame> frames) const;
  // One request to each of `num_servers` servers (wire::Op::kSave, kLoad, kRejoin, kWorld);
  // `key` goes in the header's key field, `payload` (optional) after the header.
  Operation ServerCommand(wire::Op op, int64_t step, uint64_t key, size_t num_servers,
                          std::shared_ptr<const std::vector<uint8_t>> payload = nullptr) const;

 private:
  const int64_t timeout_ms_;
  const bool priority_enabled_;
  const WorkerCompression& compression_;
  WorkerMetrics& series_;
};

}  // namespace trellis
