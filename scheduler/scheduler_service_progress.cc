// The progress calls of the scheduler's service, answered at once from the ProgressTracker, and
// what the job's end from outside needs: StopJob, rank 0's ReportCheckpoint and the agents'
// PodStopping.
#include <chrono>

#include "common/base/grpc_status.h"
#include "scheduler/scheduler_service.h"

namespace trellis {

grpc::ServerUnaryReactor* SchedulerService::ReportProgress(grpc::CallbackServerContext* ctx,
                                                           const v1::ReportProgressRequest* req,
                                                           v1::ReportProgressResponse* /*resp*/) {
  auto* reactor = ctx->DefaultReactor();
  grpc::Status st = CheckToken(ctx);
  if (st.ok()) st = ToGrpc(progress_->Report(*req));
  // The report is also the program's liveness and step (stall detection).
  if (st.ok()) state_->ProgramProgress(req->rank(), req->incarnation(), req->step());
  reactor->Finish(st);
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::GetProgress(grpc::CallbackServerContext* ctx,
                                                        const v1::GetProgressRequest* /*req*/,
                                                        v1::JobProgress* resp) {
  auto* reactor = ctx->DefaultReactor();
  grpc::Status st = CheckToken(ctx);
  if (st.ok()) {
    const v1::ClusterView view = state_->GetCluster();
    *resp = progress_->Snapshot(view);
    int64_t pending = 0;
    std::vector<v1::ResizeInfo> resizes;
    std::vector<int32_t> pending_members;
    int32_t pending_servers = 0;
    *resp->mutable_world() = state_->World(&pending, &resizes, &pending_members, &pending_servers);
    resp->set_resize_pending_epoch(pending);
    resp->set_resize_pending_servers(pending_servers);
    for (int32_t m : pending_members) resp->add_resize_pending_members(m);
    if (!resizes.empty()) *resp->mutable_last_resize() = resizes.back();
    const std::string stop = state_->stop_reason();
    resp->set_stopping(!stop.empty());
    resp->set_stop_reason(stop);
    // Stalled members, stalled or restarting after a stall (the operator's Stalled condition).
    for (const auto* nodes : {&view.servers(), &view.workers()}) {
      for (const auto& n : *nodes) {
        if (!n.stalled() && !(n.restarting() && !n.stall_reason().empty())) continue;
        resp->add_stalled(std::string(n.role() == v1::ROLE_SERVER ? "server " : "worker ") +
                          std::to_string(n.rank()) + " (pod " + n.pod_name() + ") stalled: " +
                          n.stall_reason() + (n.stalled() ? "" : "; being restarted"));
      }
    }
  }
  reactor->Finish(st);
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::Resize(grpc::CallbackServerContext* ctx,
                                                   const v1::ResizeRequest* req,
                                                   v1::ResizeResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  auto r = state_->Resize(*req);
  if (r.ok()) *resp = std::move(r).value();
  return FinishNow(ctx, ToGrpc(r.status()));
}

grpc::ServerUnaryReactor* SchedulerService::ReachStep(grpc::CallbackServerContext* ctx,
                                                      const v1::ReachStepRequest* req,
                                                      v1::ReachStepResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  auto* reactor = ctx->DefaultReactor();
  state_->ReachStep(*req, WaitDeadline(ctx), [reactor, resp](StatusOr<v1::ReachStepResponse> r) {
    if (r.ok()) *resp = std::move(r).value();
    reactor->Finish(ToGrpc(r.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::StopJob(grpc::CallbackServerContext* ctx,
                                                    const v1::StopJobRequest* req,
                                                    v1::StopJobResponse* /*resp*/) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  state_->StopJob(req->reason().substr(0, 256));  // a log line, not a document
  return FinishNow(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* SchedulerService::ReportCheckpoint(grpc::CallbackServerContext* ctx,
                                                             const v1::ReportCheckpointRequest* req,
                                                             v1::ReportCheckpointResponse* /*resp*/) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  const int64_t unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  return FinishNow(ctx, ToGrpc(progress_->NoteCheckpoint(*req, unix_ms)));
}

grpc::ServerUnaryReactor* SchedulerService::PodStopping(grpc::CallbackServerContext* ctx,
                                                        const v1::PodStoppingRequest* req,
                                                        v1::PodStoppingResponse* resp) {
  if (auto st = CheckToken(ctx); !st.ok()) return FinishNow(ctx, st);
  const ProgressTracker::ExitState exit = progress_->exit_state();
  auto r = state_->PodStopping(*req, exit.ready, exit.written);
  if (r.ok()) *resp = *r;
  return FinishNow(ctx, r.ok() ? grpc::Status::OK : ToGrpc(r.status()));
}

}  // namespace trellis
