// The one control call both transports make before their first frame: hand the scheduler's
// shard map to a server over gRPC (DataService.InstallShardMap).
#pragma once

#include <cstdint>

#include "common/base/status.h"
#include "trellis/v1/data.grpc.pb.h"
#include "worker-lib/src/transport.h"

namespace trellis {

Status InstallShardMapOnServer(v1::DataService::Stub* stub, const ConnectionOptions& options,
                               const v1::ShardMap& map, int32_t server_rank, int64_t timeout_ms);

}  // namespace trellis
