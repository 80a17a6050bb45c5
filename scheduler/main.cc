// trellis-scheduler: the per-job scheduler process. Parses flags, environment and the job file
// into a SchedulerConfig (precedence: flag > environment > job file > default), serves until
// SIGTERM/SIGINT.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "common/tls/tls.h"
#include "common/tls/auth.h"
#include "common/process/child_reaper.h"
#include "common/config/env_names.h"
#include "common/config/options.h"
#include "common/config/env.h"
#include "common/process/exit_codes.h"
#include "common/base/file_util.h"
#include "common/job/job_spec.h"
#include "common/base/logging.h"
#include "common/metrics/metrics_http.h"
#include "scheduler/progress_metrics.h"
#include "scheduler/scheduler_metrics.h"
#include "scheduler/scheduler_service.h"

namespace trellis {
namespace {

// Every option, flag and environment; --help is generated from it. Precedence: flag >
// environment > job file (--job-file) > default.
constexpr Option kOptions[] = {
    {"job-file", nullptr, OptionType::kString, 0, 0, "PATH", "the TrainingJob (job settings; else defaults)"},
    {"job-name", kEnvJob, OptionType::kString, 0, 0, "NAME", "the job's name"},
    {"num-servers", kEnvNumServers, OptionType::kInt, 1, 100000, "N", "parameter servers"},
    {"num-workers", kEnvNumWorkers, OptionType::kInt, 1, 100000, "N", "workers"},
    {"dispatch", nullptr, OptionType::kString, 0, 0, "roundRobin|hash|balanced", "key dispatch"},
    {"slice-bytes", nullptr, OptionType::kInt, 1, int64_t{1} << 40, "B", "slice size"},
    {"heartbeat-timeout", nullptr, OptionType::kSeconds, 0, 86400, "SECONDS", "a silent node is dead after this"},
    {"host", kEnvListenHost, OptionType::kString, 0, 0, "HOST", "the address gRPC binds (default 0.0.0.0)"},
    {"port", nullptr, OptionType::kInt, 0, 65535, "PORT", "the gRPC port (0 picks one)"},
    {"port-file", nullptr, OptionType::kString, 0, 0, "PATH", "write the port there once listening"},
    {"token-file", kEnvTokenFile, OptionType::kString, 0, 0, "PATH", "the job token (default: none, no auth)"},
    {"metrics-port", kEnvMetricsPort, OptionType::kInt, 0, 65535, "PORT",
     "serve /metrics and /healthz there (0 picks one; default: none)"},
    {"metrics-host", kEnvMetricsHost, OptionType::kString, 0, 0, "HOST",
     "the address /metrics binds (default: as --host)"},
};

std::string MinimalJobYaml(const SchedulerConfig& c) {
  std::ostringstream y;
  y << "apiVersion: " << kJobApiVersion << "\nkind: " << kJobKind << "\nmetadata:\n  name: "
    << (c.job_name.empty() ? "trellis-job" : c.job_name) << "\nspec:\n  servers:\n    replicas: "
    << c.num_servers << "\n  workers:\n    replicas: " << c.num_workers
    << "\n  keyDispatch: " << c.dispatch << "\n  sliceBytes: " << c.slice_bytes
    << "\n  scheduler:\n    heartbeatTimeoutSeconds: "
    << static_cast<double>(c.heartbeat_timeout.count()) / 1000.0 << "\n";
  return y.str();
}

struct Settings {
  SchedulerConfig config;
  SchedulerServerOptions server;
  std::string port_file;
  int metrics_port = -1;  // -1: no /metrics
  std::string metrics_host = "0.0.0.0";
};

StatusOr<Settings> BuildSettings(const ParsedArgs& args, const EnvSource& env) {
  const Resolver r(kOptions, args, env);
  Settings s;
  SchedulerConfig& c = s.config;
  std::optional<JobSpec> spec;
  TRELLIS_ASSIGN_OR_RETURN(std::optional<std::string> job_file, r.OptionalString("job-file"));
  if (job_file) {
    TRELLIS_ASSIGN_OR_RETURN(JobSpec loaded, LoadJobSpecFile(*job_file));
    spec = std::move(loaded);
  }
  if (spec) {
    c.job_name = spec->name;
    c.num_servers = spec->servers.replicas;
    c.num_workers = spec->workers.replicas;
    c.dispatch = std::string(ToString(spec->keyDispatch));
    c.slice_bytes = spec->sliceBytes;
    c.heartbeat_timeout = std::chrono::milliseconds(
        static_cast<int64_t>(spec->scheduler.heartbeatTimeoutSeconds * 1000.0));
    // A deleted pod's replacement gets as long to register as the pods had at the start.
    c.replacement_timeout = std::chrono::milliseconds(
        static_cast<int64_t>(std::max(1.0, spec->scheduler.registrationTimeoutSeconds) * 1000.0));
    c.liveness_timeout = std::chrono::milliseconds(
        static_cast<int64_t>(spec->scheduler.livenessTimeoutSeconds * 1000.0));
    c.progress_timeout = std::chrono::milliseconds(
        static_cast<int64_t>(spec->scheduler.progressTimeoutSeconds * 1000.0));
    // Pods stopped from outside wait for the exit checkpoint within their grace, leaving them
    // a few seconds (a third of a short grace) to exit in.
    const int64_t grace_ms = spec->runPolicy.TerminationGraceSeconds() * 1000;
    c.stop_limit = std::chrono::milliseconds(std::max<int64_t>(grace_ms - std::min<int64_t>(3000, grace_ms / 3), 500));
    c.elastic = {spec->elastic.enabled, spec->elastic.minWorkers, spec->elastic.maxWorkers,
                 spec->elastic.minServers, spec->elastic.maxServers};
    s.server.progress.straggler_factor = spec->monitoring.straggler.factor;
    s.server.progress.straggler_window = std::chrono::milliseconds(
        static_cast<int64_t>(spec->monitoring.straggler.windowSeconds * 1000.0));
  }
  // Flag > environment > the job file (applied above) > default.
  TRELLIS_ASSIGN_OR_RETURN(c.job_name, r.String("job-name", std::nullopt, c.job_name));
  TRELLIS_ASSIGN_OR_RETURN(int64_t servers, r.Int("num-servers", std::nullopt, c.num_servers));
  TRELLIS_ASSIGN_OR_RETURN(int64_t workers, r.Int("num-workers", std::nullopt, c.num_workers));
  c.num_servers = static_cast<int32_t>(servers);
  c.num_workers = static_cast<int32_t>(workers);
  TRELLIS_ASSIGN_OR_RETURN(c.dispatch, r.String("dispatch", std::nullopt, c.dispatch));
  TRELLIS_ASSIGN_OR_RETURN(c.slice_bytes, r.Int("slice-bytes", std::nullopt, c.slice_bytes));
  TRELLIS_ASSIGN_OR_RETURN(c.heartbeat_timeout, r.Seconds("heartbeat-timeout", std::nullopt, c.heartbeat_timeout));
  TRELLIS_ASSIGN_OR_RETURN(std::string token_file, r.String("token-file"));
  // --host > TRELLIS_LISTEN_HOST > every address; /metrics: --metrics-host > TRELLIS_METRICS_HOST >
  // the same as --host's environment.
  TRELLIS_ASSIGN_OR_RETURN(s.server.host, r.String("host", std::nullopt, "0.0.0.0"));
  TRELLIS_ASSIGN_OR_RETURN(s.metrics_host, r.String("metrics-host", std::nullopt, ListenHost(env)));
  TRELLIS_ASSIGN_OR_RETURN(int64_t port, r.Int("port", std::nullopt, s.server.port));
  s.server.port = static_cast<int>(port);
  TRELLIS_ASSIGN_OR_RETURN(s.port_file, r.String("port-file"));
  TRELLIS_ASSIGN_OR_RETURN(int64_t metrics_port, r.Int("metrics-port", std::nullopt, -1));
  s.metrics_port = static_cast<int>(metrics_port);
  TRELLIS_RETURN_IF_ERROR(ValidateSchedulerConfig(c));
  TRELLIS_ASSIGN_OR_RETURN(s.server.service.token, ReadTokenFile(token_file));
  // TLS: TRELLIS_TLS_* (set by the operator and the launcher), else the job file's spec.tls.
  TRELLIS_ASSIGN_OR_RETURN(TlsFiles tls_files, TlsFilesFromEnv(env));
  if (!tls_files.enabled() && spec) tls_files = TlsFilesOf(spec->tls);
  TRELLIS_ASSIGN_OR_RETURN(s.server.tls, LoadTls(tls_files));
  if (s.server.service.token.empty()) TLOG_WARN << "no token file: calls are not authenticated";

  // GetJob serves the job with the effective settings (flags and environment applied).
  if (spec) {
    spec->name = c.job_name;
    spec->servers.replicas = c.num_servers;
    spec->workers.replicas = c.num_workers;
    spec->sliceBytes = c.slice_bytes;
    spec->scheduler.heartbeatTimeoutSeconds =
        static_cast<double>(c.heartbeat_timeout.count()) / 1000.0;
    s.server.service.job_yaml = JobSpecToYaml(*spec);
  } else {
    s.server.service.job_yaml = MinimalJobYaml(c);
  }
  return s;
}

int Main(int argc, char** argv) {
  SetLogTag("scheduler");
  const std::string usage =
      HelpText("usage: trellis-scheduler [FLAGS]\n", kOptions, "Precedence: flag > environment > job file > default.\n");
  auto args = ParseArgs(kOptions, std::vector<std::string>(argv + 1, argv + argc));
  if (!args.ok()) {
    std::cerr << "trellis-scheduler: " << args.status().message() << "\n" << usage;
    return kExitUsage;
  }
  if (args->help) {
    std::cout << usage;
    return kExitOk;
  }
  const EnvSource env;
  auto settings = BuildSettings(*args, env);
  if (!settings.ok()) {
    std::cerr << "trellis-scheduler: " << settings.status().message() << "\n";
    return kExitUsage;
  }

  // Block the stop signals in every thread (gRPC's included) and take them with sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // PID 1 of its pod: whatever ends up orphaned in the container (a `kubectl exec` session's
  // children) is ours to reap, or it stays a zombie.
  std::unique_ptr<ChildReaper> reaper;
  if (IsPidOne()) reaper = std::make_unique<ChildReaper>();

  const std::string host = settings->server.host;
  const std::string port_file = settings->port_file;
  const SchedulerConfig config = settings->config;
  const bool tls_on = settings->server.tls != nullptr;
  auto server = SchedulerServer::Start(settings->config, std::move(settings->server));
  if (!server.ok()) {
    std::cerr << "trellis-scheduler: " << server.status().message() << "\n";
    return kExitFailure;
  }
  TLOG_INFO << "listening on " << host << ":" << (*server)->port() << " (job "
            << (config.job_name.empty() ? "-" : config.job_name) << ", " << config.num_servers
            << " servers, " << config.num_workers << " workers"
            << (config.elastic.enabled ? " (elastic: " + std::to_string(config.elastic.min_workers) + " to " +
                                             std::to_string(config.elastic.max_workers) + " workers, " +
                                             std::to_string(config.min_servers()) + " to " +
                                             std::to_string(config.server_slots()) + " servers)"
                                       : std::string())
            << ", dispatch " << config.dispatch
            << ", sliceBytes " << config.slice_bytes << ")";
  if (tls_on) TLOG_INFO << "TLS on: mutual (clients need a certificate of the job CA)";
  // Declared after the server so it stops first: the hook reads the server's state.
  MetricsRegistry registry(MetricLabels{config.job_name, "scheduler", -1});
  std::unique_ptr<MetricsHttpServer> metrics_server;
  if (settings->metrics_port >= 0) {
    RegisterSchedulerMetrics(registry, (*server)->state());
    RegisterProgressMetrics(registry, (*server)->progress(), (*server)->state());
    auto m = MetricsHttpServer::Start(settings->metrics_host, settings->metrics_port, registry);
    // Metrics are not worth failing the job for: say so and go on without them.
    if (m.ok()) {
      metrics_server = std::move(*m);
    } else {
      TLOG_ERROR << "/metrics not served: " << m.status().ToString();
    }
  }
  if (!port_file.empty()) {
    if (Status st = WriteFileAtomic(port_file, std::to_string((*server)->port()) + "\n"); !st.ok()) {
      std::cerr << "trellis-scheduler: port file: " << st.message() << "\n";
      (*server)->Shutdown();
      return kExitFailure;
    }
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  TLOG_INFO << "signal " << sig << ": shutting down";
  // Its pod is being deleted: when the whole job is (every worker's pod too), the agents wait
  // for rank 0's exit checkpoint, which needs this scheduler until then.
  (*server)->OutliveTheJobsStop();
  metrics_server.reset();
  (*server)->Shutdown();
  return kExitOk;
}

}  // namespace
}  // namespace trellis

int main(int argc, char** argv) { return trellis::Main(argc, argv); }
