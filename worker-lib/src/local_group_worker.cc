#include "worker-lib/src/local_group_worker.h"

#include <pthread.h>

#include <chrono>
#include <limits>
#include <vector>

#include "worker-lib/src/op_state.h"
#include "worker-lib/src/worker_impl.h"

namespace trellis {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::shared_ptr<MetricsRegistry> OrOwn(std::shared_ptr<MetricsRegistry> m, int rank) {
  return m ? std::move(m) : std::make_shared<MetricsRegistry>(MetricLabels{"", "worker", rank});
}

}  // namespace

// One user operation on its way through the two lanes.
struct LocalGroupWorker::Op {
  std::shared_ptr<Handle::State> state;
  int64_t n = 0;
  PartRange part;
  std::vector<float> buf;  // this rank's part of the sum (push/pull), else empty
  // The reduce lane's collective failed (the group is broken and the handle completed):
  // the gather lane must not write into the user's buffer any more.
  std::atomic<bool> local_failed{false};

  Mutex mu;
  CondVar cv;
  bool started GUARDED_BY(mu) = false;  // `inner` set, or `error`
  Handle inner GUARDED_BY(mu);
  Status error GUARDED_BY(mu);

  void Started(Handle h, Status st) EXCLUDES(mu) {
    {
      MutexLock lock(&mu);
      inner = std::move(h);
      error = std::move(st);
      started = true;
    }
    cv.SignalAll();
  }
  Status WaitInner() EXCLUDES(mu) {
    Handle h;
    {
      MutexLock lock(&mu);
      while (!started) cv.Wait(&mu);
      if (!error.ok()) return error;
      h = inner;
    }
    return h.Wait();
  }
};

WorkerImpl* SchedulerWorkerOf(Worker& w) {
  if (auto* impl = dynamic_cast<WorkerImpl*>(&w)) return impl;
  if (auto* group = dynamic_cast<LocalGroupWorker*>(&w)) return dynamic_cast<WorkerImpl*>(&group->inner());
  return nullptr;
}

StatusOr<std::unique_ptr<Worker>> CreateLocalGroupWorker(LocalGroupSetup setup) {
  if (!setup.inner || !setup.reduce || !setup.gather) {
    return InvalidArgumentError("local group worker needs an inner worker and two local groups");
  }
  if (setup.reduce->size() != setup.gather->size() ||
      setup.reduce->rank() != setup.gather->rank()) {
    return InvalidArgumentError("local group channels disagree on rank or size");
  }
  if (setup.inner->rank() != setup.pod_rank || setup.inner->size() != setup.num_pods) {
    return InvalidArgumentError("inner worker is rank " + std::to_string(setup.inner->rank()) +
                                " of " + std::to_string(setup.inner->size()) + ", want pod " +
                                std::to_string(setup.pod_rank) + " of " +
                                std::to_string(setup.num_pods));
  }
  return std::unique_ptr<Worker>(new LocalGroupWorker(std::move(setup)));
}

LocalGroupWorker::LocalGroupWorker(LocalGroupSetup setup)
    : pod_(setup.pod_rank),
      pods_(setup.num_pods),
      local_(setup.reduce->rank()),
      g_(setup.reduce->size()),
      inner_(std::move(setup.inner)),
      reduce_(std::move(setup.reduce)),
      gather_(std::move(setup.gather)),
      metrics_(OrOwn(std::move(setup.metrics), pod_ * g_ + local_)),
      reduce_seconds_(metrics_->Histogram(
          "trellis_worker_local_reduce_seconds",
          "Time of one reduce-scatter inside the pod (multi-GPU pods)",
          MetricsRegistry::LatencyBuckets())),
      gather_seconds_(metrics_->Histogram(
          "trellis_worker_local_gather_seconds",
          "Time of one all-gather inside the pod (multi-GPU pods)",
          MetricsRegistry::LatencyBuckets())),
      reduce_bytes_(metrics_->Counter("trellis_worker_local_reduce_bytes_total",
                                      "Bytes this process reduced inside the pod")),
      gather_bytes_(metrics_->Counter("trellis_worker_local_gather_bytes_total",
                                      "Bytes this process all-gathered inside the pod")),
      broadcast_bytes_(metrics_->Counter("trellis_worker_local_broadcast_bytes_total",
                                         "Bytes broadcast inside the pod")) {
  reduce_lane_.thread = std::thread([this] { RunLane(reduce_lane_, "trellis-lreduce"); });
  gather_lane_.thread = std::thread([this] { RunLane(gather_lane_, "trellis-lgather"); });
}

LocalGroupWorker::~LocalGroupWorker() {
  StopLane(reduce_lane_);  // no more inner operations start
  inner_.reset();          // fails what is still in flight, so the gather lane can finish
  StopLane(gather_lane_);
}

void LocalGroupWorker::Enqueue(Lane& lane, Task task) {
  {
    MutexLock lock(&lane.mu);
    lane.tasks.push_back(std::move(task));
  }
  lane.cv.Signal();
}

