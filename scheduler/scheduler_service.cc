#include "scheduler/scheduler_service.h"

#include <algorithm>
#include <thread>

#include "common/tls/auth.h"
#include "common/base/grpc_status.h"
#include "common/base/logging.h"

namespace trellis {

namespace {

constexpr int kMaxMessageBytes = 256 << 20;  // a 10^5-key shard map fits comfortably

}  // namespace

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* ctx, const grpc::Status& st) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(st);
  return reactor;
}

SchedulerService::SchedulerService(SchedulerState* state, ProgressTracker* progress,
                                   SchedulerServiceOptions options)
    : state_(state), progress_(progress), options_(std::move(options)) {}

grpc::Status SchedulerService::CheckToken(grpc::CallbackServerContext* ctx) const {
  if (options_.token.empty()) return grpc::Status::OK;
  const std::string token = ClientMetadata(*ctx, kTokenMetadataKey);
  if (token.empty()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        std::string("missing job token (metadata \"") + kTokenMetadataKey + "\")");
  }
  if (!TokenEquals(options_.token, token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong job token");
  }
  return grpc::Status::OK;
}

Clock::TimePoint SchedulerService::WaitDeadline(grpc::CallbackServerContext* ctx) const {
  using namespace std::chrono;
  const auto now = system_clock::now();
  const auto client_deadline = ctx->deadline();
  milliseconds remaining = options_.max_wait;
  if (client_deadline < now + options_.max_wait) {
    remaining = std::max(milliseconds(0), duration_cast<milliseconds>(client_deadline - now));
  }
  // Answer a little early so the reply beats the client's own deadline.
  const milliseconds margin = std::min(milliseconds(500), remaining / 10);
  return state_->clock().Now() + (remaining - margin);
}

grpc::ServerUnaryReactor* SchedulerService::GetJob(grpc::CallbackServerContext* ctx,
                                                   const v1::GetJobRequest* req,
                                                   v1::GetJobResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  resp->set_job_yaml(options_.job_yaml);
  return FinishNow(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* SchedulerService::Register(grpc::CallbackServerContext* ctx,
                                                     const v1::RegisterRequest* req,
                                                     v1::RegisterResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  auto r = state_->Register(*req);
  if (r.ok()) *resp = std::move(r).value();
  return FinishNow(ctx, ToGrpc(r.status()));
}

grpc::ServerUnaryReactor* SchedulerService::ReportReady(grpc::CallbackServerContext* ctx,
                                                        const v1::ReportReadyRequest* req,
                                                        v1::ReportReadyResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  return FinishNow(ctx, ToGrpc(state_->ReportReady(*req)));
}

template <typename MakeMessage>
grpc::ByteBuffer SchedulerService::SharedBytes(AnswerCache* cache,
                                               const std::shared_ptr<const void>& answer,
                                               MakeMessage make) {
  MutexLock lock(&cache->mu);
  if (cache->of.lock() != answer) {
    const std::string bytes = make().SerializeAsString();
    grpc::Slice slice(bytes);
    cache->bytes = grpc::ByteBuffer(&slice, 1);
    cache->of = answer;
  }
  return cache->bytes;  // copies share the slices
}

namespace {

template <typename T>
bool ParseRequest(const grpc::ByteBuffer* raw, T* out) {
  grpc::ByteBuffer copy(*raw);  // Deserialize consumes its input; the copy shares the slices
  return grpc::SerializationTraits<T>::Deserialize(&copy, out).ok();
}

}  // namespace

grpc::ServerUnaryReactor* SchedulerService::GetCluster(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* raw,
                                                       grpc::ByteBuffer* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  v1::GetClusterRequest req;
  if (!ParseRequest(raw, &req)) {
    return FinishNow(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                       "cannot parse GetClusterRequest"));
  }
  auto* reactor = ctx->DefaultReactor();
  state_->WaitCluster(req, WaitDeadline(ctx),
                      [this, reactor, resp](StatusOr<std::shared_ptr<const v1::ClusterView>> v) {
                        if (v.ok()) {
                          const auto& view = *v;
                          *resp = SharedBytes(&view_cache_, view, [&] { return *view; });
                        }
                        reactor->Finish(ToGrpc(v.status()));
                      });
  return reactor;
}

namespace {

bool ReadVarint(std::string_view bytes, size_t* pos, uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*pos >= bytes.size()) return false;
    const auto b = static_cast<uint8_t>(bytes[(*pos)++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      *out = v;
      return true;
    }
  }
  return false;
}

// A DeclareKeysRequest as protobuf writes it: worker_rank (field 1, varint) first when non-zero,
// then the keys (field 2). Splits the rank off; false when the bytes do not start that way.
bool SplitRank(std::string_view bytes, int32_t* rank, std::string_view* keys) {
  *rank = 0;
  size_t pos = 0;
  if (!bytes.empty() && static_cast<uint8_t>(bytes[0]) == 0x08) {
    pos = 1;
    uint64_t v = 0;
    if (!ReadVarint(bytes, &pos, &v)) return false;
    *rank = static_cast<int32_t>(v);  // int32 wire rule: the low 32 bits
  }
  *keys = bytes.substr(pos);
  return true;
}

// True when `bytes` hold nothing but field-2 (keys) entries: then equal bytes mean equal keys
// and no rank hidden further on.
bool OnlyKeyFields(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (static_cast<uint8_t>(bytes[pos++]) != 0x12) return false;  // field 2, length-delimited
    uint64_t len = 0;
    if (!ReadVarint(bytes, &pos, &len) || len > bytes.size() - pos) return false;
    pos += static_cast<size_t>(len);
  }
  return true;
}

}  // namespace

