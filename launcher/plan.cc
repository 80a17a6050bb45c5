#include "launcher/plan.h"

#include <arpa/inet.h>

#include <array>
#include <deque>
#include <fstream>

#include "common/config/env_names.h"
#include "common/config/env.h"

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
  // (datapath/tcp/wire.h) unless the user's environment says off.
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

// The launcher's own rows; the job flags' come first in the table (launcher/command_job.h).
constexpr Option kLauncherOptions[] = {
    {"keep-logs", nullptr, OptionType::kSwitch, 0, 0, "", "keep the log directory after a successful run (always kept on failure)"},
    {"log-dir", nullptr, OptionType::kString, 0, 0, "DIR", "write logs there instead of a fresh /tmp/trellis-<job>-XXXXXX"},
    {"quiet", nullptr, OptionType::kSwitch, 0, 0, "", "no progress display (worker output and errors still shown); -q too"},
    {"metrics-targets", nullptr, OptionType::kString, 0, 0, "FILE",
     "write the Prometheus file-SD targets there (default\n<log dir>/prometheus-targets.json); removed when the job ends"},
    {"no-metrics", nullptr, OptionType::kSwitch, 0, 0, "", "no /metrics servers"},
    {"listen-host", nullptr, OptionType::kString, 0, 0, "ADDR",
     "the IPv4 address every socket of the job listens on\n(default 127.0.0.1; 0.0.0.0: every address, the job's\n"
     "processes still meet on loopback)"},
    {"tls", nullptr, OptionType::kSwitch, 0, 0, "",
     "mutual TLS between all parts with a CA made for this run\n(also what a job with spec.tls.secretName gets here);\n"
     "spec.tls files are used as given"},
};

constexpr auto kLaunchOptions = [] {
  std::array<Option, std::size(kJobFlagOptions) + std::size(kLauncherOptions)> all{};
  size_t n = 0;
  for (const Option& o : kJobFlagOptions) all[n++] = o;
  for (const Option& o : kLauncherOptions) all[n++] = o;
  return all;
}();

}  // namespace

std::string ConnectHostFor(const std::string& listen_host) {
  return listen_host == "0.0.0.0" ? "127.0.0.1" : listen_host;
}

std::span<const Option> LaunchOptionTable() { return kLaunchOptions; }

std::string LaunchHelp() {
  return HelpText("usage: trellis-launch [OPTIONS] [JOB FLAGS] JOB.yaml\n"
                  "       trellis-launch [OPTIONS] [JOB FLAGS] -- COMMAND [ARGS...]\n"
                  "       trellis-launch resize RUN_DIR WORKERS | --servers SERVERS\n"
                  "  Runs a whole TrainingJob on this machine: scheduler, one agent per server and worker.\n"
                  "  The second form builds the job from the flags, with COMMAND as the workers' program\n"
                  "  (torchrun's habit), and prints the job YAML it runs.\n"
                  "  The third resizes a running elastic job (spec.elastic) whose logs are in RUN_DIR\n"
                  "  (docs/elastic.md).\n"
                  "job flags (a flag wins over the file):\n",
                  kJobFlagOptions) +
         HelpText("options:\n", kLauncherOptions,
                  "exit codes: 0 every worker succeeded, 1 the job failed, 2 bad arguments or job file,\n"
                  "  130/143 stopped by SIGINT/SIGTERM.\n");
}

StatusOr<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args) {
  // -q is --quiet (before "--": after it the arguments are the program's).
  std::vector<std::string> expanded = args;
  for (std::string& a : expanded) {
    if (a == "--") break;
    if (a == "-q") a = "--quiet";
  }
  TRELLIS_ASSIGN_OR_RETURN(ParsedArgs parsed,
                           ParseArgs(kLaunchOptions, expanded, {.command_after_dashdash = true, .positional = true}));
  LaunchOptions o;
  if (parsed.help) {
    o.help = true;
    return o;
  }
  for (const auto& [flag, value] : parsed.flags) {
    if (value.empty()) return InvalidArgumentError("flag --" + flag + " needs a value");
  }
  // The launcher's options come from flags only (its children's environment is its own).
  const EnvSource no_environment(std::map<std::string, std::string>{});
  const Resolver r(kLaunchOptions, parsed, no_environment);
  TRELLIS_ASSIGN_OR_RETURN(o.job_flags, ReadJobFlags(r));
  TRELLIS_ASSIGN_OR_RETURN(o.keep_logs, r.Bool("keep-logs", std::nullopt, false));
  TRELLIS_ASSIGN_OR_RETURN(o.quiet, r.Bool("quiet", std::nullopt, false));
  TRELLIS_ASSIGN_OR_RETURN(bool no_metrics, r.Bool("no-metrics", std::nullopt, false));
  o.metrics = !no_metrics;
  TRELLIS_ASSIGN_OR_RETURN(o.tls, r.Bool("tls", std::nullopt, false));
  TRELLIS_ASSIGN_OR_RETURN(o.log_dir, r.String("log-dir"));
  TRELLIS_ASSIGN_OR_RETURN(o.metrics_targets, r.String("metrics-targets"));
  TRELLIS_ASSIGN_OR_RETURN(std::optional<std::string> listen_host, r.OptionalString("listen-host"));
  if (listen_host) {
    TRELLIS_ASSIGN_OR_RETURN(o.listen_host, ListenHostFlag(*listen_host));
  }

  if (parsed.positional.size() > 1) {
    return InvalidArgumentError("one job file expected, got '" + parsed.positional[0] + "' and '" +
                                parsed.positional[1] + "'");
  }
  if (!parsed.positional.empty()) o.job_file = parsed.positional.front();
  o.command = std::move(parsed.command);
  if (parsed.dashdash && o.command.empty()) return InvalidArgumentError("no command after '--' (the workers' program)");
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
    const int slots = server ? job.ServerSlots() : job.WorkerSlots();
    for (int i = 0; i < slots; ++i) {
      ProcessPlan p;
      p.kind = kind;
      p.index = i;
      p.start_on_grow = i >= role.replicas;
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
