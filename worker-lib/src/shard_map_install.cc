#include "worker-lib/src/shard_map_install.h"

#include <chrono>
#include <string>

#include <grpcpp/grpcpp.h>

#include "common/tls/auth.h"
#include "common/base/grpc_status.h"

namespace trellis {

Status InstallShardMapOnServer(v1::DataService::Stub* stub, const ConnectionOptions& options,
                               const v1::ShardMap& map, int32_t server_rank, int64_t timeout_ms) {
  grpc::ClientContext ctx;
  if (!options.token.empty()) ctx.AddMetadata(kTokenMetadataKey, options.token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  ctx.set_wait_for_ready(true);
  v1::InstallShardMapRequest req;
  req.set_worker_rank(options.worker_rank);
  req.set_server_rank(server_rank);
  *req.mutable_shard_map() = map;
  v1::InstallShardMapResponse resp;
  Status st = FromGrpc(stub->InstallShardMap(&ctx, req, &resp));
  if (!st.ok()) {
    return st.Annotate("installing the shard map on server " + std::to_string(server_rank) +
                       " (" + options.address.service + ")");
  }
  return Status::Ok();
}

StatusOr<std::string> HandOverOnServer(v1::DataService::Stub* stub, const ConnectionOptions& options,
                                       const std::string& frame, int64_t timeout_ms) {
  grpc::ClientContext ctx;
  if (!options.token.empty()) ctx.AddMetadata(kTokenMetadataKey, options.token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  v1::HandOverRequest req;
  req.set_worker_rank(options.worker_rank);
  req.set_frame(frame);
  v1::HandOverResponse resp;
  Status st = FromGrpc(stub->HandOver(&ctx, req, &resp));
  if (!st.ok()) return st;
  return std::move(*resp.mutable_payload());
}

}  // namespace trellis
