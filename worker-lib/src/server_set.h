// The job's parameter servers as one worker sees them: their data addresses (index = server
// rank), one connection to each, opened by the first declaration round (a connection needs the
// map's slice size), and each shard map installed on every server. Connections are made in one
// place, Connect: the only code here that knows how a data address becomes a connection.
//
// A server resize (worker_impl's MoveServers, at a step boundary) changes the servers in force:
// Expand connects to the servers it adds, SwitchTo puts the new count in force and closes the
// connections to the servers it removed. Room for the job's
// server slots is made once, so a connection found stays where it is while others are added.
#pragma once

#include <atomic>
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
            std::function<std::pair<int64_t, std::vector<int32_t>>()> world = nullptr);
  ServerSet(const ServerSet&) = delete;
  ServerSet& operator=(const ServerSet&) = delete;

  // The servers in force: ranks 0..size()-1.
  int32_t size() const { return count_.load(std::memory_order_acquire); }
  // The address the worker was given for `server` (a recovering connection may have moved on).
  const std::string& address(int32_t server) const { return addresses_[server]; }

  // The first round: a connection to every server, `map` installed on each. On an error none is
  // kept (the next round opens them again).
  Status Open(const v1::ShardMap& map);
  // A later round (deferred init): the servers add the new keys' slices; the rest stays.
  Status InstallShardMap(const v1::ShardMap& map);
  // A server resize to `addresses.size()` servers: connects to those beyond size() and installs
  // `map` on every server of either count (those it leaves retire their slices, those it adds
  // make theirs). Servers in force are still size() until SwitchTo. INVALID_ARGUMENT: more than
  // the job's server slots, or an empty address.
  Status Expand(const v1::ShardMap& map, const std::vector<std::string>& addresses);
  // After the slices moved: `count` servers are in force; the connections beyond are closed.
  void SwitchTo(int32_t count);
  // REQUIRES: Open succeeded, Close not called, server < the most servers in force.
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
  // Index = server rank, room for the job's server slots. Written by Open (under the key table's
  // round lock, before any operation may start), by a server resize (at a step boundary: no
  // operation in flight; an entry beyond size() until it is in force) and by Close (the
  // worker's destructor, once nothing is dispatched any more); read without a lock in between.
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<ServerConnection>> connections_;
  std::atomic<int32_t> count_;
};

}  // namespace trellis
