#include "launcher/plan.h"

#include <arpa/inet.h>

#include <deque>
#include <fstream>

#include "common/config/env_names.h"
#include "common/env.h"

namespace trellis {
namespace {

std::map<std::string, std::string> ChildEnv(const LaunchPaths& paths, std::map<std::string, std::string> env) {
  // Per-process values the launcher's own environment may carry from an outer run.
  for (const char* k : {kEnvRank, kEnvIncarnation, kEnvMetricsPort, kEnvMetricsHost, kEnvListenHost,
                        kEnvAgentMetricsPort, kEnvPodName,
                        kEnvRestartPolicy, kEnvBackoffLimit}) {
    env.erase(k);
  }
  // TLS is the job's (or --tls), never inherited from an outer run.
  for (const char* k : {kEnvTlsCaFile, kEnvTlsCertFile, kEnvTlsKeyFile, kEnvTlsServerName}) env.erase(k);
  AddTlsEnv(paths.tls, &env);
  // Every process of a local job shares one network namespace: servers open a local socket
  // (datapath/tcp_wire.h) unless the user's environment says off.
  env.emplace(kEnvLocalSocket, "on");
  auto path = env.find("PATH");
  env["PATH"] = paths.bin_dir + (path != env.end() && !path->second.empty() ? ":" + path->second : "");
  return env;
}

StatusOr<std::string> ListenHostFlag(const std::string& v) {
  in_addr addr{};
  if (v.size() > 15 || ::inet_pton(AF_INET, v.c_str(), &addr) != 1) {
    return InvalidArgumentError("flag --listen-host wants an IPv4 address (127.0.0.1, 0.0.0.0, ...), got '" +
                                v.substr(0, 64) + "'");
  }
  return v;
}

}  // namespace

std::string ConnectHostFor(const std::string& listen_host) {
  return listen_host == "0.0.0.0" ? "127.0.0.1" : listen_host;
}

StatusOr<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args) {
  LaunchOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    TRELLIS_ASSIGN_OR_RETURN(bool job_flag, ParseJobFlag(args, &i, &o.job_flags));
    if (job_flag) continue;
    if (a == "--") {
      o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      if (o.command.empty()) return InvalidArgumentError("no command after '--' (the workers' program)");
      break;
    }
    if (a == "-h" || a == "--help") {
      o.help = true;
      return o;
    } else if (a == "--keep-logs") {
      o.keep_logs = true;
    } else if (a == "--quiet" || a == "-q") {
      o.quiet = true;
    } else if (a == "--no-metrics") {
      o.metrics = false;
    } else if (a == "--tls") {
      o.tls = true;
    } else if (a == "--listen-host") {
      if (i + 1 >= args.size()) return InvalidArgumentError("flag --listen-host needs an address");
      TRELLIS_ASSIGN_OR_RETURN(o.listen_host, ListenHostFlag(args[++i]));
    } else if (a.rfind("--listen-host=", 0) == 0) {
      TRELLIS_ASSIGN_OR_RETURN(o.listen_host, ListenHostFlag(a.substr(14)));
    } else if (a == "--metrics-targets") {
      if (i + 1 >= args.size()) return InvalidArgumentError("flag --metrics-targets needs a file");
      o.metrics_targets = args[++i];
    } else if (a.rfind("--metrics-targets=", 0) == 0) {
      o.metrics_targets = a.substr(18);
      if (o.metrics_targets.empty()) return InvalidArgumentError("flag --metrics-targets needs a file");
    } else if (a == "--log-dir") {
      if (i + 1 >= args.size()) return InvalidArgumentError("flag --log-dir needs a directory");
      o.log_dir = args[++i];
    } else if (a.rfind("--log-dir=", 0) == 0) {
      o.log_dir = a.substr(10);
      if (o.log_dir.empty()) return InvalidArgumentError("flag --log-dir needs a directory");
    } else if (a.rfind("-", 0) == 0 && a != "-") {
      return InvalidArgumentError("unknown flag '" + a + "'");
    } else if (!o.job_file.empty()) {
      return InvalidArgumentError("one job file expected, got '" + o.job_file + "' and '" + a + "'");
    } else {
      o.job_file = a;
    }
  }
  if (!o.command.empty() && !o.job_file.empty()) {
    return InvalidArgumentError("give a job file or a command after '--', not both (got '" +
                                o.job_file + "' and '" + o.command.front() + "')");
  }
  if (o.job_file.empty() && o.command.empty()) {
    return InvalidArgumentError("no job file given (or a command after '--')");
  }
  return o;
}

