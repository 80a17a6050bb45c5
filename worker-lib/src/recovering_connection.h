// A ServerConnection that outlives its server's process (docs/checkpoints.md, "Crash recovery:
// servers"). It wraps a transport connection (gRPC or raw TCP: the same logic for both) and
//  * retains, per slice, the worker's last two pushes as the request bytes that went out (a
//    float32 copy, or the 2-bit frame as sent), so that a restarted server can rebuild;
//  * when the connection ends (UNAVAILABLE: EOF, reset, stream error), holds the requests that
//    were not answered and those sent meanwhile instead of failing them, and reconnects with
//    back-off: re-resolving the server's address (the scheduler's cluster view), re-installing
//    the last shard map, replaying the retained pushes (wire::Op::kReplay) and ending them;
//  * then re-sends what it held: a push the replay covered is answered at once (a pushpull
//    becomes the pull of its step), everything else goes out again.
// The whole recovery is bounded by ConnectionOptions::timeout_ms from the moment the connection
// ended; after that every held request, and every later one, fails with UNAVAILABLE naming the
// server, what was tried and the last error (the worker adds key, slice and step).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <prometheus/counter.h>

#include "common/base/status.h"
#include "worker-lib/src/transport.h"

namespace trellis {

struct RecoveryOptions {
  int32_t server_rank = 0;
  // Opens a connection to a data address's parts (the transport's connect function).
  std::function<StatusOr<std::unique_ptr<ServerConnection>>(const ConnectionOptions&)> connect;
  // The server's current data address (datapath/address.h), waiting at most `wait_ms` for the
  // cluster to be complete again; null: the address does not change.
  std::function<StatusOr<std::string>(int32_t server, int64_t wait_ms)> resolve;
  // Bounds one attempt (resolve, connect, shard map, replays), within the overall timeout.
  int64_t attempt_timeout_ms = 3000;
  // When the scheduler last said a member of the job is being restarted (a stalled server its
  // agent kills and restarts, docs/scheduler.md#stalls); null: never. The recovery gives up only
  // one timeout after that, not while the server is still being restarted.
  std::function<std::chrono::steady_clock::time_point()> restarting_seen_at;
  prometheus::Counter* reconnects = nullptr;  // trellis_worker_server_reconnects_total
  prometheus::Counter* replayed = nullptr;    // trellis_worker_replayed_slices_total
};

// Wraps `first` (already connected with `options`).
std::unique_ptr<ServerConnection> MakeRecoveringConnection(const ConnectionOptions& options,
                                                           RecoveryOptions recovery,
                                                           std::unique_ptr<ServerConnection> first);

}  // namespace trellis
