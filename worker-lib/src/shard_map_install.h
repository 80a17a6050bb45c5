// The control calls both transports make beside the data stream, over gRPC: hand the
// scheduler's shard map to a server (DataService.InstallShardMap), before the first frame; and at
// a server resize, one slice handover request (DataService.HandOver, datapath/handover.h).
#pragma once

#include <cstdint>
#include <string>

#include "common/base/status.h"
#include "trellis/v1/data.grpc.pb.h"
#include "worker-lib/src/transport.h"

namespace trellis {

// `frame`: a whole request frame of op handout or handin. Returns the answer's payload (a
// handout's part; empty for a handin).
StatusOr<std::string> HandOverOnServer(v1::DataService::Stub* stub, const ConnectionOptions& options,
                                       const std::string& frame, int64_t timeout_ms);

Status InstallShardMapOnServer(v1::DataService::Stub* stub, const ConnectionOptions& options,
                               const v1::ShardMap& map, int32_t server_rank, int64_t timeout_ms);

}  // namespace trellis
