// A real parameter server for in-process tests (pserver and data path): gRPC and raw TCP on free
// loopback ports, float32 keys, and their shard map, installed on the store at once or left to
// the test (a connection's InstallShardMap, or the InstallShardMap RPC).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "pserver/parameter_server.h"
#include "scheduler/shard_map.h"
#include "worker-lib/src/server_connection.h"

namespace trellis::testing {

struct TestPserver {
  std::unique_ptr<ParameterServer> server;
  v1::ShardMap map;
};

// What every test server has: loopback, the job token `token`, one pool thread (the serving
// order is the answer order); the rest are PserverOptions' defaults (one worker, free ports).
inline PserverOptions TestPserverOptions(const std::string& token) {
  PserverOptions o;
  o.listen_host = "127.0.0.1";
  o.service.token = token;
  o.service.pool_threads = 1;
  return o;
}

// A float32 key; `name` empty: "k<id>".
inline v1::KeySpec FloatKey(uint64_t id, int64_t elements, const std::string& name = "") {
  v1::KeySpec k;
  k.set_id(id);
  k.set_name(name.empty() ? "k" + std::to_string(id) : name);
  k.set_num_elements(elements);
  k.set_dtype(v1::DTYPE_FLOAT32);
  return k;
}

enum class MapInstall {
  kOnStore,  // installed on the server's store before it is returned
  kByTest,   // the test installs `map` itself
};

// A server started with `o`, and the shard map of `keys` (one server, round robin, sliced by
// `o.slice_bytes`).
inline StatusOr<TestPserver> StartTestPserver(const PserverOptions& o,
                                              const std::vector<v1::KeySpec>& keys,
                                              MapInstall install) {
  TestPserver ps;
  TRELLIS_ASSIGN_OR_RETURN(ps.server, ParameterServer::Start(o));
  TRELLIS_ASSIGN_OR_RETURN(ps.map, BuildShardMap(keys, 1, "roundRobin", o.slice_bytes));
  if (install == MapInstall::kOnStore) {
    int64_t slices = 0, bytes = 0;
    TRELLIS_RETURN_IF_ERROR(ps.server->store()->Install(ps.map, &slices, &bytes));
  }
  return ps;
}

// `o` pointed at `ps` (its gRPC address and TCP port).
inline ConnectionOptions ConnectionTo(const ParameterServer& ps, ConnectionOptions o) {
  o.address.service = "127.0.0.1:" + std::to_string(ps.port());
  o.address.tcp_port = ps.tcp_port();
  return o;
}

// A connection to `ps` over `transport` ("grpc" or "tcp"); the shard map is not installed yet.
inline StatusOr<std::unique_ptr<ServerConnection>> ConnectTestPserver(const ParameterServer& ps,
                                                                      const std::string& transport,
                                                                      ConnectionOptions o) {
  TRELLIS_ASSIGN_OR_RETURN(LinkOpener open, TransportByName(transport));
  return ServerConnection::Open(ConnectionTo(ps, std::move(o)), std::move(open), std::nullopt);
}

}  // namespace trellis::testing
