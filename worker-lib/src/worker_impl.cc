#include "worker-lib/src/worker_impl.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <tuple>

#include "common/base/logging.h"
#include "datapath/tcp_wire.h"
#include "datapath/codec/twobit.h"
#include "worker-lib/src/recovering_connection.h"
#include "worker-lib/src/transport.h"

namespace trellis {
namespace {

v1::DType ToProto(DType d) { return d == DType::kFloat32 ? v1::DTYPE_FLOAT32 : v1::DTYPE_UNSPECIFIED; }

// Broadcast and init go before any training traffic.
constexpr int kBroadcastPriority = INT_MAX - 1;

}  // namespace

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
  return std::unique_ptr<Worker>(new WorkerImpl(std::move(setup)));
}

WorkerImpl::WorkerImpl(WorkerSetup setup)
    : setup_(std::move(setup)),
      metrics_(setup_.metrics ? setup_.metrics
                              : std::make_shared<MetricsRegistry>(MetricLabels{"", "worker", setup_.rank})),
      series_(*metrics_),
      slice_metrics_(*metrics_),
      queue_(setup_.water_mark),
      progress_(setup_.rank, setup_.incarnation, setup_.report_progress, wait_ns_.get()) {
  compression_metrics_ = {
      &metrics_->Counter("trellis_worker_compression_input_bytes_total",
                         "Gradient bytes of compressed pushes, before compression (float32)."),
      &metrics_->Counter("trellis_worker_compression_output_bytes_total",
                         "What the compressed pushes were sent as (2-bit frames), in bytes."),
      &metrics_->Histogram("trellis_worker_compression_seconds",
                           "Time to compress one push (every slice of the key).",
                           MetricsRegistry::LatencyBuckets()),
      &metrics_->Counter("trellis_worker_compression_pulled_unpacked_bytes_total",
                         "Packed pull answers: the float32 bytes they decoded to."),
      &metrics_->Counter("trellis_worker_compression_pulled_packed_bytes_total",
                         "Packed pull answers: the bytes they took on the wire.")};
  watchdog_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "trellis-watch");
    WatchdogLoop();
  });
}

