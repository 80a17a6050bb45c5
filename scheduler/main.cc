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

#include "common/tls.h"
#include "common/auth.h"
#include "common/child_reaper.h"
#include "common/env.h"
#include "common/file_util.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "scheduler/progress_metrics.h"
#include "scheduler/scheduler_metrics.h"
#include "scheduler/scheduler_service.h"

namespace trellis {
namespace {

constexpr char kUsage[] =
    "usage: trellis-scheduler [--job-file PATH] [--num-servers N] [--num-workers N]\n"
    "         [--dispatch roundRobin|hash|balanced] [--slice-bytes B] [--heartbeat-timeout SECONDS]\n"
    "         [--host HOST] [--port PORT] [--port-file PATH] [--token-file PATH] [--job-name NAME]\n"
    "         [--metrics-port PORT] [--metrics-host HOST]\n"
    "--metrics-port: serve /metrics and /healthz there (0 picks one; default: TRELLIS_METRICS_PORT,\n"
    "else none).\n"
    "Precedence: flag > environment (TRELLIS_NUM_SERVERS, TRELLIS_NUM_WORKERS, TRELLIS_TOKEN_FILE,\n"
    "TRELLIS_JOB = job name) > job file > default.\n";

struct Flags {
  std::map<std::string, std::string> values;
};

StatusOr<Flags> ParseFlags(int argc, char** argv) {
  static const char* const kKnown[] = {"job-file",    "num-servers",       "num-workers",
                                       "dispatch",    "slice-bytes",       "heartbeat-timeout",
                                       "host",        "port",              "port-file",
                                       "token-file",  "job-name",          "metrics-port",
                                       "metrics-host"};
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) return InvalidArgumentError("unexpected argument \"" + arg + "\"");
    arg = arg.substr(2);
    std::string value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return InvalidArgumentError("flag --" + arg + " needs a value");
    }
    bool known = false;
    for (const char* k : kKnown) known = known || arg == k;
    if (!known) return InvalidArgumentError("unknown flag --" + arg);
    f.values[arg] = value;
  }
  return f;
}

StatusOr<int64_t> ParseInteger(const std::string& what, const std::string& text, int64_t min,
                               int64_t max) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < min || v > max) {
    return InvalidArgumentError(what + " must be an integer in [" + std::to_string(min) + ", " +
                                std::to_string(max) + "], got \"" + text + "\"");
  }
  return static_cast<int64_t>(v);
}

std::optional<std::string> Env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

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