void LocalGroupWorker::RunLane(Lane& lane, const char* name) {
  pthread_setname_np(pthread_self(), name);
  MutexLock lock(&lane.mu);
  while (true) {
    while (!lane.stop && lane.tasks.empty()) lane.cv.Wait(&lane.mu);
    if (lane.tasks.empty()) return;  // stopping, and everything queued has run
    Task t = std::move(lane.tasks.front());
    lane.tasks.pop_front();
    lock.Unlock();
    t();
    lock.Lock();
  }
}

void LocalGroupWorker::StopLane(Lane& lane) {
  {
    MutexLock lock(&lane.mu);
    lane.stop = true;
  }
  lane.cv.SignalAll();
  if (lane.thread.joinable()) lane.thread.join();
}

Status LocalGroupWorker::DeclareKey(const KeyDecl& key) {
  MutexLock lock(&decl_mu_);
  if (finished_) {
    return FailedPreconditionError("DeclareKey " + std::to_string(key.id) +
                                   " after FinishDeclarations");
  }
  // Part keys are id * G + l: the id must leave room for that.
  if (key.id > (std::numeric_limits<KeyId>::max() - static_cast<KeyId>(g_)) / g_) {
    return InvalidArgumentError("DeclareKey " + std::to_string(key.id) +
                                ": with " + std::to_string(g_) +
                                " local processes key ids must be at most " +
                                std::to_string((std::numeric_limits<KeyId>::max() - g_) / g_));
  }
  if (key.num_elements < 1) {
    return InvalidArgumentError("DeclareKey " + std::to_string(key.id) +
                                ": num_elements must be >= 1, got " +
                                std::to_string(key.num_elements));
  }
  if (!keys_.emplace(key.id, key).second) {
    return AlreadyExistsError("DeclareKey " + std::to_string(key.id) + ": key id declared twice");
  }
  return Status::Ok();
}

Status LocalGroupWorker::FinishDeclarations() {
  MutexLock lock(&decl_mu_);
  if (finished_) return FailedPreconditionError("FinishDeclarations called twice");
  if (keys_.empty()) return FailedPreconditionError("FinishDeclarations: no keys declared");
  // Every local rank declares all parts (the same keys for the whole pod); empty parts
  // (n < G) exist nowhere.
  for (const auto& [id, k] : keys_) {
    for (int l = 0; l < g_; ++l) {
      const PartRange p = LocalPart(k.num_elements, g_, l);
      if (p.count == 0) continue;
      KeyDecl part = k;
      part.id = id * static_cast<KeyId>(g_) + static_cast<KeyId>(l);
      part.num_elements = p.count;
      part.name = (k.name.empty() ? "key " + std::to_string(id) : k.name) + " [part " +
                  std::to_string(l) + "/" + std::to_string(g_) + "]";
      TRELLIS_RETURN_IF_ERROR(inner_->DeclareKey(part));
    }
  }
  TRELLIS_RETURN_IF_ERROR(inner_->FinishDeclarations());
  finished_.store(true);
  return Status::Ok();
}

// keys_ is frozen once finished_ is set (FinishDeclarations, under decl_mu_, stores it last), so
// an operation reads it without the lock: the analysis cannot see that publication.
const KeyDecl* LocalGroupWorker::FrozenKey(KeyId key) const NO_THREAD_SAFETY_ANALYSIS {
  auto it = keys_.find(key);
  return it == keys_.end() ? nullptr : &it->second;
}

Handle LocalGroupWorker::Failed(const Status& st, Callback done) {
  return FailedHandle(st, std::move(done));
}

Handle LocalGroupWorker::PushPull(KeyId key, const float* grad, float* out, int priority,
                                  Callback done) {
  return Submit("PushPull", key, grad, out, priority, std::move(done), -1);
}
Handle LocalGroupWorker::Push(KeyId key, const float* grad, int priority, Callback done) {
  return Submit("Push", key, grad, nullptr, priority, std::move(done), -1);
}
Handle LocalGroupWorker::Pull(KeyId key, float* out, int priority, Callback done) {
  return Submit("Pull", key, nullptr, out, priority, std::move(done), -1);
}
Handle LocalGroupWorker::Broadcast(KeyId key, float* data, int root) {
  if (Status st = CheckBroadcastRoot(key, root, size()); !st.ok()) return Failed(st, nullptr);
  return Submit("Broadcast", key, nullptr, data, 0, nullptr, root);
}

