#include "scheduler/scheduler_client.h"

#include <grpcpp/grpcpp.h>

#include <cstring>

#include "common/tls/auth.h"
#include "common/base/grpc_status.h"

namespace trellis {

namespace {

constexpr int kMaxMessageBytes = 256 << 20;  // shard maps of many keys

}  // namespace

std::shared_ptr<grpc::Channel> SchedulerClient::MakeChannel(const SchedulerClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Reconnect quickly when the scheduler comes up after us (default back-off grows to 120 s).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // gRPC takes this as the least time a connection attempt (TCP connect and TLS handshake) gets:
  // at 100 ms, attempts to a live scheduler timed out on a loaded node ("handshaker shutdown").
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kSchedulerConnectTimeoutMs);
  // A replaced scheduler pod has a new address behind the same (headless) Service name: look the
  // name up again soon after the connection fails (gRPC's default waits 30 s between lookups).
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, kSchedulerDnsMinIntervalMs);
  return grpc::CreateCustomChannel(options.address, ChannelCredentials(options.tls, &args), args);
}

StatusOr<std::unique_ptr<SchedulerClient>> SchedulerClient::Connect(
    const SchedulerClientOptions& options) {
  if (options.address.empty()) return InvalidArgumentError("scheduler address must be set");
  if (options.rpc_timeout.count() <= 0) {
    return InvalidArgumentError("rpc_timeout must be > 0, got " +
                                std::to_string(options.rpc_timeout.count()) + " ms");
  }
  auto channel = MakeChannel(options);
  if (!channel) return InternalError("cannot create a channel to " + options.address);
  return std::unique_ptr<SchedulerClient>(new SchedulerClient(options, std::move(channel)));
}

SchedulerClient::SchedulerClient(SchedulerClientOptions options,
                                 std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::Scheduler::NewStub(channel_)),
      channel_made_(std::chrono::steady_clock::now()) {}

SchedulerClient::~SchedulerClient() = default;

std::shared_ptr<v1::Scheduler::Stub> SchedulerClient::Stub() const {
  MutexLock lock(&mu_);
  return stub_;
}

int SchedulerClient::channels_made() const {
  MutexLock lock(&mu_);
  return channels_made_;
}

void SchedulerClient::Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) const {
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  ctx->set_wait_for_ready(!reached_.load(std::memory_order_relaxed));
  if (!options_.token.empty()) ctx->AddMetadata(kTokenMetadataKey, options_.token);
}

Status SchedulerClient::Finish(const grpc::Status& st, const char* method) {
  const bool answered = st.error_code() != grpc::StatusCode::UNAVAILABLE &&
                        st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED;
  if (answered) reached_.store(true, std::memory_order_relaxed);
  NoteOutcome(answered, std::strcmp(method, "Ping") == 0 || std::strcmp(method, "Heartbeat") == 0);
  if (st.ok()) return Status::Ok();
  return FromGrpc(st).Annotate("scheduler " + options_.address + " " + method);
}

void SchedulerClient::NoteOutcome(bool answered, bool beat) {
  const auto now = std::chrono::steady_clock::now();
  MutexLock lock(&mu_);
  if (answered) {
    failing_since_.reset();
    return;
  }
  // A long poll ends DEADLINE_EXCEEDED on a healthy channel: only a channel that is not
  // connected counts as failing, or a beat that got no answer (the connection may be dead
  // without gRPC knowing: an untouched member took 20 s to find a replaced scheduler pod).
  if (!beat && channel_->GetState(false) == GRPC_CHANNEL_READY) return;
  if (!failing_since_) failing_since_ = now;
  const auto fresh_after = std::chrono::milliseconds(kSchedulerFreshChannelAfterMs);
  if (now - *failing_since_ < fresh_after || now - channel_made_ < fresh_after) return;
  // The scheduler was replaced (a new pod, a new address): gRPC's resolver backs off after failed
  // lookups (up to minutes) and ignores requests to look again meanwhile; a fresh channel looks
  // the name up at once. Calls in flight keep the old stub and channel alive until they end.
  auto channel = MakeChannel(options_);
  if (!channel) return;
  channel_ = std::move(channel);
  stub_ = v1::Scheduler::NewStub(channel_);
  channel_made_ = now;
  ++channels_made_;
}

StatusOr<std::string> SchedulerClient::GetJobYaml() {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout);
  v1::GetJobResponse resp;
  auto st = Stub()->GetJob(&ctx, v1::GetJobRequest(), &resp);
  TRELLIS_RETURN_IF_ERROR(Finish(st, "GetJob"));
  return resp.job_yaml();
}

StatusOr<v1::RegisterResponse> SchedulerClient::Register(const v1::RegisterRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout);
  v1::RegisterResponse resp;
  auto st = Stub()->Register(&ctx, request, &resp);
  TRELLIS_RETURN_IF_ERROR(Finish(st, "Register"));
  return resp;
}

