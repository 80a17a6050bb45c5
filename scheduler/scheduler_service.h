// The scheduler's gRPC face: a callback (reactor) service over SchedulerState, and the server
// that owns it. Long polls and barriers hold no thread while they wait: the reactor is parked in
// the state and finished by whichever call makes its condition true, or by the sweeper thread
// at its deadline.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "common/tls/tls.h"
#include "scheduler/clock.h"
#include "scheduler/progress_tracker.h"
#include "scheduler/scheduler_state.h"
#include "trellis/v1/scheduler.grpc.pb.h"

namespace trellis {

struct SchedulerServiceOptions {
  std::string token;     // expected in "x-trellis-token"; empty: no check (local runs)
  std::string job_yaml;  // what GetJob returns
  // Longest a waiting call is held, whatever deadline the client sent.
  std::chrono::milliseconds max_wait{std::chrono::minutes(10)};
};

// GetCluster and DeclareKeys are raw (ByteBuffer) methods: their answers -- a view of every node,
// a map of every key -- go to hundreds of waiters at once, so each distinct answer is serialized
// once and its bytes shared (reference-counted slices) by every reply.
using SchedulerServiceBase = v1::Scheduler::WithRawCallbackMethod_GetCluster<
    v1::Scheduler::WithRawCallbackMethod_DeclareKeys<v1::Scheduler::CallbackService>>;

// Answers a unary call at once with `st` (OK or not): every call that does not wait.
grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* ctx, const grpc::Status& st);

class SchedulerService final : public SchedulerServiceBase {
 public:
  // `state` and `progress` outlive the service.
  SchedulerService(SchedulerState* state, ProgressTracker* progress,
                   SchedulerServiceOptions options);

  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::GetJobResponse* resp) override;
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const v1::RegisterRequest* req,
                                     v1::RegisterResponse* resp) override;
  grpc::ServerUnaryReactor* ReportReady(grpc::CallbackServerContext* ctx,
                                        const v1::ReportReadyRequest* req,
                                        v1::ReportReadyResponse* resp) override;
  // GetClusterRequest -> ClusterView
  grpc::ServerUnaryReactor* GetCluster(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* req,
                                       grpc::ByteBuffer* resp) override;
  // DeclareKeysRequest -> DeclareKeysResponse
  grpc::ServerUnaryReactor* DeclareKeys(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* req,
                                        grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* ctx,
                                    const v1::BarrierRequest* req,
                                    v1::BarrierResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* ReportExit(grpc::CallbackServerContext* ctx,
                                       const v1::ReportExitRequest* req,
                                       v1::ReportExitResponse* resp) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const v1::LeaveRequest* req,
                                  v1::LeaveResponse* resp) override;
  grpc::ServerUnaryReactor* PublishGroupKey(grpc::CallbackServerContext* ctx,
                                            const v1::PublishGroupKeyRequest* req,
                                            v1::PublishGroupKeyResponse* resp) override;
  grpc::ServerUnaryReactor* GetGroupKey(grpc::CallbackServerContext* ctx,
                                        const v1::GetGroupKeyRequest* req,
                                        v1::GetGroupKeyResponse* resp) override;
  grpc::ServerUnaryReactor* RequestRejoin(grpc::CallbackServerContext* ctx,
                                          const v1::RequestRejoinRequest* req,
                                          v1::RequestRejoinResponse* resp) override;
  grpc::ServerUnaryReactor* WatchRejoins(grpc::CallbackServerContext* ctx,
                                         const v1::WatchRejoinsRequest* req,
                                         v1::WatchRejoinsResponse* resp) override;
  grpc::ServerUnaryReactor* RejoinServed(grpc::CallbackServerContext* ctx,
                                         const v1::RejoinServedRequest* req,
                                         v1::RejoinServedResponse* resp) override;
  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* ctx, const v1::PingRequest* req,
                                 v1::PingResponse* resp) override;
  grpc::ServerUnaryReactor* Resume(grpc::CallbackServerContext* ctx,
                                   const v1::ResumeRequest* req,
                                   v1::ResumeResponse* resp) override;
  // Training progress (scheduler_service_progress.cc).
  grpc::ServerUnaryReactor* ReportProgress(grpc::CallbackServerContext* ctx,
                                           const v1::ReportProgressRequest* req,
                                           v1::ReportProgressResponse* resp) override;
  grpc::ServerUnaryReactor* GetProgress(grpc::CallbackServerContext* ctx,
                                        const v1::GetProgressRequest* req,
                                        v1::JobProgress* resp) override;
  // Stopping the whole job with an exit checkpoint, and rank 0's checkpoints
  // (scheduler_service_progress.cc; docs/checkpoints.md#stopping-a-job-the-exit-checkpoint).
  grpc::ServerUnaryReactor* StopJob(grpc::CallbackServerContext* ctx, const v1::StopJobRequest* req,
                                    v1::StopJobResponse* resp) override;
  grpc::ServerUnaryReactor* ReportCheckpoint(grpc::CallbackServerContext* ctx,
                                             const v1::ReportCheckpointRequest* req,
                                             v1::ReportCheckpointResponse* resp) override;
  grpc::ServerUnaryReactor* PodStopping(grpc::CallbackServerContext* ctx, const v1::PodStoppingRequest* req,
                                        v1::PodStoppingResponse* resp) override;
  // Elastic jobs (scheduler_service_progress.cc; docs/elastic.md).
  grpc::ServerUnaryReactor* Resize(grpc::CallbackServerContext* ctx, const v1::ResizeRequest* req,
                                   v1::ResizeResponse* resp) override;
  grpc::ServerUnaryReactor* ReachStep(grpc::CallbackServerContext* ctx,
                                      const v1::ReachStepRequest* req,
                                      v1::ReachStepResponse* resp) override;

 private:
  // UNAUTHENTICATED unless the call carries the job token.
  grpc::Status CheckToken(grpc::CallbackServerContext* ctx) const;
  // When a waiting call is answered: a little before the client's deadline (so the answer
  // arrives in time), capped by max_wait.
  Clock::TimePoint WaitDeadline(grpc::CallbackServerContext* ctx) const;

  // The serialized form of the last answer handed out, shared by every reply carrying it.
  struct AnswerCache {
    Mutex mu;
    std::weak_ptr<const void> of GUARDED_BY(mu);  // the answer `bytes` were made from
    grpc::ByteBuffer bytes GUARDED_BY(mu);
  };
  // Bytes of `make()`'s message for `answer`, serialized only when `answer` is new.
  template <typename MakeMessage>
  static grpc::ByteBuffer SharedBytes(AnswerCache* cache, const std::shared_ptr<const void>& answer,
                                      MakeMessage make);

  SchedulerState* const state_;
  ProgressTracker* const progress_;
  const SchedulerServiceOptions options_;
  AnswerCache view_cache_;
  AnswerCache map_cache_;

  // The keys part (after the rank) of a declaration the state accepted; equal bytes from another
  // worker are the same keys.
  Mutex known_keys_mu_;
  std::shared_ptr<const std::string> known_key_bytes_ GUARDED_BY(known_keys_mu_);
};

