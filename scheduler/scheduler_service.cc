#include "scheduler/scheduler_service.h"

#include <algorithm>

#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/logging.h"

namespace trellis {

namespace {

constexpr int kMaxMessageBytes = 256 << 20;  // a 10^5-key shard map fits comfortably

// Answers at once with the Status `st` (OK or not).
grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* ctx, const grpc::Status& st) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(st);
  return reactor;
}

}  // namespace

SchedulerService::SchedulerService(SchedulerState* state, SchedulerServiceOptions options)
    : state_(state), options_(std::move(options)) {}

grpc::Status SchedulerService::CheckToken(grpc::CallbackServerContext* ctx) const {
  if (options_.token.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  auto it = md.find(kTokenMetadataKey);
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        std::string("missing job token (metadata \"") + kTokenMetadataKey + "\")");
  }
  if (!TokenEquals(options_.token, std::string(it->second.data(), it->second.size()))) {
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

grpc::ServerUnaryReactor* SchedulerService::GetCluster(grpc::CallbackServerContext* ctx,
                                                       const v1::GetClusterRequest* req,
                                                       v1::ClusterView* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  auto* reactor = ctx->DefaultReactor();
  state_->WaitCluster(*req, WaitDeadline(ctx),
                      [reactor, resp](StatusOr<std::shared_ptr<const v1::ClusterView>> v) {
                        if (v.ok()) *resp = **v;
                        reactor->Finish(ToGrpc(v.status()));
                      });
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::DeclareKeys(grpc::CallbackServerContext* ctx,
                                                        const v1::DeclareKeysRequest* req,
                                                        v1::DeclareKeysResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  auto* reactor = ctx->DefaultReactor();
  state_->DeclareKeys(*req, WaitDeadline(ctx),
                      [reactor, resp](StatusOr<std::shared_ptr<const v1::ShardMap>> m) {
                        if (m.ok()) *resp->mutable_shard_map() = **m;
                        reactor->Finish(ToGrpc(m.status()));
                      });
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
  s->state_ = std::make_unique<SchedulerState>(std::move(config), clock);
  s->service_ = std::make_unique<SchedulerService>(s->state_.get(), s->options_.service);

  grpc::ServerBuilder builder;
  const std::string listen = JoinHostPort(s->options_.host, s->options_.port);
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &s->port_);
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
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, options_.sweep_interval, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    state_->Sweep();
    lock.lock();
  }
}

void SchedulerServer::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
  // Waiting reactors must be finished before the server can shut down.
  if (state_) state_->Shutdown();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace trellis
