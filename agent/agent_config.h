// The agent's configuration, read once at start-up from flags and the environment
// (precedence: flag > environment > job YAML > default).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/config/env.h"
#include "common/job/job_spec.h"
#include "common/base/status.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

// --help: generated from the agent's option table (agent_config.cc), flags and environment.
std::string AgentUsage();

struct AgentConfig {
  std::string job;
  std::string scheduler_address;  // host:port, validated
  v1::Role role = v1::ROLE_UNSPECIFIED;
  int32_t num_servers = 0;
  int32_t num_workers = 0;
  std::string token_file;
  std::string pod_name;
  std::string host = "127.0.0.1";
  int32_t gpus = 0;
  // Metrics. The program's /metrics port (TRELLIS_METRICS_PORT of the agent's own environment,
  // passed on; unset: a free port per start). The agent's own /metrics (TRELLIS_AGENT_METRICS_PORT;
  // unset: none), served once registered. Both bind TRELLIS_METRICS_HOST (default 0.0.0.0).
  std::optional<int32_t> program_metrics_port;
  std::optional<int32_t> metrics_port;
  std::string metrics_host = "0.0.0.0";

  // Unset: from the job YAML (the role's restartPolicy, else runPolicy), else the defaults.
  std::optional<RestartPolicy> restart_policy;
  std::optional<int32_t> backoff_limit;
  std::chrono::milliseconds backoff_initial{200};
  std::chrono::milliseconds backoff_max{10000};
  std::chrono::milliseconds stop_grace{10000};

  // Elastic servers: this agent runs server rank `take_over_server`, lost for good, that the
  // scheduler gave its pod to take over (agent/takeover_agents.h; the pod's agent starts it).
  // -1: an agent of its own pod.
  int32_t take_over_server = -1;

  std::vector<std::string> command;  // empty: the role's default program (servers)
  bool help = false;
};

// `args` excludes argv[0]. `hostname` is the pod name default. Errors name the flag or the
// environment variable ("environment variable TRELLIS_ROLE: must be server or worker, got 'x'").
StatusOr<AgentConfig> ParseAgentConfig(const std::vector<std::string>& args, const EnvSource& env,
                                       const std::string& hostname);

std::string_view RoleName(v1::Role role);  // "server", "worker"

}  // namespace trellis
