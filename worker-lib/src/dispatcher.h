// The sending half of a worker: the priority queue of slices (SliceQueue, P3-style), draining it
// into the servers' connections with small slices bulked, and turning answers into completed
// parts and the traffic figures. Threads: whoever queues or frees a place drains (Pump); no
// thread of its own. dispatcher.cc says how places and bulks work.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/process/byte_ledger.h"
#include "worker-lib/src/op_request.h"
#include "worker-lib/src/server_set.h"
#include "worker-lib/src/slice_metrics.h"
#include "worker-lib/src/slice_queue.h"
#include "worker-lib/src/worker_compression.h"
#include "worker-lib/src/worker_metrics.h"
#include "worker-lib/src/worker_setup.h"

namespace trellis {

class Dispatcher {
 public:
  // Everything passed outlives the dispatcher; `ledger` may be null (no agent's byte ledger).
  Dispatcher(const BulkingOptions& bulking, int water_mark, ServerSet& servers,
             WorkerCompression& compression, WorkerMetrics& series, SliceMetrics& slice_metrics,
             ByteLedger* ledger);
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Queues an operation's tasks at `priority` and sends what the water mark allows.
  void Enqueue(int priority, std::vector<SliceTask> tasks);
  // Nothing is sent any more; the operations of queued slices fail (CANCELLED).
  void Close();

  // Scheduling figures (tests, metrics): queue depth per priority band, places taken.
  std::array<size_t, SliceQueue<int>::kBands> queued_by_band() const {
    return queue_.queued_by_band();
  }
  int in_flight() const { return queue_.in_flight(); }
  uint64_t bulks_sent() const { return bulks_sent_.load(); }
  // This worker's answered traffic.
  uint64_t bytes_pushed() const { return bytes_pushed_.load(); }
  uint64_t bytes_pulled() const { return bytes_pulled_.load(); }

 private:
  void Pump();
  void DrainQueue();  // Pump's body: only ever one thread in it
  bool Bulkable(const SliceTask& t) const;
  std::function<void()> PlaceReleaser();
  SliceReply ReplyFor(const SliceTask& task, std::function<void()> release);
  // A slice answered (whatever the payload): round-trip time and pushed bytes.
  void Answered(SliceClock::time_point dispatched, uint64_t push_bytes);
  // A pull's bytes arrived (in `out`).
  void Pulled(uint64_t bytes);
  void Dispatch(SliceTask task);
  void DispatchBulk(std::vector<SliceTask> tasks);

  const BulkingOptions bulking_;
  ServerSet& servers_;
  WorkerCompression& compression_;
  WorkerMetrics& series_;
  SliceMetrics& slice_metrics_;
  ByteLedger* const ledger_;

  SliceQueue<SliceTask> queue_;
  std::atomic<bool> closed_{false};
  std::atomic<int> pump_requests_{0};  // Pump calls not yet covered by a drain (0: none runs)
  std::atomic<uint64_t> bytes_pushed_{0};
  std::atomic<uint64_t> bytes_pulled_{0};
  std::atomic<uint64_t> bulks_sent_{0};
};

}  // namespace trellis