StatusOr<Settings> BuildSettings(const Flags& flags) {
  auto flag = [&](const char* name) -> std::optional<std::string> {
    auto it = flags.values.find(name);
    if (it == flags.values.end()) return std::nullopt;
    return it->second;
  };
  Settings s;
  SchedulerConfig& c = s.config;
  std::optional<JobSpec> spec;
  if (auto path = flag("job-file")) {
    TRELLIS_ASSIGN_OR_RETURN(JobSpec loaded, LoadJobSpecFile(*path));
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
    s.server.progress.straggler_factor = spec->monitoring.straggler.factor;
    s.server.progress.straggler_window = std::chrono::milliseconds(
        static_cast<int64_t>(spec->monitoring.straggler.windowSeconds * 1000.0));
  }
  // Environment over the job file.
  if (auto v = Env("TRELLIS_JOB")) c.job_name = *v;
  if (auto v = Env("TRELLIS_NUM_SERVERS")) {
    TRELLIS_ASSIGN_OR_RETURN(int64_t n, ParseInteger("TRELLIS_NUM_SERVERS", *v, 1, 100000));
    c.num_servers = static_cast<int32_t>(n);
  }
  if (auto v = Env("TRELLIS_NUM_WORKERS")) {
    TRELLIS_ASSIGN_OR_RETURN(int64_t n, ParseInteger("TRELLIS_NUM_WORKERS", *v, 1, 100000));
    c.num_workers = static_cast<int32_t>(n);
  }
  std::string token_file = Env("TRELLIS_TOKEN_FILE").value_or("");
  // Flags over everything.
  if (auto v = flag("job-name")) c.job_name = *v;
  if (auto v = flag("num-servers")) {
    TRELLIS_ASSIGN_OR_RETURN(int64_t n, ParseInteger("--num-servers", *v, 1, 100000));
    c.num_servers = static_cast<int32_t>(n);
  }
  if (auto v = flag("num-workers")) {
    TRELLIS_ASSIGN_OR_RETURN(int64_t n, ParseInteger("--num-workers", *v, 1, 100000));
    c.num_workers = static_cast<int32_t>(n);
  }
  if (auto v = flag("dispatch")) c.dispatch = *v;
  if (auto v = flag("slice-bytes")) {
    TRELLIS_ASSIGN_OR_RETURN(c.slice_bytes, ParseInteger("--slice-bytes", *v, 1, int64_t{1} << 40));
  }
  if (auto v = flag("heartbeat-timeout")) {
    char* end = nullptr;
    double secs = std::strtod(v->c_str(), &end);
    if (v->empty() || *end != '\0' || !(secs > 0) || secs > 86400) {
      return InvalidArgumentError("--heartbeat-timeout must be seconds in (0, 86400], got \"" + *v +
                                  "\"");
    }
    c.heartbeat_timeout = std::chrono::milliseconds(static_cast<int64_t>(secs * 1000.0));
  }
  if (auto v = flag("token-file")) token_file = *v;
  // --host > TRELLIS_LISTEN_HOST > every address; /metrics: --metrics-host > TRELLIS_METRICS_HOST >
  // TRELLIS_LISTEN_HOST > every address.
  s.server.host = ListenHost(EnvSource());
  s.metrics_host = ListenHost(EnvSource(), "TRELLIS_METRICS_HOST");
  if (auto v = flag("host")) s.server.host = *v;
  if (auto v = flag("port")) {
    TRELLIS_ASSIGN_OR_RETURN(int64_t p, ParseInteger("--port", *v, 0, 65535));
    s.server.port = static_cast<int>(p);
  }
  if (auto v = flag("port-file")) s.port_file = *v;
  std::optional<std::string> mp = flag("metrics-port");
  if (!mp) mp = Env("TRELLIS_METRICS_PORT");
  if (mp) {
    TRELLIS_ASSIGN_OR_RETURN(int64_t p, ParseInteger("--metrics-port", *mp, 0, 65535));
    s.metrics_port = static_cast<int>(p);
  }
  if (auto v = flag("metrics-host")) s.metrics_host = *v;
  TRELLIS_RETURN_IF_ERROR(ValidateSchedulerConfig(c));
  TRELLIS_ASSIGN_OR_RETURN(s.server.service.token, ReadTokenFile(token_file));
  // TLS: TRELLIS_TLS_* (set by the operator and the launcher), else the job file's spec.tls.
  TRELLIS_ASSIGN_OR_RETURN(TlsFiles tls_files, TlsFilesFromEnv(EnvSource()));
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
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::cout << kUsage;
      return 0;
    }
  }
  auto flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::cerr << "trellis-scheduler: " << flags.status().message() << "\n" << kUsage;
    return 2;
  }
  auto settings = BuildSettings(*flags);
  if (!settings.ok()) {
    std::cerr << "trellis-scheduler: " << settings.status().message() << "\n";
    return 2;
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
    return 1;
  }
  TLOG_INFO << "listening on " << host << ":" << (*server)->port() << " (job "
            << (config.job_name.empty() ? "-" : config.job_name) << ", " << config.num_servers
            << " servers, " << config.num_workers << " workers, dispatch " << config.dispatch
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
      return 1;
    }
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  TLOG_INFO << "signal " << sig << ": shutting down";
  metrics_server.reset();
  (*server)->Shutdown();
  return 0;
}

}  // namespace
}  // namespace trellis

int main(int argc, char** argv) { return trellis::Main(argc, argv); }
