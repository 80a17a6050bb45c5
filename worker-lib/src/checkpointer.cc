// Checkpointer: rank 0 saves the tracked tensors with common/checkpoint_dir; Restore loads on
// rank 0 and broadcasts parameters on their keys and (step, state) on one extra key. In update
// mode rank 0 also runs the servers' round: SAVE to every server before its own file (which so
// marks a complete round), LOAD of the same step before anyone pulls the weights. Crash recovery
// (per-step commits, a restarted worker rejoining) lives in rejoin_keeper.{h,cc}. When the whole
// job is stopped from outside, rank 0 writes an exit checkpoint at the next step boundary and
// waits there to be stopped (docs/checkpoints.md#stopping-a-job-the-exit-checkpoint).
#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>

#include "common/checkpoint/checkpoint_dir.h"
#include "common/base/logging.h"
#include "trellis/checkpoint.h"
#include "worker-lib/src/local_group_worker.h"
#include "worker-lib/src/rejoin_keeper.h"
#include "worker-lib/src/worker_impl.h"

namespace trellis {
namespace {

// The state key holds [step as two floats' bits][state tensors, concatenated]. A step of -1
// tells the other workers that rank 0 could not restore.
constexpr int64_t kStepSlots = 2;
constexpr int64_t kRestoreFailed = -1;

// Series of rank 0's checkpoints (docs/checkpoints.md#metrics); registered once at Create.
struct CheckpointMetrics {
  explicit CheckpointMetrics(MetricsRegistry& r)
      : save_seconds(r.Histogram("trellis_worker_checkpoint_save_seconds",
                                 "Time to save one checkpoint on rank 0, servers' files included",
                                 MetricsRegistry::LatencyBuckets())),
        size_bytes(r.Gauge("trellis_worker_checkpoint_size_bytes",
                           "Size of the newest model checkpoint file rank 0 wrote")),
        saves(r.Counter("trellis_worker_checkpoint_saves_total", "Checkpoints saved by rank 0")),
        restores(r.Counter("trellis_worker_checkpoint_restores_total",
                           "Checkpoints restored (step > 0) by rank 0")),
        rejected(r.Counter("trellis_worker_checkpoint_rejected_files_total",
                           "Checkpoint files skipped on restore: corrupt, truncated, other "
                           "version, or not loadable by the servers")) {}
  prometheus::Histogram& save_seconds;
  prometheus::Gauge& size_bytes;
  prometheus::Counter& saves;
  prometheus::Counter& restores;
  prometheus::Counter& rejected;
};

class CheckpointerImpl final : public Checkpointer {
 public:
  CheckpointerImpl(Worker& worker, WorkerImpl* impl, std::vector<TensorRef> params,
                   std::vector<TensorRef> state, CheckpointConfig config, KeyId state_key,
                   int64_t state_elements, bool rejoin)
      : worker_(worker),
        impl_(impl),
        hooks_(SchedulerWorkerOf(worker)),
        metrics_(impl != nullptr ? std::make_unique<CheckpointMetrics>(impl->registry()) : nullptr),
        params_(std::move(params)),
        state_(std::move(state)),
        config_(std::move(config)),
        state_key_(state_key),
        state_buf_(kStepSlots + state_elements) {
    // Crash recovery needs the plain worker and the scheduler's rejoin calls.
    if (rejoin && impl != nullptr && impl->setup().request_rejoin) {
      incarnation_ = impl->setup().incarnation;
      keeper_ = std::make_unique<RejoinKeeper>(*impl, params_, state_key_, state_buf_.data(),
                                               static_cast<int64_t>(state_buf_.size()));
    }
    // Whoever stops the job waits for an exit checkpoint only from a rank 0 that writes one.
    if (worker_.rank() == 0 && !config_.path.empty()) Tell(0, "", Told::kExitReady);
  }