ProcessPlan PlanScheduler(const LaunchPaths& paths, const std::map<std::string, std::string>& base_env,
                          const std::string& job, int metrics_port) {
  ProcessPlan p;
  p.name = "scheduler";
  p.kind = ProcessPlan::Kind::kScheduler;
  p.spawn.argv = {paths.bin_dir + "/trellis-scheduler", "--job-file", paths.job_file, "--host", paths.listen_host,
                  "--port", "0", "--port-file", paths.run_dir + "/scheduler.port", "--token-file",
                  paths.token_file};
  if (metrics_port >= 0) {
    p.spawn.argv.insert(p.spawn.argv.end(),
                        {"--metrics-host", paths.listen_host, "--metrics-port", std::to_string(metrics_port)});
    p.metrics.push_back({paths.connect_host + ":" + std::to_string(metrics_port),
                         {{"job", job}, {"role", "scheduler"}, {"trellis_process", "scheduler"}}});
  }
  p.spawn.env = ChildEnv(paths, base_env);
  p.spawn.stdout_mode = SpawnOptions::Output::kFile;
  p.spawn.stdout_path = paths.run_dir + "/scheduler.log";
  p.spawn.stderr_mode = SpawnOptions::Output::kStdout;
  return p;
}

std::vector<ProcessPlan> PlanAgents(const JobSpec& job, const LaunchPaths& paths,
                                    const std::map<std::string, std::string>& base_env,
                                    std::chrono::milliseconds agent_stop_grace,
                                    const std::vector<int>& metrics_ports) {
  std::vector<ProcessPlan> out;
  const bool metrics = metrics_ports.size() >= MetricsPortsFor(job);
  auto add_role = [&](const RoleSpec& role, ProcessPlan::Kind kind) {
    const bool server = kind == ProcessPlan::Kind::kServer;
    for (int i = 0; i < role.replicas; ++i) {
      ProcessPlan p;
      p.kind = kind;
      p.index = i;
      p.name = std::string(server ? "server-" : "worker-") + std::to_string(i);
      p.spawn.argv = {paths.bin_dir + "/trellis-agent",
                      "--restart-policy", std::string(ToString(job.RestartPolicyFor(role))),
                      "--backoff-limit", std::to_string(job.runPolicy.backoffLimit),
                      "--stop-grace-ms", std::to_string(agent_stop_grace.count())};
      if (!role.command.empty()) {
        p.spawn.argv.push_back("--");
        p.spawn.argv.insert(p.spawn.argv.end(), role.command.begin(), role.command.end());
        p.spawn.argv.insert(p.spawn.argv.end(), role.args.begin(), role.args.end());
      }
      auto env = ChildEnv(paths, base_env);
      env[kEnvJob] = job.name;
      env[kEnvScheduler] = paths.scheduler_address;
      env[kEnvRole] = server ? "server" : "worker";
      env[kEnvNumServers] = std::to_string(job.servers.replicas);
      env[kEnvNumWorkers] = std::to_string(job.workers.replicas);
      env[kEnvTokenFile] = paths.token_file;
      env[kEnvPodName] = job.name + "-" + p.name;
      env[kEnvHost] = paths.connect_host;   // where the others reach its data ports
      env[kEnvListenHost] = paths.listen_host;   // data ports and /metrics (loopback by default)
      if (!server && role.gpusPerWorker > 0) env[kEnvGpus] = std::to_string(role.gpusPerWorker);
      for (const auto& [k, v] : role.env) env[k] = v;
      if (metrics) {
        // The program's and the agent's /metrics, on the job's listen address like the rest.
        const size_t slot = 2 * out.size();
        const std::string role_name = server ? "server" : "worker";
        env[kEnvMetricsHost] = paths.listen_host;
        env[kEnvMetricsPort] = std::to_string(metrics_ports[slot]);
        env[kEnvAgentMetricsPort] = std::to_string(metrics_ports[slot + 1]);
        std::map<std::string, std::string> labels = {
            {"job", job.name}, {"role", role_name}, {"rank", std::to_string(i)}, {"trellis_process", p.name}};
        p.metrics.push_back({paths.connect_host + ":" + std::to_string(metrics_ports[slot]), labels});
        labels["trellis_process"] = p.name + "-agent";
        p.metrics.push_back({paths.connect_host + ":" + std::to_string(metrics_ports[slot + 1]), labels});
      }
      p.spawn.env = std::move(env);
      const std::string log = paths.run_dir + "/" + p.name + ".log";
      if (server) {
        p.spawn.stdout_mode = SpawnOptions::Output::kFile;
        p.spawn.stdout_path = log;
        p.spawn.stderr_mode = SpawnOptions::Output::kStdout;
      } else {
        p.spawn.stdout_mode = SpawnOptions::Output::kPipe;
        p.spawn.stderr_mode = SpawnOptions::Output::kFile;
        p.spawn.stderr_path = log;
      }
      out.push_back(std::move(p));
    }
  };
  add_role(job.servers, ProcessPlan::Kind::kServer);
  add_role(job.workers, ProcessPlan::Kind::kWorker);
  return out;
}

