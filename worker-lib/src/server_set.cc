#include "worker-lib/src/server_set.h"

#include "datapath/address.h"

namespace trellis {

Status ServerSet::Open(const v1::ShardMap& map) {
  std::vector<std::unique_ptr<ServerConnection>> servers;
  for (int32_t s = 0; s < size(); ++s) {
    TRELLIS_ASSIGN_OR_RETURN(auto conn, Connect(s, map.slice_bytes()));
    TRELLIS_RETURN_IF_ERROR(conn->InstallShardMap(map, s, setup_.timeout_ms));
    servers.push_back(std::move(conn));
  }
  connections_ = std::move(servers);
  return Status::Ok();
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
  TRELLIS_ASSIGN_OR_RETURN(o.address, DataAddress::Parse(setup_.server_addresses[s]));
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