Status SchedulerClient::ReportReady(v1::Role role, int32_t rank, const std::string& address) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout);
  v1::ReportReadyRequest req;
  req.set_role(role);
  req.set_rank(rank);
  req.set_address(address);
  v1::ReportReadyResponse resp;
  return Finish(Stub()->ReportReady(&ctx, req, &resp), "ReportReady");
}

StatusOr<v1::ClusterView> SchedulerClient::GetCluster(int64_t after_version, bool wait_complete,
                                                      std::chrono::milliseconds wait) {
  grpc::ClientContext ctx;
  // The scheduler answers a little before this deadline with the view as it is then.
  Prepare(&ctx, std::max(wait, std::chrono::milliseconds(1)));
  v1::GetClusterRequest req;
  req.set_after_version(after_version);
  req.set_wait_complete(wait_complete);
  v1::ClusterView view;
  auto st = Stub()->GetCluster(&ctx, req, &view);
  TRELLIS_RETURN_IF_ERROR(Finish(st, "GetCluster"));
  return view;
}

StatusOr<v1::ShardMap> SchedulerClient::DeclareKeys(int32_t worker_rank,
                                                    const std::vector<v1::KeySpec>& keys,
                                                    std::chrono::milliseconds wait) {
  grpc::ClientContext ctx;
  Prepare(&ctx, std::max(wait, std::chrono::milliseconds(1)));
  v1::DeclareKeysRequest req;
  req.set_worker_rank(worker_rank);
  req.mutable_keys()->Reserve(static_cast<int>(keys.size()));
  for (const auto& k : keys) *req.add_keys() = k;
  v1::DeclareKeysResponse resp;
  auto st = Stub()->DeclareKeys(&ctx, req, &resp);
  TRELLIS_RETURN_IF_ERROR(Finish(st, "DeclareKeys"));
  return std::move(*resp.mutable_shard_map());
}

Status SchedulerClient::Barrier(const std::string& name, v1::Role role, int32_t rank,
                                int64_t generation, bool all_nodes,
                                std::chrono::milliseconds wait) {
  grpc::ClientContext ctx;
  Prepare(&ctx, std::max(wait, std::chrono::milliseconds(1)));
  v1::BarrierRequest req;
  req.set_name(name);
  req.set_role(role);
  req.set_rank(rank);
  req.set_generation(generation);
  req.set_all_nodes(all_nodes);
  v1::BarrierResponse resp;
  return Finish(Stub()->Barrier(&ctx, req, &resp), "Barrier");
}

StatusOr<v1::HeartbeatResponse> SchedulerClient::Heartbeat(v1::Role role, int32_t rank,
                                                           int64_t incarnation,
                                                           const std::string& state) {
  grpc::ClientContext ctx;
  Prepare(&ctx, BeatTimeout());
  v1::HeartbeatRequest req;
  req.set_role(role);
  req.set_rank(rank);
  req.set_incarnation(incarnation);
  req.set_state(state);
  v1::HeartbeatResponse resp;
  auto st = Stub()->Heartbeat(&ctx, req, &resp);
  TRELLIS_RETURN_IF_ERROR(Finish(st, "Heartbeat"));
  return resp;
}

Status SchedulerClient::ReportProgress(const v1::ReportProgressRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout);
  v1::ReportProgressResponse resp;
  return Finish(Stub()->ReportProgress(&ctx, request, &resp), "ReportProgress");
}

StatusOr<v1::JobProgress> SchedulerClient::GetProgress() {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout);
  v1::JobProgress resp;
  TRELLIS_RETURN_IF_ERROR(Finish(Stub()->GetProgress(&ctx, v1::GetProgressRequest{}, &resp),
                                 "GetProgress"));
  return resp;
}

Status SchedulerClient::StopJob(const std::string& reason) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout);
  v1::StopJobRequest req;
  req.set_reason(reason);
  v1::StopJobResponse resp;
  return Finish(Stub()->StopJob(&ctx, req, &resp), "StopJob");
}

StatusOr<v1::ResizeResponse> SchedulerClient::Resize(int32_t workers, const std::string& reason,
                                                     int32_t servers) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout);
  v1::ResizeRequest req;
  req.set_workers(workers);
  req.set_reason(reason);
  req.set_servers(servers);
  v1::ResizeResponse resp;
  TRELLIS_RETURN_IF_ERROR(Finish(Stub()->Resize(&ctx, req, &resp), "Resize"));
  return resp;
}

StatusOr<v1::ReachStepResponse> SchedulerClient::ReachStep(const v1::ReachStepRequest& request,
                                                           std::chrono::milliseconds wait_for) {
  grpc::ClientContext ctx;
  Prepare(&ctx, request.wait() ? std::max(wait_for, std::chrono::milliseconds(1))
                               : options_.rpc_timeout);
  v1::ReachStepResponse resp;
  TRELLIS_RETURN_IF_ERROR(Finish(Stub()->ReachStep(&ctx, request, &resp), "ReachStep"));
  return resp;
}

