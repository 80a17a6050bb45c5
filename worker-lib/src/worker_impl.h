// The Worker implementation over one set of parameter servers, made from a WorkerSetup
// (worker_setup.h). It composes one object per idea:
//   KeyTable          the declared keys, the declaration rounds, the keys a shard map placed
//   StepGate          whether an operation may start and which step it belongs to
//   OpBuilder         an operation's wire op, priority, handle state and slices
//   WorkerCompression which pushes go compressed and how; the compression figures
//   ServerSet         the servers: their addresses, connections and the shard map's install
//   Dispatcher        the priority queue and the sending of slices, answers, traffic figures
//   DeadlineWatch     the operations' deadlines
//   WorldSwitch       elastic jobs: the world this worker is in, switched at a step boundary
// and holds what is left: the barrier generations, the progress reports, the metrics registry.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/base/mutex.h"
#include "common/metrics/metrics.h"
#include "common/process/byte_ledger.h"
#include "trellis/trellis.h"
#include "worker-lib/src/deadline_watch.h"
#include "worker-lib/src/dispatcher.h"
#include "worker-lib/src/key_table.h"
#include "worker-lib/src/op_builder.h"
#include "worker-lib/src/op_request.h"
#include "worker-lib/src/progress_reporter.h"
#include "worker-lib/src/server_set.h"
#include "worker-lib/src/slice_metrics.h"
#include "worker-lib/src/slice_queue.h"
#include "worker-lib/src/step_gate.h"
#include "worker-lib/src/worker_compression.h"
#include "worker-lib/src/worker_metrics.h"
#include "worker-lib/src/worker_setup.h"
#include "worker-lib/src/world_switch.h"

namespace trellis {

StatusOr<std::unique_ptr<Worker>> CreateWorker(WorkerSetup setup);

class WorkerImpl final : public Worker {
 public:
  explicit WorkerImpl(WorkerSetup setup);
  ~WorkerImpl() override;

  int rank() const override { return world_->rank(); }
  int size() const override { return world_->size(); }
  WorldView world() const override { return world_->view(); }
  // Elastic jobs: the step boundary after `step` (the checkpointer's Commit): a resize under way
  // is reported, and takes effect here when this is its boundary (world_switch.h).
  Status AtStepBoundary(int64_t step) { return world_->AtBoundary(step); }
  // Growing (world_switch.h): a worker outside the world it starts in joins a grow under way;
  // the first step of the world it joined (0: none); once it holds the members' commit of the
  // step before, the servers told.
  Status Join() { return setup_.join_grows ? world_->Join() : Status::Ok(); }
  int64_t JoinedFrom() const { return world_->joined_from(); }
  Status AnnounceJoined() { return world_->AnnounceJoined(); }
  int num_servers() const override { return servers_.size(); }
  const CheckpointConfig& checkpoint_config() const override { return setup_.checkpoint; }

  Status DeclareKey(const KeyDecl& key) override { return keys_.DeclareKey(key); }
  Status FinishDeclarations() override;
  Handle PushPull(KeyId key, const float* grad, float* out, int priority,
                  Callback done) override;
  Handle Push(KeyId key, const float* grad, int priority, Callback done) override;
  Handle Pull(KeyId key, float* out, int priority, Callback done) override;
  Handle Broadcast(KeyId key, float* data, int root) override;
  Status Barrier(const std::string& name) override EXCLUDES(barrier_mu_);
  // The rank's: what its agent's earlier (killed, restarted) programs moved, plus this worker's.
  uint64_t bytes_pushed() const override { return ended_pushed_ + dispatch_.bytes_pushed(); }
  uint64_t bytes_pulled() const override { return ended_pulled_ + dispatch_.bytes_pulled(); }
  CompressionStats compression_stats() const override { return compression_.stats(); }
  Status ReportProgress(int64_t step, int64_t samples, double loss) override {
    return progress_.Report(step, samples, loss);
  }
  Status SetTotalSteps(int64_t total_steps) override { return progress_.SetTotalSteps(total_steps); }
  int64_t progress_reports_sent() const { return progress_.reports_sent(); }

  // Scheduling figures (tests, metrics): queue depth per priority band, places taken.
  std::array<size_t, SliceQueue<int>::kBands> queued_by_band() const {
    return dispatch_.queued_by_band();
  }
  int slices_in_flight() const { return dispatch_.in_flight(); }
  uint64_t bulks_sent() const { return dispatch_.bulks_sent(); }
  const MetricsRegistry& metrics() const { return *metrics_; }
  // Sends one server-wide request (wire::Op::kSave / kLoad / kRejoin / kWorld) to every server;
  // the handle completes when all answered (checkpointer.cc). `key` goes in the header's key
  // field; `payload` (kWorld's members) after the header.
  Handle ServerCommand(wire::Op op, int64_t step, uint64_t key,
                       std::shared_ptr<const std::vector<uint8_t>> payload = nullptr);
  // The process's registry (checkpointer.cc registers its series in it).
  MetricsRegistry& registry() const { return *metrics_; }

  // Crash recovery, used by the checkpointer (rejoin_keeper.cc).
  const WorkerSetup& setup() const { return setup_; }
  // kStash: `data` to every slice of `key` under rejoin `id`; kFetch: those values into `data`.
  Handle Transfer(wire::Op op, KeyId key, uint64_t id, float* data);
  // Every key's push count so far (the server's step of its latest push), by key id.
  std::vector<std::pair<KeyId, int64_t>> PushSteps() const { return keys_.PushSteps(); }
  // A rejoiner continues the donor's counts. Keys absent here are an error naming them.
  // REQUIRES: no operation in flight.
  Status SetPushSteps(const std::vector<std::pair<KeyId, int64_t>>& steps) {
    return keys_.SetPushSteps(steps);
  }

 private:
  // Checks, numbers, builds and launches one operation of a key.
  Handle Start(OpRequest request);
  // Watches the operation's deadline and queues its slices.
  Handle Launch(Operation op);

  const WorkerSetup setup_;
  const std::shared_ptr<MetricsRegistry> metrics_;  // setup_.metrics or one of its own
  WorkerMetrics series_;                             // this worker's series on metrics_
  SliceMetrics slice_metrics_;                       // registered in metrics_
  // The agent's byte ledger (common/process/byte_ledger.h; null: none), and what the rank's
  // earlier programs had moved when this worker was made.
  ByteLedger* const ledger_ = ByteLedger::ForThisProgram();
  const uint64_t ended_pushed_ = ledger_ != nullptr ? ledger_->ended_pushed() : 0;
  const uint64_t ended_pulled_ = ledger_ != nullptr ? ledger_->ended_pulled() : 0;

  WorkerCompression compression_;
  KeyTable keys_;
  StepGate gate_;
  OpBuilder builder_;
  ServerSet servers_;
  Dispatcher dispatch_;
  DeadlineWatch deadlines_;
  // Shared with the scheduler watch's resize listener (a weak reference: it may outlive us).
  const std::shared_ptr<WorldSwitch> world_;

  Mutex barrier_mu_;
  std::map<std::string, int64_t> barrier_generation_ GUARDED_BY(barrier_mu_);

  // Time the program spent blocked in Wait() and Barrier(), in ns (ReportProgress's busy time).
  const std::shared_ptr<std::atomic<int64_t>> wait_ns_ = std::make_shared<std::atomic<int64_t>>(0);
  ProgressReporter progress_;  // declared last: its thread stops first
};

}  // namespace trellis
