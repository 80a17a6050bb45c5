// A real parameter server for in-process data-path tests: gRPC and raw TCP on free loopback
// ports, and the shard map of its one key (id 7, "fc1", float32), which a connection installs
// before its first push.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "common/status.h"
#include "common/tls.h"
#include "pserver/parameter_server.h"
#include "scheduler/shard_map.h"
#include "worker-lib/src/transport.h"

namespace trellis::testing {

struct TestPserver {
  std::unique_ptr<ParameterServer> server;
  v1::ShardMap map;
};

// `slice_bytes` sizes both the server's receive limit and the shard map's slices; `workers`
// is how many pushes a step waits for; `tls` nullptr: plaintext.
inline StatusOr<TestPserver> StartTestPserver(const std::string& token, int64_t elements,
                                              int64_t slice_bytes = 1 << 20, int workers = 1,
                                              TlsPtr tls = nullptr) {
  PserverOptions o;
  o.listen_host = "127.0.0.1";
  o.store.num_workers = workers;
  o.service.token = token;
  o.service.pool_threads = 1;
  o.slice_bytes = slice_bytes;
  o.tls = std::move(tls);
  TestPserver ps;
  TRELLIS_ASSIGN_OR_RETURN(ps.server, ParameterServer::Start(o));
  v1::KeySpec k;
  k.set_id(7);
  k.set_name("fc1");
  k.set_num_elements(elements);
  k.set_dtype(v1::DTYPE_FLOAT32);
  TRELLIS_ASSIGN_OR_RETURN(ps.map, BuildShardMap({k}, 1, "roundRobin", slice_bytes));
  return ps;
}

// `o` pointed at `ps` (its gRPC address and TCP port).
inline ConnectionOptions ConnectionTo(const ParameterServer& ps, ConnectionOptions o) {
  o.address = "127.0.0.1:" + std::to_string(ps.port());
  o.tcp_port = ps.tcp_port();
  return o;
}

// A connection to `ps` over `transport` ("grpc" or "tcp"); the shard map is not installed yet.
inline StatusOr<std::unique_ptr<ServerConnection>> ConnectTestPserver(const ParameterServer& ps,
                                                                      const std::string& transport,
                                                                      ConnectionOptions o) {
  TRELLIS_ASSIGN_OR_RETURN(auto connect, TransportByName(transport));
  return connect(ConnectionTo(ps, std::move(o)));
}

}  // namespace trellis::testing
