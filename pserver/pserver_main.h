// The start-up wiring of trellis-pserver: flags > environment > job > defaults.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "pserver/parameter_server.h"

namespace trellis {

// What trellis-pserver runs with, after flags, environment and the job are combined.
struct PserverConfig {
  std::string scheduler_address;  // empty: standalone (no scheduler; --job and --num-workers)
  std::string token;
  std::string advertise_host = "127.0.0.1";
  PserverOptions server;
  // /metrics and /healthz: --metrics-port > TRELLIS_METRICS_PORT; -1: not served.
  int metrics_port = -1;
  std::string metrics_host = "0.0.0.0";  // TRELLIS_METRICS_HOST
  // How often the scheduler is pinged to notice a restart (the job's heartbeat interval).
  std::chrono::milliseconds scheduler_ping{1000};
  // TRELLIS_INCARNATION (the agent's count of this rank's starts), named in the pings; 0: unset.
  int64_t incarnation = 0;
};

// Parses trellis-pserver's command line and environment (the table in pserver_main.cc, each flag
// with its variable of common/config/env_names.h) and reads the job from the scheduler (or from
// --job FILE when no scheduler is given). Errors name the flag or variable.
StatusOr<PserverConfig> LoadPserverConfig(const std::vector<std::string>& args);
// --help, generated from the same table.
std::string PserverUsage();

// main(): start, report ready to the scheduler, serve until SIGINT/SIGTERM. Returns the exit code.
int PserverMain(int argc, char** argv);

}  // namespace trellis