  StatusOr<int64_t> Restore() override;
  Status Commit(int64_t step) override {
    TRELLIS_RETURN_IF_ERROR(Keep(step));
    // Elastic jobs: a resize is reported, or takes effect, at this boundary (world_switch.h).
    if (hooks_ != nullptr) TRELLIS_RETURN_IF_ERROR(hooks_->AtStepBoundary(step));
    if (worker_.world().left) return Status::Ok();  // resized away: the program stops here
    return StopsHere() ? StopForTheJob(step) : Status::Ok();
  }
  Status EndStep(int64_t step) override {
    TRELLIS_RETURN_IF_ERROR(Commit(step));
    return Due(step) && !worker_.world().left ? Save(step) : Status::Ok();
  }
  bool Due(int64_t step) const override {
    return worker_.rank() == 0 && !config_.path.empty() && config_.interval_steps > 0 &&
           step > 0 && step % config_.interval_steps == 0;
  }
  Status Save(int64_t step) override {
    TRELLIS_RETURN_IF_ERROR(Write(step, /*on_exit=*/false));
    return StopsHere() ? StopForTheJob(step) : Status::Ok();
  }
  const std::string& path() const override { return config_.path; }
  const std::string& last_file() const override { return last_file_; }
  uint64_t saves() const override { return saves_; }
  uint64_t bytes_written() const override { return bytes_written_; }

 private:
  // Rank 0: fills the tracked buffers from the newest good checkpoint; returns its step (0: none).
  StatusOr<int64_t> LoadOnRoot();
  // The collective restore: rank 0's checkpoint (or own values) to every worker.
  StatusOr<int64_t> RestoreFromRoot();
  // state_buf_ <-> the state tensors (after kStepSlots).
  void PackState();
  void UnpackState();
  void PackStep(int64_t step) { std::memcpy(state_buf_.data(), &step, sizeof(step)); }
  int64_t UnpackStep() const {
    int64_t step;
    std::memcpy(&step, state_buf_.data(), sizeof(step));
    return step;
  }

  // Rank 0, update mode: the servers' half of a round.
  Status ServersDo(wire::Op op, int64_t step) {
    return impl_->ServerCommand(op, step, state_key_).Wait();
  }
  // Update mode: the servers keep state, so every round has their half (Create refuses update
  // mode with checkpoints on a worker of another kind).
  bool ServersSave() const { return impl_ != nullptr && config_.servers_save; }
  // Copies checkpoint `c` (read from `file`) into the tracked buffers.
  Status Fill(const Checkpoint& c, const std::string& file);
  // The commit a restarted worker rejoins from (Commit without the stop check).
  Status Keep(int64_t step);
  // Rank 0 writes the checkpoint of `step` and tells the scheduler (no-op elsewhere).
  Status Write(int64_t step, bool on_exit);
  // Tells the scheduler of checkpoint `file` of `step` (the job's status shows its newest one and
  // the one it resumed from), or (kExitReady) only that rank 0 writes exit checkpoints.
  enum class Told { kWritten, kOnExit, kRestored, kExitReady };
  void Tell(int64_t step, const std::string& file, Told what);
  // Rank 0, checkpoints on, and the whole job is being stopped from outside.
  bool StopsHere() const {
    return worker_.rank() == 0 && !config_.path.empty() && hooks_ != nullptr &&
           hooks_->setup().job_stopping && hooks_->setup().job_stopping();
  }
  // The job is being stopped and the tracked tensors hold the values after `step`: the exit
  // checkpoint (unless `step` is saved already), then wait here to be stopped.
  Status StopForTheJob(int64_t step);

