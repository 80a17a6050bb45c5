#include "worker-lib/src/rejoin_keeper.h"

#include <pthread.h>

#include <chrono>
#include <cstring>

#include "common/base/logging.h"

namespace trellis {
namespace {

// How long one watcher poll waits (the destructor ends a parked poll at once with a stop call).
constexpr std::chrono::milliseconds kWatchPoll{10000};
// How long the stop call may take when the scheduler does not answer.
constexpr std::chrono::milliseconds kStopWait{1000};
using WatchMode = SchedulerClient::WatchMode;

}  // namespace

RejoinKeeper::RejoinKeeper(WorkerImpl& impl, const std::vector<TensorRef>& params,
                           KeyId state_key, float* state, int64_t state_elements,
                           Prepare prepare)
    : impl_(impl),
      params_(params),
      state_key_(state_key),
      state_(state),
      state_elements_(state_elements),
      prepare_(std::move(prepare)) {
  MetricsRegistry& r = impl.registry();
  series_.rejoins = &r.Counter("trellis_worker_rejoins_total",
                               "Times this worker rank rejoined a running job after a restart");
  series_.served = &r.Counter("trellis_worker_rejoins_served_total",
                              "Rejoins of restarted workers this worker served as the donor");
}

RejoinKeeper::~RejoinKeeper() {
  {
    MutexLock lock(&stop_mu_);
    stopping_ = true;
  }
  stop_cv_.SignalAll();
  {
    MutexLock lock(&commit_mu_);
    closing_ = true;  // a serve waiting for an update window that will not close gives up
  }
  window_cv_.SignalAll();
  if (!watcher_.joinable()) return;
  // No longer a donor; this also answers the watcher's parked poll, so the join is quick.
  if (auto st = impl_.setup().watch_rejoins(WatchMode::kStop, kStopWait); !st.ok()) {
    TLOG_WARN << "rejoin watcher: stopping: " << st.status().ToString();
  }
  watcher_.join();
}

Status RejoinKeeper::Commit(int64_t step, bool again, bool copy) {
  copy = copy || prepare_ == nullptr;
  bool first;
  {
    MutexLock lock(&commit_mu_);
    while (serving_) window_cv_.Wait(&commit_mu_);  // a live commit without BeginUpdate
    updating_ = false;
    const bool same = committed_ && step == step_;
    if (same && !again) {
      window_cv_.SignalAll();
      return Status::Ok();  // the same boundary again
    }
    first = !committed_;
    if (copy) {
      params_copy_.resize(params_.size());
      for (size_t i = 0; i < params_.size(); ++i) {
        params_copy_[i].assign(params_[i].data, params_[i].data + params_[i].num_elements);
      }
      state_copy_.assign(state_, state_ + state_elements_);
    }
    copied_ = copy;
    // The same step again: its pushes were counted then (the next step's may have begun since).
    if (!same) key_steps_ = impl_.PushSteps();
    step_ = step;
    committed_ = true;
  }
  window_cv_.SignalAll();
  if (!first) return Status::Ok();
  // Registered before Restore returns: a rejoin asked for from now on finds this donor. Answered
  // at once; the worker's deadline only guards against a scheduler that does not answer.
  auto reg = impl_.setup().watch_rejoins(WatchMode::kRegister,
                                         std::chrono::milliseconds(impl_.setup().timeout_ms));
  if (!reg.ok()) return reg.status().Annotate("registering as a rejoin donor with the scheduler");
  watcher_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "trellis-rejoin");
    WatchLoop();
  });
  return Status::Ok();
}

void RejoinKeeper::BeginUpdate() {
  if (prepare_ == nullptr) return;
  MutexLock lock(&commit_mu_);
  while (serving_) window_cv_.Wait(&commit_mu_);
  updating_ = true;
}

void RejoinKeeper::WatchLoop() {
  while (true) {
    {
      MutexLock lock(&stop_mu_);
      if (stopping_) return;
    }
    auto task = impl_.setup().watch_rejoins(WatchMode::kPoll, kWatchPoll);
    if (!task.ok()) {
      // The scheduler is gone or restarting: nothing to serve; try again a little later.
      TLOG_WARN << "rejoin watcher: " << task.status().ToString();
      MutexLock lock(&stop_mu_);
      const auto until = std::chrono::steady_clock::now() + kStopWait;
      while (!stopping_ && stop_cv_.WaitUntil(&stop_mu_, until)) {
      }
      continue;
    }
    if (task->has_request()) Serve(task->rejoin_id(), task->rejoiner());
  }
}

void RejoinKeeper::Serve(uint64_t id, int32_t rejoiner) {
  v1::RejoinServedRequest done;
  done.set_rejoin_id(id);
  done.set_donor(impl_.rank());
  Status st = StashLastCommit(id, done);
  if (!st.ok()) {
    done.set_error(st.ToString());
    done.clear_key_steps();
  }
  TLOG_INFO << "rejoin " << id << " of worker " << rejoiner << ": "
            << (st.ok() ? "stashed step " + std::to_string(done.step()) : st.ToString());
  if (Status s = impl_.setup().rejoin_served(done); !s.ok()) {
    TLOG_WARN << "rejoin " << id << ": reporting to the scheduler: " << s.ToString();
  } else if (st.ok()) {
    series_.served->Increment();
  }
}