std::string FileSdTargets(const std::vector<const ProcessPlan*>& plans) {
  // Names and values are ours (job names are DNS labels, ports numbers): no escaping needed
  // beyond quotes, which they cannot contain.
  std::string out = "[\n";
  bool first = true;
  for (const ProcessPlan* p : plans) {
    for (const MetricsTarget& t : p->metrics) {
      out += first ? "" : ",\n";
      first = false;
      out += "  {\"targets\": [\"" + t.address + "\"], \"labels\": {";
      bool first_label = true;
      for (const auto& [k, v] : t.labels) {
        out += (first_label ? "\"" : ", \"") + k + "\": \"" + v + "\"";
        first_label = false;
      }
      out += "}}";
    }
  }
  return out + "\n]\n";
}

std::string FailureMessage(const std::string& job, std::string_view role, int index, int exit_code,
                           int restarts, RestartPolicy policy) {
  return "job " + job + " failed: " + std::string(role) + " " + std::to_string(index) + " exited with code " +
         ExitCodeWithSignal(exit_code) + " after " + std::to_string(restarts) +
         (restarts == 1 ? " restart" : " restarts") + " (restartPolicy " + std::string(ToString(policy)) + ")";
}

std::string AgentDiedMessage(const std::string& job, std::string_view role, int index, int signal) {
  return "job " + job + " failed: the agent of " + std::string(role) + " " + std::to_string(index) +
         " (trellis-agent) died, killed by " + SignalName(signal) +
         "; its program went with it, and nothing restarts an agent (its restartPolicy restarts the "
         "program, not the agent)";
}

std::vector<std::string> LineSplitter::Feed(std::string_view bytes) {
  std::vector<std::string> lines;
  for (char c : bytes) {
    if (c == '\n') {
      if (!partial_.empty() && partial_.back() == '\r') partial_.pop_back();
      lines.push_back(std::move(partial_));
      partial_.clear();
    } else {
      partial_.push_back(c);
      if (partial_.size() >= max_line_) {
        lines.push_back(std::move(partial_));
        partial_.clear();
      }
    }
  }
  return lines;
}

std::string LineSplitter::Flush() {
  std::string rest = std::move(partial_);
  partial_.clear();
  return rest;
}

std::string TailFile(const std::string& path, int n) {
  std::ifstream in(path);
  if (!in) return "";
  std::deque<std::string> last;
  std::string line;
  while (std::getline(in, line)) {
    last.push_back(line);
    if (static_cast<int>(last.size()) > n) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += l + "\n";
  return out;
}

}  // namespace trellis
