// The worker's gRPC link as the gRPC link tests start it (worker_link_test: against a
// hand-driven stream; server_link_test: against the server's link).
#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "datapath/grpc/worker_link.h"
#include "tests/unit/datapath/link_recorder.h"

namespace trellis::link {

// Connects worker 1 to `address` with `token` and starts the link reporting to `rec` (which
// outlives it); nullptr, and a test failure, when it could not.
inline std::unique_ptr<WorkerLink> StartedGrpcLink(const std::string& address,
                                                   const std::string& token, Recorder& rec) {
  LinkOptions o;
  o.address.service = address;
  o.token = token;
  o.worker_rank = 1;
  o.max_answer_payload = 16 << 20;
  auto l = ConnectGrpcLink(o, nullptr);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  if (!l.ok()) return nullptr;
  (*l)->Start(&rec);
  return std::move(*l);
}

}  // namespace trellis::link
