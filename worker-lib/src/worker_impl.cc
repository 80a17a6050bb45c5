#include "worker-lib/src/worker_impl.h"

#include <chrono>

#include "datapath/codec/twobit.h"
#include "worker-lib/src/server_connection.h"
#include "worker-lib/src/server_resize.h"

namespace trellis {

StatusOr<std::unique_ptr<Worker>> CreateWorker(WorkerSetup setup) {
  if (setup.num_workers < 1) return InvalidArgumentError("num_workers must be >= 1");
  if (setup.rank < 0 || setup.rank >= setup.num_workers) {
    return InvalidArgumentError("worker rank " + std::to_string(setup.rank) + " outside [0, " +
                                std::to_string(setup.num_workers) + ")");
  }
  if (setup.server_addresses.empty()) return InvalidArgumentError("no parameter servers");
  for (size_t i = 0; i < setup.server_addresses.size(); ++i) {
    if (setup.server_addresses[i].empty()) {
      return InvalidArgumentError("server " + std::to_string(i) + " has no data address");
    }
  }
  if (setup.timeout_ms <= 0) return InvalidArgumentError("timeout_ms must be > 0");
  if (!setup.declare) return InvalidArgumentError("no key declaration hook");
  if (!setup.connect) {
    TRELLIS_ASSIGN_OR_RETURN(setup.connect, TransportByName(setup.transport));
  }
  if (setup.compression.type == CompressionType::kTwoBit) {
    Status st = ValidateTwoBitThreshold(static_cast<float>(setup.compression.threshold));
    if (!st.ok()) return st.Annotate("compression");
    if (setup.compression.warmupSteps < 0) {
      return InvalidArgumentError("compression: warmupSteps must be >= 0");
    }
  }
  std::unique_ptr<WorkerImpl> impl(new WorkerImpl(std::move(setup)));
  // Elastic jobs: a slot outside the world it starts in joins a grow under way, or stays out.
  TRELLIS_RETURN_IF_ERROR(impl->Join());
  return std::unique_ptr<Worker>(std::move(impl));
}

WorkerImpl::WorkerImpl(WorkerSetup setup)
    : setup_(std::move(setup)),
      metrics_(setup_.metrics ? setup_.metrics
                              : std::make_shared<MetricsRegistry>(MetricLabels{"", "worker", setup_.rank})),
      series_(*metrics_),
      slice_metrics_(*metrics_),
      compression_(setup_.compression, setup_.rank, *metrics_),
      keys_(static_cast<int32_t>(setup_.server_addresses.size()), setup_.slice_bytes_override,
            [this](KeyState* k) { return compression_.ChooseEncoding(k); }),
      gate_(keys_, series_),
      builder_(setup_.timeout_ms, setup_.priority_enabled, compression_, series_),
      servers_(setup_, series_,
               [this] { return world_->Current(); }),
      dispatch_(setup_.bulking, setup_.water_mark, servers_, compression_, series_,
                slice_metrics_, ledger_),
      deadlines_(setup_.timeout_ms, setup_.peers_restarting, servers_),
      world_(std::make_shared<WorldSwitch>(
          setup_.rank, setup_.incarnation, setup_.num_workers, setup_.world,
          WorldSwitch::Hooks{setup_.resize_epoch, setup_.reach_step,
                             [this](int64_t epoch, const std::vector<int32_t>& members) {
                               auto payload = std::make_shared<const std::vector<uint8_t>>(
                                   wire::EncodeWorldMembers(members));
                               return ServerCommand(wire::Op::kWorld, epoch, 0, payload).Wait();
                             },
                             [this](const v1::ShardMap& map, const std::vector<std::string>& addresses) {
                               Status st = ResizeServers(&keys_, &servers_, map, addresses, setup_.timeout_ms);
                               if (st.ok() && setup_.servers_resized) setup_.servers_resized(map, addresses);
                               return st;
                             }},
          std::chrono::milliseconds(setup_.timeout_ms))),
      progress_(setup_.rank, setup_.incarnation, setup_.report_progress, wait_ns_.get()) {
  if (setup_.listen_resizes) {
    // A worker stuck in a step (waiting for a peer that waits for the resize's decision) still
    // reports the step it last finished: the pings carry the report (world_switch.h).
    setup_.listen_resizes([w = std::weak_ptr<WorldSwitch>(world_)](int64_t epoch) {
      if (auto s = w.lock()) s->OnAnnounced(epoch);
    });
  }
  if (setup_.hand_back_world) {
    setup_.hand_back_world([w = std::weak_ptr<WorldSwitch>(world_)] {
      auto s = w.lock();
      return s ? s->Info() : v1::WorldInfo();
    });
  }
}

WorkerImpl::~WorkerImpl() {
  gate_.Close();
  dispatch_.Close();
  servers_.Close();  // closing a connection fails what it still has pending
  deadlines_.Stop();
}

Status WorkerImpl::FinishDeclarations() {
  return keys_.FinishDeclarations(setup_.declare, [this](const v1::ShardMap& map, bool first) {
    // The first round opens the connections (they need the map's slice size); a later one
    // (deferred init) adds the new keys' slices on the servers.
    return first ? servers_.Open(map) : servers_.InstallShardMap(map);
  });
}

Handle WorkerImpl::PushPull(KeyId key, const float* grad, float* out, int priority,
                            Callback done) {
  return Start({"PushPull", wire::Op::kPushPull, key, grad, out, priority, std::move(done)});
}
Handle WorkerImpl::Push(KeyId key, const float* grad, int priority, Callback done) {
  return Start({"Push", wire::Op::kPush, key, grad, nullptr, priority, std::move(done)});
}
Handle WorkerImpl::Pull(KeyId key, float* out, int priority, Callback done) {
  return Start({"Pull", wire::Op::kPull, key, nullptr, out, priority, std::move(done)});
}
Handle WorkerImpl::Broadcast(KeyId key, float* data, int root) {
  if (Status st = CheckBroadcastRoot(key, root, size()); !st.ok()) return FailedHandle(st, nullptr);
  if (rank() == root) {
    return Start({"Broadcast", wire::Op::kInit, key, data, nullptr, OpBuilder::kBroadcastPriority,
                  nullptr, /*broadcast=*/true});
  }
  return Start({"Broadcast", wire::Op::kPull, key, nullptr, data, OpBuilder::kBroadcastPriority,
                nullptr, /*broadcast=*/true});
}

Handle WorkerImpl::Transfer(wire::Op op, KeyId key, uint64_t id, float* data) {
  if (op != wire::Op::kStash && op != wire::Op::kFetch) {
    return FailedHandle(InvalidArgumentError(std::string("Transfer: ") + wire::OpName(op) +
                                             " is not a stash or fetch"),
                        nullptr);
  }
  // A broadcast's priority: a rejoin holds up every worker of the job.
  const bool stash = op == wire::Op::kStash;
  return Start({stash ? "Stash" : "Fetch", op, key, stash ? data : nullptr,
                stash ? nullptr : data, OpBuilder::kBroadcastPriority, nullptr,
                /*broadcast=*/false, static_cast<int64_t>(id)});
}

Handle WorkerImpl::Start(OpRequest r) {
  if (world_->left()) {  // an elastic job resized without this worker
    return FailedHandle(FailedPreconditionError(world_->LeftMessage()), std::move(r.done));
  }
  // May it start, and which step is it?
  StatusOr<KeyState*> admitted = gate_.Admit(r);
  if (!admitted.ok()) return FailedHandle(admitted.status(), std::move(r.done));
  KeyState& k = **admitted;
  StatusOr<int64_t> step = gate_.StepOf(k, r);
  if (!step.ok()) return FailedHandle(step.status(), std::move(r.done));
  // How it goes on the wire, and its handle.
  const OpPlan plan = builder_.Plan(k, r, *step);
  std::shared_ptr<Handle::State> state =
      builder_.NewOperation(k, r, plan, *step, std::move(r.done));
  // Compressed pushes are encoded here, on the caller's thread and in call order, so a slice's
  // residual sees its steps in sequence; the frames then live in the requests.
  std::vector<WorkerCompression::Frame> frames;
  if (plan.compressed) {
    auto encoded = compression_.EncodePush(k, *step, r.src);
    if (!encoded.ok()) {
      state->Complete(encoded.status().Annotate(state->what));
      return Handle(state);
    }
    frames = std::move(*encoded);
  }
  return Launch(builder_.Slices(k, r, plan, *step, std::move(state), std::move(frames)));
}

Handle WorkerImpl::ServerCommand(wire::Op op, int64_t step, uint64_t key,
                                 std::shared_ptr<const std::vector<uint8_t>> payload) {
  if (Status st = gate_.AdmitCommand(op); !st.ok()) return FailedHandle(st, nullptr);
  return Launch(builder_.ServerCommand(op, step, key, static_cast<size_t>(servers_.size()),
                                       std::move(payload)));
}

Handle WorkerImpl::Launch(Operation op) {
  op.state->wait_ns = wait_ns_;
  deadlines_.Watch(op.state);
  dispatch_.Enqueue(op.priority, std::move(op.tasks));
  return Handle(std::move(op.state));
}

Status WorkerImpl::Barrier(const std::string& name) {
  if (!setup_.barrier) return UnimplementedError("Barrier: no scheduler connection");
  int64_t gen;
  {
    MutexLock lock(&barrier_mu_);
    gen = barrier_generation_[name]++;
  }
  const auto start = std::chrono::steady_clock::now();
  Status st = setup_.barrier(name, gen);
  const auto waited = std::chrono::steady_clock::now() - start;
  wait_ns_->fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count(),
                      std::memory_order_relaxed);
  series_.BarrierWaited(std::chrono::duration<double>(waited).count());
  if (!st.ok()) return st.Annotate("Barrier '" + name + "'");
  return st;
}

}  // namespace trellis
