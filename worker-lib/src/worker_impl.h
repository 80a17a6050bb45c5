// The Worker implementation, independent of how the cluster was found: Worker::Create
// (worker_create.cc) fills a WorkerSetup from the environment and the scheduler; tests may fill
// one by hand (servers started in-process, a shard map built locally).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/process/byte_ledger.h"
#include "common/job/job_spec.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_http.h"
#include "scheduler/scheduler_client.h"
#include "trellis/trellis.h"
#include "trellis/v1/scheduler.pb.h"
#include "datapath/codec/half.h"
#include "datapath/codec/twobit_codec.h"
#include "worker-lib/src/op_state.h"
#include "worker-lib/src/progress_reporter.h"
#include "worker-lib/src/slice_queue.h"
#include "worker-lib/src/slice_metrics.h"
#include "worker-lib/src/threshold_advisor.h"
#include "worker-lib/src/transport.h"
#include "worker-lib/src/worker_metrics.h"

namespace trellis {

// Bulking of small slices (the job's spec.bulking; docs/job-spec.md).
struct BulkingOptions {
  bool enabled = true;
  int64_t threshold_bytes = 64 << 10;  // slices up to this size may share a message
  int64_t push_max_bytes = 1 << 20;    // per bulk going up: headers + payloads
  int32_t push_max_count = 64;
  int64_t pull_max_bytes = 1 << 20;    // per bulk of pulls: the bytes they bring back
  int32_t pull_max_count = 64;
};

struct WorkerSetup {
  int32_t rank = 0;
  int32_t num_workers = 1;
  std::vector<std::string> server_addresses;  // index = server rank
  std::string token;
  TlsPtr tls;  // TRELLIS_TLS_*: mutual TLS to the scheduler and the servers; nullptr: plaintext
  int64_t slice_bytes_override = 0;  // WorkerOptions.slice_bytes: must match the map's
  int32_t water_mark = 8;
  bool priority_enabled = true;  // off: every slice FIFO
  BulkingOptions bulking;
  int64_t timeout_ms = 120000;
  CheckpointConfig checkpoint;  // the job's spec.checkpoint
  // The job's spec.compression: with 2bit, pushes of keys that allow it are sent as 2-bit
  // frames (per-slice residuals here) once a key passed warmupSteps full-precision steps.
  CompressionSpec compression;

  // Collective declaration (the scheduler's DeclareKeys): this worker's keys -> the map.
  std::function<StatusOr<v1::ShardMap>(const std::vector<v1::KeySpec>&)> declare;
  // Barrier(name, generation).
  std::function<Status(const std::string&, int64_t)> barrier;
  // "grpc" or "tcp" (the job's spec.transport, WorkerOptions.transport); picks `connect`.
  std::string transport = "grpc";
  bool local_socket = true;  // TRELLIS_LOCAL_SOCKET (common/config/env.h)
  // Opens a server connection (default: by `transport`).
  std::function<StatusOr<std::unique_ptr<ServerConnection>>(const ConnectionOptions&)> connect;
  // The job's spec.recovery.retainPushes: keep the last two pushes per slice and, when a
  // server's connection ends, reconnect and replay them (recovering_connection.h).
  bool retain_pushes = true;
  // The current data address of server `server` (the scheduler's cluster view, waiting at most
  // `wait_ms` for it to be complete); null: addresses do not change.
  std::function<StatusOr<std::string>(int32_t server, int64_t wait_ms)> resolve_server;
  // Crash recovery (checkpointer_rejoin.cc; docs/checkpoints.md#crash-recovery-workers): this
  // process's incarnation (TRELLIS_INCARNATION: > 1 after its agent restarted it) and the
  // scheduler's rejoin calls. Hooks left unset: rejoining is off (workers built by hand).
  int64_t incarnation = 1;
  std::function<StatusOr<v1::RequestRejoinResponse>()> request_rejoin;
  // (register / long poll up to the duration / stop being a donor)
  std::function<StatusOr<v1::WatchRejoinsResponse>(SchedulerClient::WatchMode,
                                                   std::chrono::milliseconds)>
      watch_rejoins;
  std::function<Status(const v1::RejoinServedRequest&)> rejoin_served;
  // When the scheduler last said another member of the job is being restarted (a stalled or
  // crashed process, docs/scheduler.md#stalls) and which; null: never. An operation whose
  // deadline passes within one timeout of that waits on (its deadline moves) instead of failing.
  std::function<std::pair<std::chrono::steady_clock::time_point, std::string>()> peers_restarting;
  // Sends a batched progress report (the scheduler's ReportProgress); null: reports are dropped.
  std::function<Status(const v1::ReportProgressRequest&)> report_progress;
  // Kept alive as long as the worker (e.g. the scheduler client the hooks use).
  std::shared_ptr<void> keep_alive;
  // The process's metrics (job, role worker, rank); null: the worker makes its own.
  std::shared_ptr<MetricsRegistry> metrics;
  // Serves `metrics` on TRELLIS_METRICS_PORT (Worker::Create); declared after `metrics` so it
  // stops before the registry goes.
  std::shared_ptr<MetricsHttpServer> metrics_server;
};

StatusOr<std::unique_ptr<Worker>> CreateWorker(WorkerSetup setup);

class WorkerImpl final : public Worker {
 public:
  explicit WorkerImpl(WorkerSetup setup);
  ~WorkerImpl() override;

