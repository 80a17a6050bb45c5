#include "worker-lib/src/server_set.h"

#include <algorithm>

#include "datapath/address.h"

namespace trellis {

ServerSet::ServerSet(const WorkerSetup& setup, WorkerMetrics& series,
                     std::function<std::pair<int64_t, std::vector<int32_t>>()> world)
    : setup_(setup),
      series_(series),
      world_(std::move(world)),
      addresses_(setup.server_addresses),
      count_(static_cast<int32_t>(setup.server_addresses.size())) {
  addresses_.resize(std::max<size_t>(addresses_.size(), static_cast<size_t>(setup.server_slots)));
}

Status ServerSet::Open(const v1::ShardMap& map) {
  std::vector<std::unique_ptr<ServerConnection>> servers(addresses_.size());
  for (int32_t s = 0; s < size(); ++s) {
    TRELLIS_ASSIGN_OR_RETURN(servers[s], Connect(s, map.slice_bytes()));
    TRELLIS_RETURN_IF_ERROR(servers[s]->InstallShardMap(map, s, setup_.timeout_ms));
  }
  connections_ = std::move(servers);
  return Status::Ok();
}

Status ServerSet::Expand(const v1::ShardMap& map, const std::vector<std::string>& addresses) {
  const int32_t to = static_cast<int32_t>(addresses.size());
  if (connections_.empty()) {
    return FailedPreconditionError("server resize before this worker's first declaration round");
  }
  if (to < 1 || addresses.size() > addresses_.size()) {
    return InvalidArgumentError("server resize to " + std::to_string(to) + " servers: the job has " +
                                std::to_string(addresses_.size()) + " server slots");
  }
  for (int32_t s = 0; s < to; ++s) {
    if (addresses[s].empty()) {
      return InvalidArgumentError("server resize: server " + std::to_string(s) + " has no data address");
    }
  }
  for (int32_t s = size(); s < to; ++s) {
    addresses_[s] = addresses[s];
    TRELLIS_ASSIGN_OR_RETURN(connections_[s], Connect(s, map.slice_bytes()));
  }
  for (int32_t s = 0; s < std::max(size(), to); ++s) {
    TRELLIS_RETURN_IF_ERROR(connections_[s]->InstallShardMap(map, s, setup_.timeout_ms));
  }
  return Status::Ok();
}

void ServerSet::SwitchTo(int32_t count) {
  count_.store(count, std::memory_order_release);
  for (size_t s = static_cast<size_t>(count); s < connections_.size(); ++s) connections_[s].reset();
}

Status ServerSet::InstallShardMap(const v1::ShardMap& map) {
  for (int32_t s = 0; s < size(); ++s) {
    TRELLIS_RETURN_IF_ERROR(connections_[s]->InstallShardMap(map, s, setup_.timeout_ms));
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<ServerConnection>> ServerSet::Connect(int32_t s,
                                                               int64_t slice_bytes) const {
  ConnectionOptions o;
  TRELLIS_ASSIGN_OR_RETURN(o.address, DataAddress::Parse(addresses_[s]));
  o.use_local_socket = setup_.local_socket;
  o.timeout_ms = setup_.timeout_ms;
  o.token = setup_.token;
  o.tls = setup_.tls;
  o.worker_rank = setup_.rank;
  o.slice_bytes = slice_bytes;
  std::optional<RecoveryOptions> r;
  if (setup_.retain_pushes) {
    r.emplace();
    r->server_rank = s;
    r->resolve = setup_.resolve_server;
    if (setup_.peers_restarting) {
      r->restarting_seen_at = [f = setup_.peers_restarting] { return f().first; };
    }
    r->reconnects = series_.reconnects();
    r->replayed = series_.replayed();
    r->world = world_;
  }
  return ServerConnection::Open(o, setup_.connect, std::move(r));
}

}  // namespace trellis