grpc::ServerUnaryReactor* SchedulerService::DeclareKeys(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* raw,
                                                        grpc::ByteBuffer* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  std::string bytes;
  {
    std::vector<grpc::Slice> slices;
    if (!raw->Dump(&slices).ok()) {
      return FinishNow(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                         "cannot read DeclareKeysRequest"));
    }
    bytes.reserve(raw->Length());
    for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  }
  auto* reactor = ctx->DefaultReactor();
  auto done = [this, reactor, resp](StatusOr<std::shared_ptr<const v1::ShardMap>> m) {
    if (m.ok()) {
      const auto& map = *m;
      *resp = SharedBytes(&map_cache_, map, [&] {
        v1::DeclareKeysResponse r;
        *r.mutable_shard_map() = *map;
        return r;
      });
    }
    reactor->Finish(ToGrpc(m.status()));
  };
  // Every worker sends the same keys: when the bytes after the rank equal those of a declaration
  // already accepted, skip parsing and sorting 10^4 keys again.
  int32_t rank = 0;
  std::string_view key_bytes;
  const bool split = SplitRank(bytes, &rank, &key_bytes);
  std::shared_ptr<const std::string> known;
  {
    MutexLock lock(&known_keys_mu_);
    known = known_key_bytes_;
  }
  if (split && known && key_bytes == *known) {
    state_->DeclareSameKeys(rank, WaitDeadline(ctx), std::move(done));
    return reactor;
  }
  v1::DeclareKeysRequest req;
  if (!req.ParseFromString(bytes)) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "cannot parse DeclareKeysRequest"));
    return reactor;
  }
  const bool accepted = state_->DeclareKeys(req, WaitDeadline(ctx), std::move(done));
  if (accepted && split && !known && OnlyKeyFields(key_bytes)) {
    MutexLock lock(&known_keys_mu_);
    if (!known_key_bytes_) known_key_bytes_ = std::make_shared<const std::string>(key_bytes);
  }
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::Barrier(grpc::CallbackServerContext* ctx,
                                                    const v1::BarrierRequest* req,
                                                    v1::BarrierResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  auto* reactor = ctx->DefaultReactor();
  state_->Barrier(*req, WaitDeadline(ctx), [reactor, resp](StatusOr<v1::BarrierResponse> b) {
    if (b.ok()) *resp = *b;
    reactor->Finish(ToGrpc(b.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::PublishGroupKey(grpc::CallbackServerContext* ctx,
                                                            const v1::PublishGroupKeyRequest* req,
                                                            v1::PublishGroupKeyResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  return FinishNow(ctx, ToGrpc(state_->PublishGroupKey(*req)));
}

grpc::ServerUnaryReactor* SchedulerService::GetGroupKey(grpc::CallbackServerContext* ctx,
                                                        const v1::GetGroupKeyRequest* req,
                                                        v1::GetGroupKeyResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  auto* reactor = ctx->DefaultReactor();
  state_->GetGroupKey(*req, WaitDeadline(ctx), [reactor, resp](StatusOr<std::string> key) {
    if (key.ok()) resp->set_key(std::move(key).value());
    reactor->Finish(ToGrpc(key.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::RequestRejoin(grpc::CallbackServerContext* ctx,
                                                          const v1::RequestRejoinRequest* req,
                                                          v1::RequestRejoinResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  auto* reactor = ctx->DefaultReactor();
  state_->RequestRejoin(*req, WaitDeadline(ctx),
                        [reactor, resp](StatusOr<v1::RequestRejoinResponse> r) {
                          if (r.ok()) *resp = std::move(r).value();
                          reactor->Finish(ToGrpc(r.status()));
                        });
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::WatchRejoins(grpc::CallbackServerContext* ctx,
                                                         const v1::WatchRejoinsRequest* req,
                                                         v1::WatchRejoinsResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  auto* reactor = ctx->DefaultReactor();
  state_->WatchRejoins(*req, WaitDeadline(ctx),
                       [reactor, resp](StatusOr<v1::WatchRejoinsResponse> r) {
                         if (r.ok()) *resp = std::move(r).value();
                         reactor->Finish(ToGrpc(r.status()));
                       });
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::RejoinServed(grpc::CallbackServerContext* ctx,
                                                         const v1::RejoinServedRequest* req,
                                                         v1::RejoinServedResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  return FinishNow(ctx, ToGrpc(state_->RejoinServed(*req)));
}

grpc::ServerUnaryReactor* SchedulerService::Ping(grpc::CallbackServerContext* ctx,
                                                 const v1::PingRequest* req,
                                                 v1::PingResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  *resp = state_->Ping(*req);
  return FinishNow(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* SchedulerService::Resume(grpc::CallbackServerContext* ctx,
                                                   const v1::ResumeRequest* req,
                                                   v1::ResumeResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  auto r = state_->Resume(*req);
  if (r.ok()) *resp = std::move(r).value();
  return FinishNow(ctx, ToGrpc(r.status()));
}

grpc::ServerUnaryReactor* SchedulerService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                      const v1::HeartbeatRequest* req,
                                                      v1::HeartbeatResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  auto r = state_->Heartbeat(*req);
  if (r.ok()) *resp = std::move(r).value();
  return FinishNow(ctx, ToGrpc(r.status()));
}

grpc::ServerUnaryReactor* SchedulerService::ReportExit(grpc::CallbackServerContext* ctx,
                                                       const v1::ReportExitRequest* req,
                                                       v1::ReportExitResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  return FinishNow(ctx, ToGrpc(state_->ReportExit(*req)));
}

grpc::ServerUnaryReactor* SchedulerService::Leave(grpc::CallbackServerContext* ctx,
                                                  const v1::LeaveRequest* req,
                                                  v1::LeaveResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  return FinishNow(ctx, ToGrpc(state_->Leave(*req)));
}

// ---- SchedulerServer ----

namespace {

std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return "[" + host + "]:" + std::to_string(port);  // IPv6 literal
  }
  return host + ":" + std::to_string(port);
}

}  // namespace

StatusOr<std::unique_ptr<SchedulerServer>> SchedulerServer::Start(SchedulerConfig config,
                                                                  SchedulerServerOptions options) {
  TRELLIS_RETURN_IF_ERROR(ValidateSchedulerConfig(config));
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgumentError("port must be in [0, 65535], got " + std::to_string(options.port));
  }
  std::unique_ptr<SchedulerServer> s(new SchedulerServer());
  s->options_ = std::move(options);
  const Clock* clock = s->options_.clock != nullptr ? s->options_.clock : &s->steady_clock_;
  const int32_t num_workers = config.worker_slots();
  s->state_ = std::make_unique<SchedulerState>(std::move(config), clock);
  s->progress_ = std::make_unique<ProgressTracker>(s->options_.progress, num_workers, clock);
  s->service_ = std::make_unique<SchedulerService>(s->state_.get(), s->progress_.get(),
                                                   s->options_.service);

  grpc::ServerBuilder builder;
  const std::string listen = JoinHostPort(s->options_.host, s->options_.port);
  builder.AddListeningPort(listen, ServerCredentials(s->options_.tls), &s->port_);
  builder.RegisterService(s->service_.get());
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return UnavailableError("cannot listen on " + listen + " (address in use or invalid?)");
  }
  s->sweeper_ = std::thread([srv = s.get()] { srv->SweepLoop(); });
  return s;
}

SchedulerServer::~SchedulerServer() { Shutdown(); }

std::string SchedulerServer::address() const {
  const std::string& h = options_.host;
  const bool wildcard = h.empty() || h == "0.0.0.0" || h == "::" || h == "[::]";
  return JoinHostPort(wildcard ? "127.0.0.1" : h, port_);
}

void SchedulerServer::SweepLoop() {
  MutexLock lock(&mu_);
  while (!stopping_) {
    const auto until = std::chrono::steady_clock::now() + options_.sweep_interval;
    while (!stopping_) {
      if (!cv_.WaitUntil(&mu_, until)) break;
    }
    if (stopping_) break;
    lock.Unlock();
    state_->Sweep();
    lock.Lock();
  }
}

void SchedulerServer::OutliveTheJobsStop() {
  const SchedulerConfig& c = state_->config();
  const auto start = steady_clock_.Now();
  bool waited = false;
  while (true) {
    const auto now = steady_clock_.Now();
    const ProgressTracker::ExitState exit = progress_->exit_state();
    if (exit.written || !exit.ready || !state_->Training()) break;  // nothing to wait for
    // The workers' agents decide within their window; a little longer here.
    const bool involved = !state_->stop_reason().empty();
    if (!involved && now - start >= c.pod_stop_window + std::chrono::seconds(1)) break;
    if (now - start >= c.stop_limit) {
      TLOG_WARN << "no exit checkpoint within " << Seconds(c.stop_limit) << " s: stopping anyway";
      break;
    }
    if (involved && !waited) {
      TLOG_INFO << "pods of the job are being stopped: serving until rank 0's exit checkpoint (at most "
                << Seconds(c.stop_limit) << " s)";
      waited = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (waited && progress_->exit_state().written) {
    // The agents ask every 200 ms: let each hear that it is written before the scheduler goes.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

void SchedulerServer::Shutdown() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.SignalAll();
  if (sweeper_.joinable()) sweeper_.join();
  // Waiting reactors must be finished before the server can shut down.
  if (state_) state_->Shutdown();
  // Every waiter was answered above, so what is still in flight is a short call; 200 ms is
  // plenty, and a longer grace only delays the end of every job (a connected client kept
  // Shutdown at its full deadline; see the session note).
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  }
}

}  // namespace trellis