WorkerImpl::~WorkerImpl() {
  closing_.store(true);
  // Queued slices never reach the wire: fail their operations.
  for (Task& t : queue_.TakeAll()) {
    t.op->Complete(CancelledError(t.op->what + ": worker shutting down"));
  }
  // Closing a connection fails what it still has pending.
  servers_.clear();
  {
    std::lock_guard lock(watch_mu_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  watchdog_.join();
}

std::string WorkerImpl::KeyName(const KeyState& k) const {
  std::string s = "key " + std::to_string(k.decl.id);
  if (!k.decl.name.empty()) s += " (" + k.decl.name + ")";
  return s;
}

Status WorkerImpl::DeclareKey(const KeyDecl& key) {
  std::lock_guard lock(decl_mu_);
  std::string name = "key " + std::to_string(key.id) +
                     (key.name.empty() ? std::string() : " (" + key.name + ")");
  if (key.num_elements < 1) {
    return InvalidArgumentError("DeclareKey " + name + ": num_elements must be >= 1, got " +
                                std::to_string(key.num_elements));
  }
  if (key.dtype != DType::kFloat32) {
    return InvalidArgumentError("DeclareKey " + name + ": only float32 is supported");
  }
  if (declared_.count(key.id)) {
    return AlreadyExistsError("DeclareKey " + name + ": key id declared twice");
  }
  declared_[key.id] = key;
  if (finished_.load()) {
    std::unique_lock keys_lock(keys_mu_);
    late_.insert(key.id);
  }
  return Status::Ok();
}

Status WorkerImpl::FinishDeclarations() {
  std::lock_guard lock(decl_mu_);
  const bool first = !finished_.load();
  std::vector<KeyId> added;  // declared since the last round
  for (const auto& [id, d] : declared_) {
    if (first || FindKey(id) == nullptr) added.push_back(id);
  }
  if (declared_.empty()) return FailedPreconditionError("FinishDeclarations: no keys declared");
  if (added.empty()) {
    return FailedPreconditionError("FinishDeclarations: no keys declared since the last call");
  }
  Status st = DeclareRound(first);
  if (!first) {
    // Done with these either way; after a failed round (another worker did not declare the
    // same keys) they are undeclared again, and the program may declare again.
    std::unique_lock keys_lock(keys_mu_);
    for (KeyId id : added) {
      late_.erase(id);
      if (!st.ok()) declared_.erase(id);
    }
  }
  return st;
}

Status WorkerImpl::DeclareRound(bool first) {
  std::vector<v1::KeySpec> specs;
  specs.reserve(declared_.size());
  for (const auto& [id, d] : declared_) {
    v1::KeySpec s;
    s.set_id(id);
    s.set_name(d.name);
    s.set_num_elements(d.num_elements);
    s.set_dtype(ToProto(d.dtype));
    specs.push_back(std::move(s));
  }
  TRELLIS_ASSIGN_OR_RETURN(v1::ShardMap map, setup_.declare(specs));
  if (setup_.slice_bytes_override > 0 && setup_.slice_bytes_override != map.slice_bytes()) {
    return InvalidArgumentError(
        "slice_bytes " + std::to_string(setup_.slice_bytes_override) +
        " set for this worker differs from the job's sliceBytes " +
        std::to_string(map.slice_bytes()) + " (the scheduler's shard map is shared by all)");
  }
  const int32_t ns = num_servers();
  if (map.num_servers() != ns) {
    return InternalError("shard map is for " + std::to_string(map.num_servers()) +
                         " servers, the cluster has " + std::to_string(ns));
  }
  // The keys new to this worker (all of them the first time).
  std::vector<std::unique_ptr<KeyState>> fresh;
  for (const auto& ks : map.keys()) {
    auto d = declared_.find(ks.key().id());
    if (d == declared_.end()) {
      return InternalError("shard map has key " + std::to_string(ks.key().id()) +
                           " this worker did not declare");
    }
    if (!first && FindKey(d->first) != nullptr) continue;
    auto k = std::make_unique<KeyState>();
    k->decl = d->second;
    TRELLIS_RETURN_IF_ERROR(ChooseEncoding(k.get()));
    int64_t next = 0;
    for (const auto& sa : ks.slices()) {
      if (sa.offset() != next || sa.num_elements() < 1 || sa.server() < 0 || sa.server() >= ns) {
        return InternalError("shard map: bad slice " + std::to_string(sa.index()) + " of " +
                             KeyName(*k));
      }
      k->slices.push_back({sa.index(), sa.offset(), sa.num_elements(), sa.server()});
      next += sa.num_elements();
    }
    if (next != k->decl.num_elements) {
      return InternalError("shard map covers " + std::to_string(next) + " elements of " +
                           KeyName(*k) + ", declared " + std::to_string(k->decl.num_elements));
    }
    fresh.push_back(std::move(k));
  }
  if (static_cast<size_t>(map.keys_size()) != declared_.size()) {
    return InternalError("shard map lacks some of the " + std::to_string(declared_.size()) +
                         " declared keys");
  }
  if (first) {
    std::vector<std::unique_ptr<ServerConnection>> servers;
    for (int32_t s = 0; s < ns; ++s) {
      ConnectionOptions o;
      // "host:port;tcp=P;local=NAME": the gRPC address, the raw-TCP port, the local socket.
      TRELLIS_RETURN_IF_ERROR(tcpwire::SplitDataAddress(setup_.server_addresses[s], &o.address,
                                                        nullptr, &o.tcp_port, &o.local_name));
      o.use_local_socket = setup_.local_socket;
      o.timeout_ms = setup_.timeout_ms;
      o.token = setup_.token;
      o.tls = setup_.tls;
      o.worker_rank = setup_.rank;
      o.slice_bytes = map.slice_bytes();
      TRELLIS_ASSIGN_OR_RETURN(auto conn, setup_.connect(o));
      if (setup_.retain_pushes) {
        RecoveryOptions r;
        r.server_rank = s;
        r.connect = setup_.connect;
        r.resolve = setup_.resolve_server;
        if (setup_.peers_restarting) {
          r.restarting_seen_at = [f = setup_.peers_restarting] { return f().first; };
        }
        r.reconnects = series_.reconnects();
        r.replayed = series_.replayed();
        conn = MakeRecoveringConnection(o, std::move(r), std::move(conn));
      }
      TRELLIS_RETURN_IF_ERROR(conn->InstallShardMap(map, s, setup_.timeout_ms));
      servers.push_back(std::move(conn));
    }
    servers_ = std::move(servers);
  } else {
    // Deferred init: the servers add the new keys' slices; the others stay as they are.
    for (int32_t s = 0; s < ns; ++s) {
      TRELLIS_RETURN_IF_ERROR(servers_[s]->InstallShardMap(map, s, setup_.timeout_ms));
    }
  }
  {
    std::unique_lock keys_lock(keys_mu_);
    for (auto& k : fresh) {
      const KeyId id = k->decl.id;
      keys_[id] = std::move(k);
    }
  }
  finished_.store(true);
  return Status::Ok();
}

WorkerImpl::KeyState* WorkerImpl::FindKey(KeyId key) const {
  std::shared_lock keys_lock(keys_mu_);
  auto it = keys_.find(key);
  return it == keys_.end() ? nullptr : it->second.get();
}

Handle WorkerImpl::Failed(const Status& st, Callback done) {
  return FailedHandle(st, std::move(done));
}

Handle WorkerImpl::PushPull(KeyId key, const float* grad, float* out, int priority,
                            Callback done) {
  return Start("PushPull", wire::Op::kPushPull, key, grad, out, priority, std::move(done), false);
}
Handle WorkerImpl::Push(KeyId key, const float* grad, int priority, Callback done) {
  return Start("Push", wire::Op::kPush, key, grad, nullptr, priority, std::move(done), false);
}
Handle WorkerImpl::Pull(KeyId key, float* out, int priority, Callback done) {
  return Start("Pull", wire::Op::kPull, key, nullptr, out, priority, std::move(done), false);
}
Handle WorkerImpl::Broadcast(KeyId key, float* data, int root) {
  if (Status st = CheckBroadcastRoot(key, root, size()); !st.ok()) return Failed(st, nullptr);
  if (rank() == root) {
    return Start("Broadcast", wire::Op::kInit, key, data, nullptr, kBroadcastPriority, nullptr,
                 true);
  }
  return Start("Broadcast", wire::Op::kPull, key, nullptr, data, kBroadcastPriority, nullptr,
               true);
}

Handle WorkerImpl::Start(const char* verb, wire::Op op, KeyId key, const float* src, float* dst,
                         int priority, Callback done, bool broadcast, int64_t tag) {
  if (closing_.load()) return Failed(CancelledError("worker shutting down"), std::move(done));
  if (!finished_.load()) {
    return Failed(FailedPreconditionError(std::string(verb) + " key " + std::to_string(key) +
                                          " before FinishDeclarations"),
                  std::move(done));
  }
  KeyState* found = FindKey(key);
  if (found == nullptr) {
    bool late;
    {
      std::shared_lock keys_lock(keys_mu_);
      late = late_.count(key) != 0;
    }
    return Failed(late ? FailedPreconditionError(std::string(verb) + " of key " +
                                                 std::to_string(key) +
                                                 " declared after FinishDeclarations: call "
                                                 "FinishDeclarations again first")
                       : NotFoundError(std::string(verb) + " of undeclared key " +
                                       std::to_string(key)),
                  std::move(done));
  }
  KeyState& k = *found;
  const bool needs_src = wire::OpHasPayload(op);
  const bool needs_dst = wire::AnswersWithValues(op);
  if ((needs_src && src == nullptr) || (needs_dst && dst == nullptr)) {
    return Failed(InvalidArgumentError(std::string(verb) + " " + KeyName(k) + ": null buffer"),
                  std::move(done));
  }
  int64_t step = 0;
  if (wire::IsRejoinOp(static_cast<uint8_t>(op))) {
    step = tag;  // not a step: the transfer's tag
  } else if (broadcast) {
    if (k.push_step.load() != 0) {
      return Failed(FailedPreconditionError(std::string(verb) + " " + KeyName(k) + " after step " +
                                            std::to_string(k.push_step.load()) +
                                            ": broadcast before the first push"),
                    std::move(done));
    }
  } else if (op == wire::Op::kPull) {
    step = k.push_step.load();
  } else {
    step = k.push_step.fetch_add(1) + 1;
    series_.KeyPushed(step);
  }
  if (!setup_.priority_enabled && !broadcast) priority = 0;
  const bool compressed =
      (op == wire::Op::kPush || op == wire::Op::kPushPull) && Compressed(k, step);
  // A pull of a compressed step may come back packed as well (never a broadcast's: step 0).
  if (!broadcast) {
    op = WireOp(op, compressed || (op == wire::Op::kPull && Compressed(k, step)),
                /*packable=*/!k.half.has_value());
  }

  auto st = std::make_shared<Handle::State>();
  st->what = std::string(verb) + " " + KeyName(k) + " step " + std::to_string(step);
  st->deadline = Handle::State::Clock::now() + std::chrono::milliseconds(setup_.timeout_ms);
  st->spin_before_blocking =
      k.decl.num_elements * static_cast<int64_t>(sizeof(float)) <= Handle::State::kSpinMaxBytes;
  // Latency and errors of the whole operation, recorded before the user's callback runs.
  st->callback = [this, op, start = Handle::State::Clock::now(), user = std::move(done)](const Status& s) {
    series_.OperationDone(op, s.ok(), std::chrono::duration<double>(Handle::State::Clock::now() - start).count());
    if (user) user(s);
  };
  const size_t parts = k.slices.size();
  st->slice_index.reserve(parts);
  st->slice_server.reserve(parts);
  for (const auto& s : k.slices) {
    st->slice_index.push_back(s.index);
    st->slice_server.push_back(s.server);
  }
  st->part_done.assign(parts, 0);
  st->remaining.store(static_cast<int64_t>(parts));
  // Compressed pushes are encoded here, on the caller's thread and in call order, so a slice's
  // residual sees its steps in sequence; the frames then live in the requests.
  std::vector<std::shared_ptr<const std::vector<uint8_t>>> frames(compressed ? parts : 0);
  if (compressed) {
    if (k.codec != nullptr) {
      const std::string advice = threshold_advisor_.Observe(step, src, static_cast<size_t>(k.decl.num_elements));
      if (!advice.empty()) TLOG_WARN << "worker " << setup_.rank << ": " << advice;
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < parts; ++i) {
      auto f = EncodeSlice(k, k.slices[i], src);
      if (!f.ok()) {
        st->Complete(f.status().Annotate(st->what));
        return Handle(st);
      }
      frames[i] = std::move(*f);
      const uint64_t in = static_cast<uint64_t>(k.slices[i].num_elements) * sizeof(float);
      compress_in_bytes_.fetch_add(in);
      compress_out_bytes_.fetch_add(frames[i]->size());
      compression_metrics_.bytes_in->Increment(static_cast<double>(in));
      compression_metrics_.bytes_out->Increment(static_cast<double>(frames[i]->size()));
    }
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - t0).count();
    compress_ns_.fetch_add(static_cast<uint64_t>(ns));
    compression_metrics_.seconds->Observe(static_cast<double>(ns) * 1e-9);
  }
  std::vector<Task> tasks;
  tasks.reserve(parts);
  for (size_t i = 0; i < parts; ++i) {
    const SliceInfo& s = k.slices[i];
    Task t;
    t.op = st;
    t.part = i;
    t.server = s.server;
    t.request.op = op;
    t.request.key = key;
    t.request.slice = s.index;
    t.request.step = step;
    t.request.priority = priority;
    if (compressed) {
      t.request.encoded = std::move(frames[i]);
    } else if (needs_src) {
      t.request.payload = src + s.offset;
      t.request.payload_elements = s.num_elements;
    }
    t.out = needs_dst ? dst + s.offset : nullptr;
    t.slice_bytes = s.num_elements * static_cast<int64_t>(sizeof(float));
    t.enqueued = SliceClock::now();
    if (t.out != nullptr) {  // a bulk transport reads the answer straight into `out`
      t.request.out = t.out;
      t.request.out_elements = s.num_elements;
      t.request.out_mu = &st->data_mu;
      t.request.out_closed = &st->closed;
    }
    tasks.push_back(std::move(t));
  }
  return Launch(std::move(st), priority, std::move(tasks));
}

Handle WorkerImpl::Launch(std::shared_ptr<Handle::State> st, int priority,
                          std::vector<Task> tasks) {
  st->wait_ns = wait_ns_;
  {
    std::lock_guard lock(watch_mu_);
    live_.push_back(st);
  }
  for (auto& t : tasks) queue_.Push(priority, std::move(t));
  series_.SampleQueue(queue_.queued(), queue_.in_flight());
  slice_metrics_.SetDepth(queue_.queued_by_band());
  Pump();
  return Handle(std::move(st));
}

Handle WorkerImpl::ServerCommand(wire::Op op, int64_t step, uint64_t key) {
  if (closing_.load()) return Failed(CancelledError("worker shutting down"), nullptr);
  if (!finished_.load()) {
    return Failed(FailedPreconditionError(std::string(wire::OpName(op)) +
                                          " before FinishDeclarations"),
                  nullptr);
  }
  const size_t parts = servers_.size();
  auto st = std::make_shared<Handle::State>();
  st->what = std::string("checkpoint ") + wire::OpName(op) + " of step " + std::to_string(step);
  st->deadline = Handle::State::Clock::now() + std::chrono::milliseconds(setup_.timeout_ms);
  st->part_done.assign(parts, 0);
  st->remaining.store(static_cast<int64_t>(parts));
  std::vector<Task> tasks;
  for (size_t i = 0; i < parts; ++i) {
    st->slice_index.push_back(0);
    st->slice_server.push_back(static_cast<int32_t>(i));
    Task t;
    t.op = st;
    t.part = i;
    t.server = static_cast<int32_t>(i);
    t.request.op = op;
    t.request.key = key;
    t.request.step = step;
    t.request.priority = kBroadcastPriority;
    t.out = nullptr;
    tasks.push_back(std::move(t));
  }
  return Launch(std::move(st), kBroadcastPriority, std::move(tasks));
}

void WorkerImpl::WatchdogLoop() {
  const auto interval = std::chrono::milliseconds(
      std::clamp<int64_t>(setup_.timeout_ms / 10, 1, 100));
  std::unique_lock lock(watch_mu_);
  while (!stopping_) {
    watch_cv_.wait_for(lock, interval);
    const auto now = Handle::State::Clock::now();
    // A member being restarted (or back less than one timeout ago): the operations wait for it
    // rather than fail and restart this worker too (docs/scheduler.md#stalls).
    std::chrono::steady_clock::time_point restarting_at{};
    std::string restarting;
    bool asked = false;
    std::vector<std::shared_ptr<Handle::State>> expired;
    for (auto it = live_.begin(); it != live_.end();) {
      auto op = it->lock();
      if (op && !op->closed.load() && now >= op->deadline && setup_.peers_restarting) {
        if (!asked) {
          std::tie(restarting_at, restarting) = setup_.peers_restarting();
          asked = true;
        }
        const auto until = restarting_at + std::chrono::milliseconds(setup_.timeout_ms);
        if (until > now) {
          if (!op->extended) {
            TLOG_WARN << op->what << ": waiting past its deadline for " << restarting
                      << ", which the scheduler is restarting";
          }
          op->extended = true;
          op->deadline = until;
        }
      }
      if (!op || op->closed.load()) {
        it = live_.erase(it);
      } else if (now >= op->deadline) {
        expired.push_back(std::move(op));
        it = live_.erase(it);
      } else {
        ++it;
      }
    }
    lock.unlock();
    for (auto& op : expired) {
      int64_t p = op->FirstPending();
      std::string where;
      if (p >= 0) {
        int32_t s = op->slice_server[p];
        where = ": slice " + std::to_string(op->slice_index[p]) + " on server " +
                std::to_string(s) + " (" + setup_.server_addresses[s] + ")";
      }
      op->Complete(DeadlineExceededError(op->what + where + " not answered within " +
                                         std::to_string(setup_.timeout_ms) + " ms" +
                                         (op->extended ? " after the restarted member came back"
                                                       : "")));
    }
    lock.lock();
  }
}

Status WorkerImpl::Barrier(const std::string& name) {
  if (!setup_.barrier) return UnimplementedError("Barrier: no scheduler connection");
  int64_t gen;
  {
    std::lock_guard lock(barrier_mu_);
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