Status RejoinKeeper::StashLastCommit(uint64_t id, v1::RejoinServedRequest& done) {
  {
    MutexLock lock(&commit_mu_);
    // Live: the tensors hold the last commit outside an update window; keep the next one shut.
    while (updating_ && !closing_) window_cv_.Wait(&commit_mu_);
    if (updating_) return UnavailableError("the worker is shutting down");
    done.set_step(step_);
    for (const auto& [key, steps] : key_steps_) {
      auto* ks = done.add_key_steps();
      ks->set_key(key);
      ks->set_steps(steps);
    }
    if (copied_) {
      // Every commit in copy mode, keep_copy's in live mode: the training thread's next Commit
      // waits until the servers hold this one.
      std::vector<float*> bufs;
      for (auto& copy : params_copy_) bufs.push_back(copy.data());
      bufs.push_back(state_copy_.data());
      return Stash(id, bufs);
    }
    serving_ = true;
  }
  Status st = prepare_(done.step()).Annotate("packing the state of step " +
                                             std::to_string(done.step()));
  if (st.ok()) {
    std::vector<float*> bufs;
    for (const auto& p : params_) bufs.push_back(p.data);
    bufs.push_back(state_);
    st = Stash(id, bufs);
  }
  {
    MutexLock lock(&commit_mu_);
    serving_ = false;
  }
  window_cv_.SignalAll();
  return st;
}

Status RejoinKeeper::Stash(uint64_t id, const std::vector<float*>& bufs) {
  std::vector<Handle> handles;
  for (size_t i = 0; i < params_.size(); ++i) {
    handles.push_back(impl_.Transfer(wire::Op::kStash, params_[i].key, id, bufs[i]));
  }
  handles.push_back(impl_.Transfer(wire::Op::kStash, state_key_, id, bufs.back()));
  Status st;
  for (auto& h : handles) {
    Status s = h.Wait();
    if (st.ok() && !s.ok()) st = s;
  }
  return st;
}

StatusOr<std::optional<int64_t>> RejoinKeeper::Rejoin() {
  const int64_t joined_from = impl_.JoinedFrom();
  TRELLIS_ASSIGN_OR_RETURN(std::optional<int64_t> step, TakeCommit(joined_from - 1));
  if (joined_from > 0) {
    if (!step.has_value()) return FailedPreconditionError("joining the job: no live worker holds its model");
    TRELLIS_RETURN_IF_ERROR(impl_.AnnounceJoined());
  }
  return step;
}

StatusOr<std::optional<int64_t>> RejoinKeeper::TakeCommit(int64_t at_least) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(impl_.setup().timeout_ms);
  auto r = impl_.setup().request_rejoin();
  // A joiner: the donor may still be a step or two before the new world's first.
  while (r.ok() && !r->fresh() && r->step() < at_least && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    r = impl_.setup().request_rejoin();
  }
  if (!r.ok()) return r.status().Annotate("asking the scheduler to rejoin the running job");
  if (r->fresh()) return std::optional<int64_t>();
  if (at_least > 0 && r->step() != at_least) {
    return FailedPreconditionError("joining the job after step " + std::to_string(at_least) + ": worker " +
                                   std::to_string(r->donor()) + " served its commit of step " +
                                   std::to_string(r->step()));
  }
  const uint64_t id = r->rejoin_id();
  std::vector<Handle> handles;
  for (const auto& p : params_) handles.push_back(impl_.Transfer(wire::Op::kFetch, p.key, id, p.data));
  handles.push_back(impl_.Transfer(wire::Op::kFetch, state_key_, id, state_));
  for (size_t i = 0; i < handles.size(); ++i) {
    const std::string what = i < params_.size() ? "'" + params_[i].name + "'" : "the state";
    TRELLIS_RETURN_IF_ERROR(handles[i].Wait().Annotate(
        "rejoin " + std::to_string(id) + ": fetching " + what + " stashed by worker " +
        std::to_string(r->donor())));
  }
  std::vector<std::pair<KeyId, int64_t>> steps;
  for (const auto& ks : r->key_steps()) steps.emplace_back(ks.key(), ks.steps());
  TRELLIS_RETURN_IF_ERROR(impl_.SetPushSteps(steps));
  TRELLIS_RETURN_IF_ERROR(MarkServersRejoined());
  series_.rejoins->Increment();
  TLOG_INFO << "rejoined the running job after step " << r->step() << " (rejoin " << id
            << ", donor worker " << r->donor() << ")";
  return std::optional<int64_t>(r->step());
}

Status RejoinKeeper::MarkServersRejoined() {
  return impl_.ServerCommand(wire::Op::kRejoin, 0, 0).Wait().Annotate("rejoin: telling the servers");
}

}  // namespace trellis
