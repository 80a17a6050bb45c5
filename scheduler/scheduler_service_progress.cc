// The progress calls of the scheduler's service: answered at once from the ProgressTracker.
#include "common/grpc_status.h"
#include "scheduler/scheduler_service.h"

namespace trellis {

grpc::ServerUnaryReactor* SchedulerService::ReportProgress(grpc::CallbackServerContext* ctx,
                                                           const v1::ReportProgressRequest* req,
                                                           v1::ReportProgressResponse* /*resp*/) {
  auto* reactor = ctx->DefaultReactor();
  grpc::Status st = CheckToken(ctx);
  if (st.ok()) st = ToGrpc(progress_->Report(*req));
  reactor->Finish(st);
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::GetProgress(grpc::CallbackServerContext* ctx,
                                                        const v1::GetProgressRequest* /*req*/,
                                                        v1::JobProgress* resp) {
  auto* reactor = ctx->DefaultReactor();
  grpc::Status st = CheckToken(ctx);
  if (st.ok()) *resp = progress_->Snapshot(state_->GetCluster());
  reactor->Finish(st);
  return reactor;
}

}  // namespace trellis