Handle LocalGroupWorker::Submit(const char* verb, KeyId key, const float* src, float* dst,
                                int priority, Callback done, int broadcast_root) {
  if (!finished_.load()) {
    return Failed(FailedPreconditionError(std::string(verb) + " key " + std::to_string(key) +
                                          " before FinishDeclarations"),
                  std::move(done));
  }
  const KeyDecl* decl = FrozenKey(key);
  if (decl == nullptr) {
    return Failed(NotFoundError(std::string(verb) + " of undeclared key " + std::to_string(key)),
                  std::move(done));
  }
  const bool broadcast = broadcast_root >= 0;
  if ((!broadcast && src == nullptr && dst == nullptr) || (broadcast && dst == nullptr) ||
      (std::string_view(verb) != "Pull" && !broadcast && src == nullptr) ||
      (std::string_view(verb) != "Push" && dst == nullptr)) {
    return Failed(InvalidArgumentError(std::string(verb) + " key " + std::to_string(key) +
                                       ": null buffer"),
                  std::move(done));
  }
  auto op = std::make_shared<Op>();
  op->state = std::make_shared<Handle::State>();
  op->state->what = std::string(verb) + " key " + std::to_string(key) + " (local rank " +
                    std::to_string(local_) + " of " + std::to_string(g_) + ")";
  op->state->SetCallback(std::move(done));
  op->n = decl->num_elements;
  op->part = LocalPart(op->n, g_, local_);
  if (!broadcast) op->buf.resize(static_cast<size_t>(op->part.count));
  const KeyId part_key = PartKey(key);
  const int root_pod = broadcast ? broadcast_root / g_ : -1;
  const bool in_root_pod = root_pod == pod_;
  // Completes the user's handle straight from the inner operation (no all-gather follows).
  const bool direct = (src != nullptr && dst == nullptr) || (broadcast && in_root_pod);

  Enqueue(reduce_lane_, [this, op, part_key, src, dst, priority, broadcast, root_pod,
                         in_root_pod, broadcast_root, direct] {
    Status st;
    if (src != nullptr) {
      auto t0 = Clock::now();
      st = reduce_->ReduceScatter(src, op->n, op->buf.data());
      reduce_seconds_.Observe(SecondsSince(t0));
      reduce_bytes_.Increment(static_cast<double>(op->n) * sizeof(float));
    } else if (broadcast && in_root_pod) {
      st = reduce_->Broadcast(dst, op->n, broadcast_root % g_);
      broadcast_bytes_.Increment(static_cast<double>(op->n) * sizeof(float));
    }
    if (!st.ok()) {
      op->local_failed.store(true);
      op->state->Complete(st.Annotate(op->state->what));
      op->Started(Handle(), st);
      return;
    }
    // Broadcast has no callback parameter: its direct completion waits on the gather lane.
    Callback cb;
    if (direct && !broadcast) cb = [op](const Status& s) { op->state->Complete(s); };
    Handle h;  // an empty part (n < G): nothing to send
    if (op->part.count > 0) {
      float* b = op->buf.data();
      if (broadcast) {
        h = inner_->Broadcast(part_key, dst + op->part.begin, root_pod);
      } else if (src != nullptr && dst != nullptr) {
        h = inner_->PushPull(part_key, b, b, priority, cb);
      } else if (src != nullptr) {
        h = inner_->Push(part_key, b, priority, cb);
      } else {
        h = inner_->Pull(part_key, b, priority, cb);
      }
    } else if (cb) {
      cb(Status::Ok());
    }
    op->Started(std::move(h), Status::Ok());
  });
  if (!direct || broadcast) {
    Enqueue(gather_lane_, [this, op, dst, broadcast, direct] {
      Status st = op->WaitInner();
      if (!direct && !op->local_failed.load()) {
        // Run the all-gather even after an inner (server) error, so the other local ranks
        // stay in step.
        const float* part = broadcast ? dst + op->part.begin : op->buf.data();
        auto t0 = Clock::now();
        Status g = gather_->AllGather(part, op->n, dst);
        gather_seconds_.Observe(SecondsSince(t0));
        gather_bytes_.Increment(static_cast<double>(op->n) * sizeof(float));
        if (st.ok()) st = g;
      }
      op->state->Complete(st.ok() ? st : st.Annotate(op->state->what));
    });
  }
  return Handle(op->state);
}

Status LocalGroupWorker::Barrier(const std::string& name) {
  // The lane thread owns the local group; this thread waits for its answer. `out` and
  // `finished` are guarded by `mu` (locals: the analysis cannot check them).
  Mutex mu;
  CondVar cv;
  Status out;
  bool finished = false;
  Enqueue(reduce_lane_, [&] {
    float code = 0;
    Status st = reduce_->Broadcast(&code, 1, 0);  // every local rank is here
    Status cross;
    if (st.ok() && local_ == 0) {
      cross = inner_->Barrier(name);
      code = static_cast<float>(static_cast<int>(cross.code()));
    }
    if (st.ok()) st = reduce_->Broadcast(&code, 1, 0);  // local rank 0 passed the pod barrier
    if (st.ok() && local_ == 0) st = cross;
    if (st.ok() && code != 0) {
      st = Status(static_cast<StatusCode>(static_cast<int>(code)),
                  "Barrier '" + name + "' failed on local rank 0 of this pod");
    }
    MutexLock lock(&mu);
    out = st;
    finished = true;
    cv.SignalAll();
  });
  MutexLock lock(&mu);
  while (!finished) cv.Wait(&mu);
  return out;
}

}  // namespace trellis
