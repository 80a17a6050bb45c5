// The progress calls of the scheduler's service: answered at once from the ProgressTracker.
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

}  // namespace trellis
