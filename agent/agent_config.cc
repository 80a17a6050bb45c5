#include "agent/agent_config.h"

#include <limits>

#include "agent/supervisor.h"
#include "common/config/env_names.h"
#include "common/config/options.h"
#include "common/base/net.h"

namespace trellis {

std::string_view RoleName(v1::Role role) {
  switch (role) {
    case v1::ROLE_SERVER: return "server";
    case v1::ROLE_WORKER: return "worker";
    default: return "unspecified";
  }
}

namespace {

constexpr int64_t kMaxMs = 24LL * 3600 * 1000;
constexpr int64_t kMaxNodes = 100000;

// Flags, and the environment the launcher or the operator hands every agent (env_names.h).
constexpr Option kAgentOptions[] = {
    {"restart-policy", kEnvRestartPolicy, OptionType::kString, 0, 0, "Never|OnFailure|Always|ExitCode",
     "restart the program (default: the job's, else Never)"},
    {"backoff-limit", kEnvBackoffLimit, OptionType::kInt, 0, 1000000, "N", "restarts before giving up"},
    {"backoff-initial-ms", nullptr, OptionType::kInt, 0, kMaxMs, "MS", "first restart delay (default 200)"},
    {"backoff-max-ms", nullptr, OptionType::kInt, 0, kMaxMs, "MS", "longest restart delay (default 10000)"},
    {"stop-grace-ms", nullptr, OptionType::kInt, 0, kMaxMs, "MS",
     "SIGTERM to SIGKILL for the program (default 10000)"},
    {"take-over-server", nullptr, OptionType::kInt, 0, kMaxNodes - 1, "RANK",
     "run server RANK, lost for good, for the pod whose agent starts this one (elastic servers)"},
    {nullptr, kEnvJob, OptionType::kString, 0, 0, "", "the job's name (required)"},
    {nullptr, kEnvScheduler, OptionType::kString, 0, 0, "", "the scheduler's host:port (required)"},
    {nullptr, kEnvRole, OptionType::kString, 0, 0, "", "server | worker (required)"},
    {nullptr, kEnvNumServers, OptionType::kInt, 0, kMaxNodes, "", "servers in the job (required)"},
    {nullptr, kEnvNumWorkers, OptionType::kInt, 1, kMaxNodes, "", "workers in the job (required)"},
    {nullptr, kEnvTokenFile, OptionType::kString, 0, 0, "", "the job token's file (required; empty: no auth)"},
    {nullptr, kEnvPodName, OptionType::kString, 0, 0, "", "default: the hostname"},
    {nullptr, kEnvHost, OptionType::kString, 0, 0, "", "where the others reach this pod (default 127.0.0.1)"},
    {nullptr, kEnvGpus, OptionType::kInt, 0, 1024, "", "GPUs per worker (> 1: one process per GPU)"},
    {nullptr, kEnvMetricsPort, OptionType::kInt, 0, 65535, "", "the program's /metrics (default: a free port)"},
    {nullptr, kEnvAgentMetricsPort, OptionType::kInt, 0, 65535, "", "the agent's own /metrics (default: none)"},
    {nullptr, kEnvMetricsHost, OptionType::kString, 0, 0, "", "where /metrics listens (default: the listen host, else 0.0.0.0)"},
};

StatusOr<std::chrono::milliseconds> Millis(const Resolver& r, const char* flag, std::chrono::milliseconds fallback) {
  TRELLIS_ASSIGN_OR_RETURN(int64_t ms, r.Int(flag, std::nullopt, fallback.count()));
  return std::chrono::milliseconds(ms);
}

}  // namespace

std::string AgentUsage() {
  return HelpText("usage: trellis-agent [FLAGS] [-- COMMAND ARGS...]\n"
                  "  A server without COMMAND runs trellis-pserver. Flags win over the environment.\n",
                  kAgentOptions);
}

StatusOr<AgentConfig> ParseAgentConfig(const std::vector<std::string>& args, const EnvSource& env,
                                       const std::string& hostname) {
  AgentConfig c;
  TRELLIS_ASSIGN_OR_RETURN(ParsedArgs parsed, ParseArgs(kAgentOptions, args, {.command_after_dashdash = true}));
  if (parsed.help) {
    c.help = true;
    return c;
  }
  c.command = parsed.command;
  const Resolver r(kAgentOptions, parsed, env);
  TRELLIS_ASSIGN_OR_RETURN(c.backoff_initial, Millis(r, "backoff-initial-ms", c.backoff_initial));
  TRELLIS_ASSIGN_OR_RETURN(c.backoff_max, Millis(r, "backoff-max-ms", c.backoff_max));
  TRELLIS_ASSIGN_OR_RETURN(c.stop_grace, Millis(r, "stop-grace-ms", c.stop_grace));
  if (c.backoff_max < c.backoff_initial) {
    return InvalidArgumentError("flag --backoff-max-ms must be >= --backoff-initial-ms");
  }

  TRELLIS_ASSIGN_OR_RETURN(std::optional<Resolver::Raw> policy, r.Lookup("restart-policy"));
  if (policy) {
    auto p = ParseRestartPolicyFlag(policy->text);
    if (!p.ok()) return p.status().Annotate(policy->source);
    c.restart_policy = *p;
  }
  TRELLIS_ASSIGN_OR_RETURN(std::optional<int64_t> take_over, r.OptionalInt("take-over-server"));
  if (take_over) c.take_over_server = static_cast<int32_t>(*take_over);
  TRELLIS_ASSIGN_OR_RETURN(std::optional<int64_t> limit, r.OptionalInt("backoff-limit"));
  if (limit) c.backoff_limit = static_cast<int32_t>(*limit);

  TRELLIS_ASSIGN_OR_RETURN(c.job, env.Required(kEnvJob));
  TRELLIS_ASSIGN_OR_RETURN(c.scheduler_address, env.Required(kEnvScheduler));
  if (auto hp = ParseHostPort(c.scheduler_address); !hp.ok()) return hp.status().Annotate(EnvSourceName(kEnvScheduler));
  TRELLIS_ASSIGN_OR_RETURN(std::string role, env.Required(kEnvRole));
  if (role == "server") {
    c.role = v1::ROLE_SERVER;
  } else if (role == "worker") {
    c.role = v1::ROLE_WORKER;
  } else {
    return InvalidArgumentError(EnvSourceName(kEnvRole) + ": must be server or worker, got '" + role + "'");
  }
  TRELLIS_RETURN_IF_ERROR(env.Required(kEnvNumServers).status());
  TRELLIS_RETURN_IF_ERROR(env.Required(kEnvNumWorkers).status());
  TRELLIS_ASSIGN_OR_RETURN(int64_t s, r.Int(kEnvNumServers, std::nullopt, 0));
  TRELLIS_ASSIGN_OR_RETURN(int64_t w, r.Int(kEnvNumWorkers, std::nullopt, 0));
  c.num_servers = static_cast<int32_t>(s);
  c.num_workers = static_cast<int32_t>(w);
  if (c.role == v1::ROLE_SERVER && c.num_servers == 0) {
    return InvalidArgumentError(EnvSourceName(kEnvNumServers) + ": is 0 but " + kEnvRole + " is server");
  }
  // The token file may be absent only when explicitly set empty (auth off for local runs).
  if (!env.Get(kEnvTokenFile)) return InvalidArgumentError(EnvSourceName(kEnvTokenFile) + " is not set");
  c.token_file = *env.Get(kEnvTokenFile);
  TRELLIS_ASSIGN_OR_RETURN(c.pod_name, r.String(kEnvPodName, std::nullopt, hostname));
  if (c.pod_name.empty()) return InvalidArgumentError(EnvSourceName(kEnvPodName) + " is empty and no hostname");
  TRELLIS_ASSIGN_OR_RETURN(c.host, r.String(kEnvHost, std::nullopt, "127.0.0.1"));
  TRELLIS_ASSIGN_OR_RETURN(int64_t gpus, r.Int(kEnvGpus, std::nullopt, 0));
  c.gpus = static_cast<int32_t>(gpus);
  TRELLIS_ASSIGN_OR_RETURN(auto pmp, r.OptionalInt(kEnvMetricsPort));
  if (pmp && *pmp > 0) c.program_metrics_port = static_cast<int32_t>(*pmp);
  TRELLIS_ASSIGN_OR_RETURN(auto amp, r.OptionalInt(kEnvAgentMetricsPort));
  if (amp) c.metrics_port = static_cast<int32_t>(*amp);
  TRELLIS_ASSIGN_OR_RETURN(c.metrics_host, r.String(kEnvMetricsHost, std::nullopt, ListenHost(env)));
  if (c.take_over_server >= 0 && c.role != v1::ROLE_SERVER) {
    return InvalidArgumentError("flag --take-over-server: only a server's agent takes a server over");
  }
  if (c.role == v1::ROLE_WORKER && c.command.empty()) {
    return InvalidArgumentError("a worker needs a program: trellis-agent [flags] -- COMMAND ARGS...");
  }
  return c;
}

}  // namespace trellis
