#include "agent/agent_config.h"

#include <limits>

#include "agent/supervisor.h"
#include "common/net.h"

namespace trellis {

std::string_view RoleName(v1::Role role) {
  switch (role) {
    case v1::ROLE_SERVER: return "server";
    case v1::ROLE_WORKER: return "worker";
    default: return "unspecified";
  }
}

StatusOr<AgentConfig> ParseAgentConfig(const std::vector<std::string>& args, const EnvSource& env,
                                       const std::string& hostname) {
  AgentConfig c;
  std::optional<std::string> policy_flag, limit_flag;
  constexpr int64_t kMaxMs = 24LL * 3600 * 1000;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "--") {
      c.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    }
    if (a == "-h" || a == "--help") {
      c.help = true;
      return c;
    }
    std::string value;
    bool has_inline = false;
    if (size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_inline = true;
    }
    auto take = [&]() -> StatusOr<std::string> {
      if (has_inline) return value;
      if (i + 1 >= args.size()) return InvalidArgumentError("flag " + a + " needs a value");
      return args[++i];
    };
    if (a == "--restart-policy") {
      TRELLIS_ASSIGN_OR_RETURN(policy_flag, take());
    } else if (a == "--backoff-limit") {
      TRELLIS_ASSIGN_OR_RETURN(limit_flag, take());
    } else if (a == "--backoff-initial-ms" || a == "--backoff-max-ms" || a == "--stop-grace-ms") {
      TRELLIS_ASSIGN_OR_RETURN(std::string v, take());
      TRELLIS_ASSIGN_OR_RETURN(int64_t ms, ParseInt("flag " + a, v, 0, kMaxMs));
      (a == "--backoff-initial-ms" ? c.backoff_initial
       : a == "--backoff-max-ms"   ? c.backoff_max
                                   : c.stop_grace) = std::chrono::milliseconds(ms);
    } else {
      return InvalidArgumentError("unknown argument '" + args[i] + "' (the program goes after --)");
    }
  }
  if (c.backoff_max < c.backoff_initial) {
    return InvalidArgumentError("flag --backoff-max-ms must be >= --backoff-initial-ms");
  }

  if (policy_flag) {
    auto p = ParseRestartPolicyFlag(*policy_flag);
    if (!p.ok()) return p.status().Annotate("flag --restart-policy");
    c.restart_policy = *p;
  } else if (auto v = env.Get("TRELLIS_RESTART_POLICY"); v && !v->empty()) {
    auto p = ParseRestartPolicyFlag(*v);
    if (!p.ok()) return p.status().Annotate("environment variable TRELLIS_RESTART_POLICY");
    c.restart_policy = *p;
  }
  if (limit_flag) {
    TRELLIS_ASSIGN_OR_RETURN(int64_t n, ParseInt("flag --backoff-limit", *limit_flag, 0, 1000000));
    c.backoff_limit = static_cast<int32_t>(n);
  } else {
    TRELLIS_ASSIGN_OR_RETURN(auto n, env.OptionalInt("TRELLIS_BACKOFF_LIMIT", 0, 1000000));
    if (n) c.backoff_limit = static_cast<int32_t>(*n);
  }

  TRELLIS_ASSIGN_OR_RETURN(c.job, env.Required("TRELLIS_JOB"));
  TRELLIS_ASSIGN_OR_RETURN(c.scheduler_address, env.Required("TRELLIS_SCHEDULER"));
  if (auto hp = ParseHostPort(c.scheduler_address); !hp.ok()) {
    return hp.status().Annotate("environment variable TRELLIS_SCHEDULER");
  }
  TRELLIS_ASSIGN_OR_RETURN(std::string role, env.Required("TRELLIS_ROLE"));
  if (role == "server") {
    c.role = v1::ROLE_SERVER;
  } else if (role == "worker") {
    c.role = v1::ROLE_WORKER;
  } else {
    return InvalidArgumentError("environment variable TRELLIS_ROLE: must be server or worker, got '" + role + "'");
  }
  constexpr int64_t kMaxNodes = 100000;
  TRELLIS_ASSIGN_OR_RETURN(int64_t s, env.RequiredInt("TRELLIS_NUM_SERVERS", 0, kMaxNodes));
  TRELLIS_ASSIGN_OR_RETURN(int64_t w, env.RequiredInt("TRELLIS_NUM_WORKERS", 1, kMaxNodes));
  c.num_servers = static_cast<int32_t>(s);
  c.num_workers = static_cast<int32_t>(w);
  if (c.role == v1::ROLE_SERVER && c.num_servers == 0) {
    return InvalidArgumentError("environment variable TRELLIS_NUM_SERVERS: is 0 but TRELLIS_ROLE is server");
  }
  // The token file may be absent only when explicitly set empty (auth off for local runs).
  if (!env.Get("TRELLIS_TOKEN_FILE")) {
    return InvalidArgumentError("environment variable TRELLIS_TOKEN_FILE is not set");
  }
  c.token_file = *env.Get("TRELLIS_TOKEN_FILE");
  c.pod_name = env.GetOr("TRELLIS_POD_NAME", hostname);
  if (c.pod_name.empty()) return InvalidArgumentError("environment variable TRELLIS_POD_NAME is empty and no hostname");
  c.host = env.GetOr("TRELLIS_HOST", "127.0.0.1");
  TRELLIS_ASSIGN_OR_RETURN(auto gpus, env.OptionalInt("TRELLIS_GPUS", 0, 1024));
  c.gpus = static_cast<int32_t>(gpus.value_or(0));
  TRELLIS_ASSIGN_OR_RETURN(auto pmp, env.OptionalInt("TRELLIS_METRICS_PORT", 0, 65535));
  if (pmp && *pmp > 0) c.program_metrics_port = static_cast<int32_t>(*pmp);
  TRELLIS_ASSIGN_OR_RETURN(auto amp, env.OptionalInt("TRELLIS_AGENT_METRICS_PORT", 0, 65535));
  if (amp) c.metrics_port = static_cast<int32_t>(*amp);
  c.metrics_host = ListenHost(env, "TRELLIS_METRICS_HOST");
  if (c.role == v1::ROLE_WORKER && c.command.empty()) {
    return InvalidArgumentError("a worker needs a program: trellis-agent [flags] -- COMMAND ARGS...");
  }
  return c;
}

}  // namespace trellis
