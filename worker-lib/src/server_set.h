// The job's parameter servers as one worker sees them: their data addresses (index = server
// rank), one connection to each, opened by the first declaration round (a connection needs the
// map's slice size), and each shard map installed on every server. Connections are made in one
// place, Connect: the only code here that knows how a data address becomes a connection.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "trellis/v1/scheduler.pb.h"
#include "worker-lib/src/server_connection.h"
#include "worker-lib/src/worker_metrics.h"
#include "worker-lib/src/worker_setup.h"

namespace trellis {

class ServerSet {
 public:
  // `setup` and `series` outlive the set. `world`: the worker's world (RecoveryOptions::world);
  // null: none.
  ServerSet(const WorkerSetup& setup, WorkerMetrics& series,
            std::function<std::pair<int64_t, std::vector<int32_t>>()> world = nullptr)
      : setup_(setup), series_(series), world_(std::move(world)) {}
  ServerSet(const ServerSet&) = delete;
  ServerSet& operator=(const ServerSet&) = delete;

  int32_t size() const { return static_cast<int32_t>(setup_.server_addresses.size()); }
  // The address the worker was given for `server` (a recovering connection may have moved on).
  const std::string& address(int32_t server) const { return setup_.server_addresses[server]; }

  // The first round: a connection to every server, `map` installed on each. On an error none is
  // kept (the next round opens them again).
  Status Open(const v1::ShardMap& map);
  // A later round (deferred init): the servers add the new keys' slices; the rest stays.
  Status InstallShardMap(const v1::ShardMap& map);
  // REQUIRES: Open succeeded, Close not called.
  ServerConnection& connection(int32_t server) const { return *connections_[server]; }
  // Closes every connection: what they still have pending fails.
  void Close() { connections_.clear(); }

 private:
  // A connection to `server` for a map of `slice_bytes` slices over the job's transport,
  // retaining pushes and reconnecting when the job asks for it (server_connection.h).
  StatusOr<std::unique_ptr<ServerConnection>> Connect(int32_t server, int64_t slice_bytes) const;

  const WorkerSetup& setup_;
  WorkerMetrics& series_;
  const std::function<std::pair<int64_t, std::vector<int32_t>>()> world_;
  // Written by Open (under the key table's round lock, before any operation may start) and by
  // Close (the worker's destructor, once nothing is dispatched any more); read without a lock in
  // between.
  std::vector<std::unique_ptr<ServerConnection>> connections_;
};

}  // namespace trellis