  int rank() const override { return setup_.rank; }
  int size() const override { return setup_.num_workers; }
  int num_servers() const override { return static_cast<int>(setup_.server_addresses.size()); }
  const CheckpointConfig& checkpoint_config() const override { return setup_.checkpoint; }

  Status DeclareKey(const KeyDecl& key) override;
  Status FinishDeclarations() override;
  Handle PushPull(KeyId key, const float* grad, float* out, int priority,
                  Callback done) override;
  Handle Push(KeyId key, const float* grad, int priority, Callback done) override;
  Handle Pull(KeyId key, float* out, int priority, Callback done) override;
  Handle Broadcast(KeyId key, float* data, int root) override;
  Status Barrier(const std::string& name) override;
  // The rank's: what its agent's earlier (killed, restarted) programs moved, plus this worker's.
  uint64_t bytes_pushed() const override { return ended_pushed_ + bytes_pushed_.load(); }
  uint64_t bytes_pulled() const override { return ended_pulled_ + bytes_pulled_.load(); }
  CompressionStats compression_stats() const override;
  Status ReportProgress(int64_t step, int64_t samples, double loss) override {
    return progress_.Report(step, samples, loss);
  }
  Status SetTotalSteps(int64_t total_steps) override { return progress_.SetTotalSteps(total_steps); }
  int64_t progress_reports_sent() const { return progress_.reports_sent(); }

  // Scheduling figures (tests, metrics): queue depth per priority band, places taken.
  std::array<size_t, SliceQueue<int>::kBands> queued_by_band() const {
    return queue_.queued_by_band();
  }
  int slices_in_flight() const { return queue_.in_flight(); }
  uint64_t bulks_sent() const { return bulks_sent_.load(); }
  const MetricsRegistry& metrics() const { return *metrics_; }
  // Sends one server-wide request (wire::Op::kSave / kLoad) to every server; the handle
  // completes when all answered (checkpointer.cc). `key` goes in the header's key field.
  Handle ServerCommand(wire::Op op, int64_t step, uint64_t key);
  // The process's registry (checkpointer.cc registers its series in it).
  MetricsRegistry& registry() const { return *metrics_; }

  // Crash recovery, used by the checkpointer (worker_rejoin.cc).
  const WorkerSetup& setup() const { return setup_; }
  // kStash: `data` to every slice of `key` under rejoin `id`; kFetch: those values into `data`.
  Handle Transfer(wire::Op op, KeyId key, uint64_t id, float* data);
  // Every key's push count so far (the server's step of its latest push), by key id.
  std::vector<std::pair<KeyId, int64_t>> PushSteps() const;
  // A rejoiner continues the donor's counts. Keys absent here are an error naming them.
  // REQUIRES: no operation in flight.
  Status SetPushSteps(const std::vector<std::pair<KeyId, int64_t>>& steps);

 private:
  struct SliceInfo {
    uint32_t index;
    int64_t offset;
    int64_t num_elements;
    int32_t server;
  };
  struct KeyState {
    KeyDecl decl;
    std::vector<SliceInfo> slices;
    std::atomic<int64_t> push_step{0};  // steps this worker pushed
    // Residuals per slice (by slice index) when the key's pushes are compressed, else null.
    std::unique_ptr<TwoBitCodec> codec;
    // Set when the key's pushes go as 16-bit frames (the key's wire type or the job's fp16/bf16).
    std::optional<HalfType> half;
  };
  // One slice of one operation, waiting in the queue or in flight.
  struct Task {
    std::shared_ptr<Handle::State> op;
    size_t part;
    int32_t server;
    SliceRequest request;
    float* out;  // pull destination, or nullptr
    int64_t slice_bytes;  // the slice's size (what a pull brings back)
    SliceClock::time_point enqueued;
  };