struct SchedulerServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: pick a free port (see SchedulerServer::port())
  SchedulerServiceOptions service;
  std::chrono::milliseconds sweep_interval{50};  // dead-node and deadline checks
  ProgressOptions progress;                      // spec.monitoring
  const Clock* clock = nullptr;                  // default: the steady clock
  TlsPtr tls;  // mutual TLS (common/tls/tls.h); nullptr: plaintext
};

// Owns the state, the service, the grpc::Server and the sweeper thread.
class SchedulerServer {
 public:
  // Validates the config, binds host:port and starts serving.
  static StatusOr<std::unique_ptr<SchedulerServer>> Start(SchedulerConfig config,
                                                          SchedulerServerOptions options);
  ~SchedulerServer();  // Shutdown()
  SchedulerServer(const SchedulerServer&) = delete;
  SchedulerServer& operator=(const SchedulerServer&) = delete;

  int port() const { return port_; }
  // host:port to connect to ("127.0.0.1:port" when bound to the wildcard address).
  std::string address() const;
  SchedulerState& state() { return *state_; }
  ProgressTracker& progress() { return *progress_; }

  // Its pod is being stopped (SIGTERM): while the whole job is being stopped (StopJob, or every
  // worker's pod too: pod_stops.h), keeps serving until rank 0's exit checkpoint is reported,
  // at most the job's stop_limit; returns when rank 0 writes none, or when the job is not
  // stopping within the job's pod_stop_window and a second (only this pod is deleted: its
  // replacement takes over the running job).
  void OutliveTheJobsStop();
  // Answers every waiting call (UNAVAILABLE), stops the server and the sweeper. Idempotent.
  void Shutdown() EXCLUDES(mu_);

 private:
  SchedulerServer() = default;
  void SweepLoop() EXCLUDES(mu_);

  SteadyClock steady_clock_;
  SchedulerServerOptions options_;
  std::unique_ptr<SchedulerState> state_;
  std::unique_ptr<ProgressTracker> progress_;
  std::unique_ptr<SchedulerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread sweeper_;    // runs SweepLoop until stopping_
};

}  // namespace trellis