Status SchedulerClient::ReportCheckpoint(const v1::ReportCheckpointRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout);
  v1::ReportCheckpointResponse resp;
  return Finish(Stub()->ReportCheckpoint(&ctx, request, &resp), "ReportCheckpoint");
}

StatusOr<v1::PodStoppingResponse> SchedulerClient::PodStopping(v1::Role role, int32_t rank, int64_t incarnation) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout);
  v1::PodStoppingRequest req;
  req.set_role(role);
  req.set_rank(rank);
  req.set_incarnation(incarnation);
  v1::PodStoppingResponse resp;
  TRELLIS_RETURN_IF_ERROR(Finish(Stub()->PodStopping(&ctx, req, &resp), "PodStopping"));
  return resp;
}

Status SchedulerClient::ReportExit(const v1::ReportExitRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout);
  v1::ReportExitResponse resp;
  return Finish(Stub()->ReportExit(&ctx, request, &resp), "ReportExit");
}

Status SchedulerClient::Leave(v1::Role role, int32_t rank) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout);
  v1::LeaveRequest req;
  req.set_role(role);
  req.set_rank(rank);
  v1::LeaveResponse resp;
  return Finish(Stub()->Leave(&ctx, req, &resp), "Leave");
}

Status SchedulerClient::PublishGroupKey(const std::string& group, const std::string& key) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout);
  v1::PublishGroupKeyRequest req;
  req.set_group(group);
  req.set_key(key);
  v1::PublishGroupKeyResponse resp;
  return Finish(Stub()->PublishGroupKey(&ctx, req, &resp), "PublishGroupKey");
}

StatusOr<std::string> SchedulerClient::GetGroupKey(const std::string& group,
                                                   std::chrono::milliseconds wait) {
  grpc::ClientContext ctx;
  Prepare(&ctx, std::max(wait, std::chrono::milliseconds(1)));
  v1::GetGroupKeyRequest req;
  req.set_group(group);
  v1::GetGroupKeyResponse resp;
  auto st = Stub()->GetGroupKey(&ctx, req, &resp);
  TRELLIS_RETURN_IF_ERROR(Finish(st, "GetGroupKey"));
  return std::move(*resp.mutable_key());
}

StatusOr<v1::RequestRejoinResponse> SchedulerClient::RequestRejoin(int32_t rank,
                                                                   int64_t incarnation,
                                                                   std::chrono::milliseconds wait) {
  grpc::ClientContext ctx;
  Prepare(&ctx, std::max(wait, std::chrono::milliseconds(1)));
  v1::RequestRejoinRequest req;
  req.set_rank(rank);
  req.set_incarnation(incarnation);
  v1::RequestRejoinResponse resp;
  TRELLIS_RETURN_IF_ERROR(Finish(Stub()->RequestRejoin(&ctx, req, &resp), "RequestRejoin"));
  return resp;
}

StatusOr<v1::WatchRejoinsResponse> SchedulerClient::WatchRejoins(int32_t rank, int64_t incarnation,
                                                                 WatchMode mode,
                                                                 std::chrono::milliseconds wait) {
  grpc::ClientContext ctx;
  Prepare(&ctx, std::max(wait, std::chrono::milliseconds(1)));
  v1::WatchRejoinsRequest req;
  req.set_rank(rank);
  req.set_incarnation(incarnation);
  req.set_wait(mode == WatchMode::kPoll);
  req.set_stop(mode == WatchMode::kStop);
  v1::WatchRejoinsResponse resp;
  TRELLIS_RETURN_IF_ERROR(Finish(Stub()->WatchRejoins(&ctx, req, &resp), "WatchRejoins"));
  return resp;
}

Status SchedulerClient::RejoinServed(const v1::RejoinServedRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout);
  v1::RejoinServedResponse resp;
  return Finish(Stub()->RejoinServed(&ctx, request, &resp), "RejoinServed");
}

StatusOr<v1::PingResponse> SchedulerClient::Ping(const v1::PingRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, BeatTimeout());
  v1::PingResponse resp;
  TRELLIS_RETURN_IF_ERROR(Finish(Stub()->Ping(&ctx, request, &resp), "Ping"));
  return resp;
}

StatusOr<v1::ResumeResponse> SchedulerClient::Resume(const v1::ResumeRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout);
  v1::ResumeResponse resp;
  TRELLIS_RETURN_IF_ERROR(Finish(Stub()->Resume(&ctx, request, &resp), "Resume"));
  return resp;
}

bool InTheWorld(const v1::ClusterView& view, v1::Role role, int32_t rank) {
  if (rank < 0) return true;
  if (role == v1::ROLE_SERVER) return view.num_servers() <= 0 || rank < view.num_servers();
  const auto& m = view.world().members();
  return m.empty() || std::find(m.begin(), m.end(), rank) != m.end();
}

}  // namespace trellis
