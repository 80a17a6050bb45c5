// A parameter server for the TCP listener's tests: loopback, W = 1, the job token `token`, one
// float32 key of 4 elements (id 7) installed on the store directly.
#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "pserver/parameter_server.h"
#include "scheduler/shard_map.h"

namespace trellis::testing {

// `o`'s listen host, worker count, token and pool are set here; the rest is the caller's.
inline std::unique_ptr<ParameterServer> StartTcpTestServer(const std::string& token,
                                                           PserverOptions o = {}) {
  o.listen_host = "127.0.0.1";
  o.store.num_workers = 1;
  o.service.token = token;
  o.service.pool_threads = 2;
  auto ps = ParameterServer::Start(o);
  EXPECT_TRUE(ps.ok()) << ps.status().ToString();
  if (!ps.ok()) return nullptr;
  v1::KeySpec k;
  k.set_id(7);
  k.set_name("k7");
  k.set_num_elements(4);
  k.set_dtype(v1::DTYPE_FLOAT32);
  auto m = BuildShardMap({k}, 1, "roundRobin", 1 << 20);
  int64_t slices = 0, bytes = 0;
  EXPECT_TRUE(m.ok() && (*ps)->store()->Install(*m, &slices, &bytes).ok());
  return std::move(*ps);
}

}  // namespace trellis::testing
