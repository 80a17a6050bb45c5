// LocalGroupWorker: the hierarchical exchange of a multi-GPU pod, as a layer above WorkerImpl.
//
// The pod's G processes (local ranks) form a LocalGroup. Each user key K of n elements is cut
// into G contiguous parts (LocalPart); part l is a key of its own towards the servers, with id
// K * G + l, pushed and pulled only by local rank l through its inner worker (rank = pod,
// size = pods). So the servers count pods as their workers, every local rank declares the same
// part keys (the scheduler sees one declaration per pod, repeated G times), and priority order
// and compression in WorkerImpl apply to the part each local rank sends.
//
//   PushPull: reduce-scatter inside the pod -> PushPull of the own part -> all-gather.
//   Push / Pull: the first / second half of that.
//   Broadcast(root): the root's pod broadcasts locally from the root, every local rank then
//     broadcasts its part across pods (seeding the servers), the other pods all-gather.
//   Barrier: local, then local rank 0 in the cross-pod barrier, then local again.
//
// Collectives must run in the same order on every local rank, so each channel has one thread:
// "trellis-lreduce" runs reduce-scatters, local broadcasts and starts the inner operations in
// program order; "trellis-lgather" runs the all-gathers in program order, each after its own
// inner operation completed. Global rank = pod * G + local rank; size = pods * G.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "common/base/mutex.h"
#include "common/metrics/metrics.h"
#include "trellis/trellis.h"
#include "worker-lib/src/local_group.h"

namespace trellis {

struct LocalGroupSetup {
  int32_t pod_rank = 0;
  int32_t num_pods = 1;
  std::unique_ptr<Worker> inner;         // rank pod_rank of num_pods
  std::unique_ptr<LocalGroup> reduce;    // channel "rs"
  std::unique_ptr<LocalGroup> gather;    // channel "ag"
  std::shared_ptr<MetricsRegistry> metrics;  // optional: the process's registry
};

StatusOr<std::unique_ptr<Worker>> CreateLocalGroupWorker(LocalGroupSetup setup);

class WorkerImpl;
// The worker made by Worker::Create behind `w` (itself, or a multi-GPU pod's local rank's inner
// worker), whose setup holds the scheduler's hooks (job stopping, checkpoint reports); null for
// workers of another kind (built by hand in tests).
WorkerImpl* SchedulerWorkerOf(Worker& w);

class LocalGroupWorker final : public Worker {
 public:
  explicit LocalGroupWorker(LocalGroupSetup setup);
  ~LocalGroupWorker() override;

  int rank() const override { return pod_ * g_ + local_; }
  int size() const override { return pods_ * g_; }
  // Elastic jobs do not take multi-GPU pods (the job spec refuses them): the world is fixed.
  WorldView world() const override { return WorldView{0, 1, rank(), size(), false}; }
  int num_servers() const override { return inner_->num_servers(); }
  const CheckpointConfig& checkpoint_config() const override {
    return inner_->checkpoint_config();
  }

  Status DeclareKey(const KeyDecl& key) override EXCLUDES(decl_mu_);
  Status FinishDeclarations() override EXCLUDES(decl_mu_);
  Handle PushPull(KeyId key, const float* grad, float* out, int priority,
                  Callback done) override;
  Handle Push(KeyId key, const float* grad, int priority, Callback done) override;
  Handle Pull(KeyId key, float* out, int priority, Callback done) override;
  Handle Broadcast(KeyId key, float* data, int root) override;
  Status Barrier(const std::string& name) override;
  uint64_t bytes_pushed() const override { return inner_->bytes_pushed(); }
  uint64_t bytes_pulled() const override { return inner_->bytes_pulled(); }
  CompressionStats compression_stats() const override { return inner_->compression_stats(); }
  // The pod reports as one worker (its pod rank): local rank 0's reports go to the scheduler.
  Status ReportProgress(int64_t step, int64_t samples, double loss) override {
    return local_ == 0 ? inner_->ReportProgress(step, samples * g_, loss) : Status::Ok();
  }
  Status SetTotalSteps(int64_t total_steps) override {
    return local_ == 0 ? inner_->SetTotalSteps(total_steps) : Status::Ok();
  }

  // The pod's worker towards the servers and the scheduler (rank pod_rank of num_pods).
  Worker& inner() { return *inner_; }
  const char* group_kind() const { return reduce_->kind(); }
  MetricsRegistry& metrics() { return *metrics_; }

 private:
  struct Op;
  using Task = std::function<void()>;
  // One FIFO and its thread per channel.
  struct Lane {
    Mutex mu;
    CondVar cv;
    std::deque<Task> tasks GUARDED_BY(mu);
    bool stop GUARDED_BY(mu) = false;
    std::thread thread;
  };

  Handle Submit(const char* verb, KeyId key, const float* src, float* dst, int priority,
                Callback done, int broadcast_root);
  static Handle Failed(const Status& st, Callback done);
  static void Enqueue(Lane& lane, Task task);
  static void RunLane(Lane& lane, const char* name);
  static void StopLane(Lane& lane);
  KeyId PartKey(KeyId key) const { return key * static_cast<KeyId>(g_) + local_; }
  // The declared key, or null. REQUIRES: finished_ (keys_ no longer changes).
  const KeyDecl* FrozenKey(KeyId key) const;

  const int32_t pod_, pods_;
  const int local_, g_;
  std::unique_ptr<Worker> inner_;
  std::unique_ptr<LocalGroup> reduce_;  // used only on reduce_lane_'s thread
  std::unique_ptr<LocalGroup> gather_;  // used only on gather_lane_'s thread

  Mutex decl_mu_;
  // Written under decl_mu_ until finished_, then frozen and read without it (FrozenKey).
  std::map<KeyId, KeyDecl> keys_ GUARDED_BY(decl_mu_);
  std::atomic<bool> finished_{false};

  // Local collective time and bytes (bytes: this rank's tensor), registered once at start-up
  // (docs/multi-gpu.md, Metrics).
  const std::shared_ptr<MetricsRegistry> metrics_;
  prometheus::Histogram& reduce_seconds_;
  prometheus::Histogram& gather_seconds_;
  prometheus::Counter& reduce_bytes_;
  prometheus::Counter& gather_bytes_;
  prometheus::Counter& broadcast_bytes_;

  Lane reduce_lane_;
  Lane gather_lane_;
};

}  // namespace trellis