  // `tag`: the step field of kStash / kFetch (the rejoin id).
  Handle Start(const char* verb, wire::Op op, KeyId key, const float* src, float* dst,
               int priority, Callback done, bool broadcast, int64_t tag = 0);
  // Registers `st` with the watchdog, queues its tasks and pumps.
  Handle Launch(std::shared_ptr<Handle::State> st, int priority, std::vector<Task> tasks);
  static Handle Failed(const Status& st, Callback done);
  // Whether the push of `step` of key `k` goes compressed: 16-bit, or 2-bit (2bit job, key
  // allows, warm-up over).
  bool Compressed(const KeyState& k, int64_t step) const;
  // The op that carries `op` (push, pull, pushpull) of a step: its 2-bit form when `compressed`
  // (a 16-bit frame travels in the same ops), and the form that accepts a packed answer when the
  // job has packedPulls and the key is 2-bit (docs/compression.md).
  wire::Op WireOp(wire::Op op, bool compressed, bool packable) const;
  // Sets k's codec or 16-bit type from its declaration and the job's spec.compression.
  Status ChooseEncoding(KeyState* k) const;
  // One slice of a compressed push as a 2-bit frame (updates the slice's residual) or a 16-bit
  // frame.
  StatusOr<std::shared_ptr<const std::vector<uint8_t>>> EncodeSlice(KeyState& k,
                                                                    const SliceInfo& s,
                                                                    const float* src);
  // worker_dispatch.cc
  void Pump();
  void DrainQueue();  // Pump's body: only ever one thread in it
  bool Bulkable(const Task& t) const;
  std::function<void()> PlaceReleaser();
  SliceReply ReplyFor(const Task& task, std::function<void()> release);
  // A slice answered (whatever the payload): round-trip time and pushed bytes.
  void Answered(SliceClock::time_point dispatched, uint64_t push_bytes);
  void Dispatch(Task task);
  void DispatchBulk(std::vector<Task> tasks);
  void WatchdogLoop();
  std::string KeyName(const KeyState& k) const;
  KeyState* FindKey(KeyId key) const;  // null when not (yet) in the map
  // One declaration round: all declared keys to the scheduler, the new ones into keys_.
  Status DeclareRound(bool first);  // REQUIRES: decl_mu_ held

  const WorkerSetup setup_;
  const std::shared_ptr<MetricsRegistry> metrics_;  // setup_.metrics or one of its own
  WorkerMetrics series_;                             // this worker's series on metrics_
  SliceMetrics slice_metrics_;                      // registered in metrics_

  std::mutex decl_mu_;
  std::map<KeyId, KeyDecl> declared_;  // GUARDED_BY(decl_mu_)
  std::atomic<bool> finished_{false};  // the first FinishDeclarations succeeded
  std::atomic<bool> closing_{false};   // destructor started
  std::atomic<int> pump_requests_{0};  // Pump calls not yet covered by a drain (0: none runs)
  // Keys only grow (deferred init adds keys in later FinishDeclarations rounds); a KeyState
  // never moves or goes away, so a pointer found under the lock stays valid without it.
  mutable std::shared_mutex keys_mu_;
  std::unordered_map<KeyId, std::unique_ptr<KeyState>> keys_;  // GUARDED_BY(keys_mu_)
  std::set<KeyId> late_;  // GUARDED_BY(keys_mu_): declared after the first map, not in one yet
  std::vector<std::unique_ptr<ServerConnection>> servers_;     // written once under decl_mu_

  SliceQueue<Task> queue_;
  std::atomic<uint64_t> bytes_pushed_{0};
  std::atomic<uint64_t> bytes_pulled_{0};
  // The agent's byte ledger (common/process/byte_ledger.h; null: none), and what the rank's earlier
  // programs had moved when this worker was made.
  ByteLedger* const ledger_ = ByteLedger::ForThisProgram();
  const uint64_t ended_pushed_ = ledger_ != nullptr ? ledger_->ended_pushed() : 0;
  const uint64_t ended_pulled_ = ledger_ != nullptr ? ledger_->ended_pulled() : 0;
  std::atomic<uint64_t> bulks_sent_{0};
  std::atomic<uint64_t> compress_in_bytes_{0};
  std::atomic<uint64_t> compress_out_bytes_{0};
  std::atomic<uint64_t> compress_ns_{0};
  std::atomic<uint64_t> unpacked_bytes_{0};  // packed answers: their float32 size
  std::atomic<uint64_t> packed_bytes_{0};    // packed answers: their wire size
  // The same in metrics_, registered once in the constructor (docs/compression.md, Metrics).
  struct CompressionMetrics {
    prometheus::Counter* bytes_in;
    prometheus::Counter* bytes_out;
    prometheus::Histogram* seconds;  // per compressed operation (all its slices)
    prometheus::Counter* pulled_unpacked;
    prometheus::Counter* pulled_packed;
  };
  CompressionMetrics compression_metrics_;
  // Says once when the 2-bit threshold is far from the gradients (the log, a warning).
  ThresholdAdvisor threshold_advisor_{setup_.compression.threshold};

  std::mutex barrier_mu_;
  std::map<std::string, int64_t> barrier_generation_;  // GUARDED_BY(barrier_mu_)

  // Deadlines: one thread ("trellis-watch") fails operations whose deadline passed.
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  std::list<std::weak_ptr<Handle::State>> live_;  // GUARDED_BY(watch_mu_)
  bool stopping_ = false;                          // GUARDED_BY(watch_mu_)
  std::thread watchdog_;

  // Time the program spent blocked in Wait() and Barrier(), in ns (ReportProgress's busy time).
  const std::shared_ptr<std::atomic<int64_t>> wait_ns_ = std::make_shared<std::atomic<int64_t>>(0);
  ProgressReporter progress_;  // declared last: its thread stops first
};

}  // namespace trellis
