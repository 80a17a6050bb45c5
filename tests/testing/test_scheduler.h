// A real scheduler for in-process tests: gRPC on a free loopback port, the dead-node sweeper every
// 10 ms (so tests of dead nodes and long polls stay fast), and clients connected to it.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "common/base/status.h"
#include "scheduler/scheduler_client.h"
#include "scheduler/scheduler_service.h"

namespace trellis::testing {

inline StatusOr<std::unique_ptr<SchedulerServer>> StartTestScheduler(SchedulerConfig config,
                                                                     const std::string& token) {
  SchedulerServerOptions options;
  options.host = "127.0.0.1";
  options.service.token = token;
  options.sweep_interval = std::chrono::milliseconds(10);
  return SchedulerServer::Start(std::move(config), std::move(options));
}

// A client of `server` presenting `token` (the server checks it on every call).
inline StatusOr<std::unique_ptr<SchedulerClient>> ConnectTestClient(const SchedulerServer& server,
                                                                    const std::string& token) {
  return SchedulerClient::Connect({server.address(), token, std::chrono::seconds(5)});
}

}  // namespace trellis::testing