  Worker& worker_;
  WorkerImpl* const impl_;  // the same worker; null: a worker of another kind
  // The scheduler's hooks (stopping, reports): impl_, or a multi-GPU pod's inner worker.
  WorkerImpl* const hooks_;
  const std::unique_ptr<CheckpointMetrics> metrics_;  // null: a worker of another kind
  const std::vector<TensorRef> params_;
  const std::vector<TensorRef> state_;
  const CheckpointConfig config_;
  const KeyId state_key_;
  std::vector<float> state_buf_;
  std::string last_file_;
  int64_t last_step_ = -1;  // of last_file_: saved or restored
  uint64_t saves_ = 0;
  uint64_t bytes_written_ = 0;
  int64_t incarnation_ = 1;
  std::unique_ptr<RejoinKeeper> keeper_;  // null: crash recovery off; declared last: stops first
};

void CheckpointerImpl::PackState() {
  int64_t at = kStepSlots;
  for (const auto& t : state_) {
    std::memcpy(state_buf_.data() + at, t.data, t.num_elements * sizeof(float));
    at += t.num_elements;
  }
}

void CheckpointerImpl::UnpackState() {
  int64_t at = kStepSlots;
  for (const auto& t : state_) {
    std::memcpy(t.data, state_buf_.data() + at, t.num_elements * sizeof(float));
    at += t.num_elements;
  }
}

Status CheckpointerImpl::Keep(int64_t step) {
  if (!keeper_) return Status::Ok();
  if (step < 0) return InvalidArgumentError("Commit of step " + std::to_string(step));
  PackStep(step);
  PackState();
  return keeper_->Commit(step);
}

StatusOr<int64_t> CheckpointerImpl::Restore() {
  // Elastic jobs: a worker joining a grow starts from the members' commit of the step before
  // its world's first (world_switch.h).
  const int64_t joined_from = impl_ != nullptr ? impl_->JoinedFrom() : 0;
  if (joined_from > 0 && !keeper_) {
    return FailedPreconditionError(
        "joining a running elastic job takes the model from a live worker: this Checkpointer "
        "has crash recovery off (CheckpointerOptions.rejoin)");
  }
  // A joiner's program may be its rank's first (a grow beyond the job's first size): it takes
  // the live workers' model all the same, not the broadcast of a job's start.
  if (keeper_ && (incarnation_ > 1 || joined_from > 0)) {
    // Restarted while the job runs, or joining it: continue from a live worker's last commit.
    // A joiner's: the members' commit of the step before its world's first, or an error.
    TRELLIS_ASSIGN_OR_RETURN(std::optional<int64_t> rejoined, keeper_->Rejoin());
    if (rejoined.has_value()) {
      if (UnpackStep() != *rejoined) {
        return DataLossError("rejoin: the donor's state holds step " +
                             std::to_string(UnpackStep()) + ", its commit says " +
                             std::to_string(*rejoined));
      }
      UnpackState();
      TRELLIS_RETURN_IF_ERROR(Keep(*rejoined));
      return *rejoined;
    }
    // Nobody committed yet: a first start, but the dead incarnation may have pushed step 1.
    TRELLIS_ASSIGN_OR_RETURN(int64_t step, RestoreFromRoot());
    TRELLIS_RETURN_IF_ERROR(keeper_->MarkServersRejoined());
    TRELLIS_RETURN_IF_ERROR(Keep(step));
    return step;
  }
  TRELLIS_ASSIGN_OR_RETURN(int64_t step, RestoreFromRoot());
  TRELLIS_RETURN_IF_ERROR(Keep(step));
  return step;
}

Status CheckpointerImpl::Fill(const Checkpoint& c, const std::string& file) {
  auto fill = [&](const TensorRef& t, KeyId key) -> Status {
    for (const auto& e : c.entries) {
      if (e.name != t.name || e.key != key || e.kind != EntryKind::kValues) continue;
      if (static_cast<int64_t>(e.values.size()) != t.num_elements) {
        return FailedPreconditionError(file + ": tensor '" + t.name + "' has " +
                                       std::to_string(e.values.size()) +
                                       " elements, the program has " +
                                       std::to_string(t.num_elements));
      }
      std::memcpy(t.data, e.values.data(), e.values.size() * sizeof(float));
      return Status::Ok();
    }
    return FailedPreconditionError(file + ": no tensor '" + t.name + "' (key " +
                                   std::to_string(key) + ") in the checkpoint");
  };
  if (c.entries.size() != params_.size() + state_.size()) {
    return FailedPreconditionError(file + ": holds " + std::to_string(c.entries.size()) +
                                   " tensors, the program tracks " +
                                   std::to_string(params_.size() + state_.size()));
  }
  for (const auto& p : params_) TRELLIS_RETURN_IF_ERROR(fill(p, p.key));
  for (const auto& s : state_) TRELLIS_RETURN_IF_ERROR(fill(s, state_key_));
  return Status::Ok();
}

StatusOr<int64_t> CheckpointerImpl::LoadOnRoot() {
  if (config_.path.empty()) return int64_t{0};
  CheckpointDir dir(config_.path, "model", config_.keep);
  TRELLIS_ASSIGN_OR_RETURN(auto steps, dir.Steps());
  if (steps.empty()) return int64_t{0};
  // Newest first; a file that is bad, or whose servers cannot load their half, is skipped.
  std::string rejected;
  for (int64_t step : steps) {
    const std::string file = dir.FileFor(step);
    auto c = dir.Load(step);
    Status st = c.ok() ? Fill(*c, file) : c.status();
    if (st.ok() && ServersSave()) {
      st = ServersDo(wire::Op::kLoad, step).Annotate("servers restoring step " +
                                                      std::to_string(step) + " of " + file);
    }
    if (!st.ok()) {
      TLOG_WARN << "skipping checkpoint: " << st.message();
      rejected += "; rejected " + st.message();
      if (metrics_) metrics_->rejected.Increment();
      continue;
    }
    if (metrics_) metrics_->restores.Increment();
    last_file_ = file;
    last_step_ = step;
    TLOG_INFO << "restored step " << step << " from " << file;
    Tell(step, file, Told::kRestored);
    return step;
  }
  // Files exist but none is usable: starting over silently would lose the training.
  return NotFoundError("no usable checkpoint model-*.ckpt in " + config_.path + rejected);
}

StatusOr<int64_t> CheckpointerImpl::RestoreFromRoot() {
  const bool root = worker_.rank() == 0;
  int64_t step = 0;
  Status load_error;
  if (root) {
    auto s = LoadOnRoot();
    if (s.ok()) {
      step = *s;
    } else {
      load_error = s.status();
      step = kRestoreFailed;
    }
    PackStep(step);
    PackState();
  }
  // The state key first: on failure the others learn it before waiting for parameters.
  TRELLIS_RETURN_IF_ERROR(
      worker_.Broadcast(state_key_, state_buf_.data(), 0).Wait().Annotate("restoring the step"));
  if (root && !load_error.ok()) return load_error.Annotate("restoring the checkpoint");
  step = UnpackStep();
  if (step == kRestoreFailed) {
    return AbortedError("rank 0 could not restore the checkpoint from " + config_.path +
                        " (its log says why)");
  }
  if (step < 0) return DataLossError("restoring: rank 0 sent step " + std::to_string(step));
  std::vector<Handle> handles;
  handles.reserve(params_.size());
  // Restored servers hold the weights as step 0: everyone, rank 0 included, pulls them.
  const bool from_servers = step > 0 && config_.servers_save;
  for (const auto& p : params_) {
    handles.push_back(from_servers ? worker_.Pull(p.key, p.data, INT32_MAX - 1)
                                   : worker_.Broadcast(p.key, p.data, 0));
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    TRELLIS_RETURN_IF_ERROR(handles[i].Wait().Annotate("broadcast of '" + params_[i].name + "'"));
  }
  if (!root) UnpackState();
  return step;
}

Status CheckpointerImpl::Write(int64_t step, bool on_exit) {
  if (worker_.rank() != 0 || config_.path.empty()) return Status::Ok();
  const auto start = std::chrono::steady_clock::now();
  Checkpoint c;
  c.step = step;
  c.origin = "worker rank 0 of " + std::to_string(worker_.size());
  auto add = [&](const TensorRef& t, KeyId key) {
    c.entries.push_back({key, 0, EntryKind::kValues, step, t.name,
                         std::vector<float>(t.data, t.data + t.num_elements)});
  };
  for (const auto& p : params_) add(p, p.key);
  for (const auto& s : state_) add(s, state_key_);
  if (ServersSave()) {
    // The servers' files first: the model file then marks a complete round.
    TRELLIS_RETURN_IF_ERROR(ServersDo(wire::Op::kSave, step)
                                .Annotate("servers saving step " + std::to_string(step)));
  }
  CheckpointDir dir(config_.path, "model", config_.keep);
  uint64_t bytes = 0;
  auto file = dir.Save(c, &bytes);
  if (!file.ok()) return file.status().Annotate("saving the checkpoint of step " + std::to_string(step));
  last_file_ = *file;
  last_step_ = step;
  ++saves_;
  bytes_written_ += bytes;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (metrics_) {
    metrics_->saves.Increment();
    metrics_->save_seconds.Observe(secs);
    metrics_->size_bytes.Set(static_cast<double>(bytes));
  }
  TLOG_INFO << "saved step " << step << " to " << *file << " (" << bytes << " bytes, " << secs
            << " s)" << (on_exit ? ": the exit checkpoint" : "");
  // The exit checkpoint is told after rank 0 says so in its log (StopForTheJob): once told, the
  // agents may stop this process at any moment.
  if (!on_exit) Tell(step, *file, Told::kWritten);
  return Status::Ok();
}

void CheckpointerImpl::Tell(int64_t step, const std::string& file, Told what) {
  if (hooks_ == nullptr || !hooks_->setup().report_checkpoint) return;
  v1::ReportCheckpointRequest req;
  req.set_step(step);
  req.set_path(file);
  req.set_on_exit(what == Told::kOnExit);
  req.set_restored(what == Told::kRestored);
  req.set_exit_ready(true);
  // A scheduler that does not hear of it only shows an older one: logged, not returned.
  Status told = hooks_->setup().report_checkpoint(req);
  if (!told.ok()) TLOG_WARN << "telling the scheduler of checkpoint " << file << ": " << told.ToString();
}

Status CheckpointerImpl::StopForTheJob(int64_t step) {
  if (step > last_step_ && step > 0) {
    TRELLIS_RETURN_IF_ERROR(Write(step, /*on_exit=*/true).Annotate("the exit checkpoint"));
  }  // else saved or restored at this very step already
  // Rank 0 pushes no more, so no worker completes another step: the job stops here, and its
  // launcher or agents stop the processes. One that is never stopped ends after its timeout.
  // Said before the scheduler is told: the agents stop this process as soon as it hears.
  const auto wait = std::chrono::milliseconds(std::max<int64_t>(hooks_->setup().timeout_ms, 1000));
  TLOG_WARN << "the job is being stopped from outside: stopped after step " << step
            << (last_step_ > 0 ? " (exit checkpoint " + last_file_ + ")" : std::string(" (nothing to save)"))
            << "; waiting to be stopped";
  if (last_step_ > 0) Tell(last_step_, last_file_, Told::kOnExit);
  std::this_thread::sleep_for(wait);
  return AbortedError("the job is being stopped from outside: rank 0 stopped after step " +
                      std::to_string(step) + " and was not stopped within " +
                      std::to_string(wait.count()) + " ms");
}

Status CheckTensors(const std::vector<TensorRef>& tensors, const char* what,
                    std::set<std::string>* names) {
  for (const auto& t : tensors) {
    if (t.name.empty()) return InvalidArgumentError(std::string(what) + " tensor without a name");
    if (t.data == nullptr || t.num_elements < 1) {
      return InvalidArgumentError(std::string(what) + " '" + t.name +
                                  "': null buffer or fewer than 1 element");
    }
    if (!names->insert(t.name).second) {
      return InvalidArgumentError("tensor name '" + t.name + "' tracked twice");
    }
  }
  return Status::Ok();
}

}  // namespace

Checkpointer::~Checkpointer() = default;

StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Create(Worker& worker,
                                                              std::vector<TensorRef> params,
                                                              std::vector<TensorRef> state,
                                                              const CheckpointOptions& options) {
  std::set<std::string> names;
  TRELLIS_RETURN_IF_ERROR(CheckTensors(params, "parameter", &names));
  TRELLIS_RETURN_IF_ERROR(CheckTensors(state, "state", &names));
  for (const auto& p : params) {
    if (p.key == options.state_key) {
      return InvalidArgumentError("parameter '" + p.name + "' uses the checkpoint state key " +
                                  std::to_string(options.state_key));
    }
  }
  CheckpointConfig config = worker.checkpoint_config();
  if (!options.path.empty()) config.path = options.path;
  if (options.interval_steps >= 0) config.interval_steps = options.interval_steps;
  if (options.keep > 0) config.keep = options.keep;
  if (config.keep < 1) return InvalidArgumentError("checkpoint keep must be >= 1");
  WorkerImpl* impl = dynamic_cast<WorkerImpl*>(&worker);
  if (impl == nullptr && config.servers_save && !config.path.empty()) {
    return InvalidArgumentError("update-mode checkpoints need a worker made by Worker::Create");
  }
  int64_t state_elements = 0;
  for (const auto& s : state) state_elements += s.num_elements;
  TRELLIS_RETURN_IF_ERROR(worker.DeclareKey({.id = options.state_key,
                                             .name = "checkpoint.state",
                                             .num_elements = kStepSlots + state_elements})
                              .Annotate("Checkpointer::Create"));
  return std::unique_ptr<Checkpointer>(new CheckpointerImpl(
      worker, impl, std::move(params), std::move(state), std::move(config), options.state_key,
      state_elements, options.rejoin));
}

}  // namespace trellis
