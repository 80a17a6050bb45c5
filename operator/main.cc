// trellis-operator: watches TrainingJobs and keeps their pods and status true. Flags parsed here,
// everything else lives in the trellis_operator library.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "common/config/options.h"
#include "common/process/exit_codes.h"
#include "common/base/logging.h"
#include "common/base/random_token.h"
#include "operator/controller.h"
#include "operator/kube_client.h"
#include "operator/leader_election.h"
#include "common/metrics/metrics_http.h"
#include "operator/operator_metrics.h"
#include "operator/progress_poller.h"
#include "operator/reconciler.h"
#include "operator/target_discovery.h"

namespace {

using trellis::Option;
using trellis::OptionType;

// Every flag; --help is generated from it.
constexpr Option kOptions[] = {
    {"kubeconfig", nullptr, OptionType::kString, 0, 0, "PATH",
     "its current context; token, tokenFile or client-certificate/-key (or their -data)"},
    {"server", nullptr, OptionType::kString, 0, 0, "URL", "the API server (instead of --kubeconfig)"},
    {"token-file", nullptr, OptionType::kString, 0, 0, "PATH",
     "with --server; read again every minute and after a 401 (rotated service-account tokens)"},
    {"certificate-authority", nullptr, OptionType::kString, 0, 0, "PATH",
     "with --server; PEM bundle that signs the API server's certificate (default: system roots)"},
    {"client-certificate", nullptr, OptionType::kString, 0, 0, "PATH",
     "with --server and --client-key: authenticate with a client certificate (PEM files)"},
    {"client-key", nullptr, OptionType::kString, 0, 0, "PATH", "the client certificate's key"},
    {"api-unhealthy-seconds", nullptr, OptionType::kInt, 1, 86400, "N",
     "/healthz fails once every API request has been refused (401/403) or\n"
     "has not reached the server for this long (default 60)"},
    {"namespace", nullptr, OptionType::kString, 0, 0, "NS", "watch only this namespace (default: all)"},
    {"image", nullptr, OptionType::kString, 0, 0, "IMAGE", "the image of pods whose TrainingJob sets no spec.image"},
    {"metrics-host", nullptr, OptionType::kString, 0, 0, "HOST", "where /metrics listens (default 0.0.0.0)"},
    {"metrics-port", nullptr, OptionType::kInt, 0, 65535, "PORT", "/metrics and /healthz (default 8080; 0 disables)"},
    {"resync-seconds", nullptr, OptionType::kInt, 1, 86400, "N", "reconcile every job at least this often (default 30)"},
    {"watch-timeout-seconds", nullptr, OptionType::kInt, 1, 3600, "N", "a watch's server-side timeout (default 300)"},
    {"leader-elect", nullptr, OptionType::kBool, 0, 0, "true|false",
     "hold the Lease trellis-operator before reconciling (replicas > 1)"},
    {"lease-namespace", nullptr, OptionType::kString, 0, 0, "NS",
     "where the Lease lives (default: the service account's namespace)"},
    {"progress-seconds", nullptr, OptionType::kInt, 1, 3600, "N",
     "how often status.progress is read from each running job's scheduler and\n"
     "written (default 5; at most one status write per job per round)"},
    {"scheduler-addresses", nullptr, OptionType::kString, 0, 0, "FILE",
     "JSON {\"<ns>/<job>-scheduler:<port>\": \"host:port\"} for clusters whose Services\n"
     "the operator cannot reach by DNS (test clusters); default <job>-scheduler.<ns>.svc"},
};

std::string Usage() {
  return trellis::HelpText(
      "usage: trellis-operator [--kubeconfig PATH | --server URL [--token-file PATH] [--certificate-authority PATH]\n"
      "         [--client-certificate PATH --client-key PATH]] [FLAGS]\n"
      "  Without --kubeconfig or --server: in-cluster config (service account, KUBERNETES_SERVICE_HOST).\n",
      kOptions);
}

struct Flags {
  std::string kubeconfig, server, token_file, ns, image, metrics_host = "0.0.0.0";
  std::string certificate_authority, client_certificate, client_key;
  int metrics_port = 8080, resync_seconds = 30, watch_timeout_seconds = 300, api_unhealthy_seconds = 60;
  bool leader_elect = false;
  std::string lease_namespace;
  int progress_seconds = 5;
  std::string scheduler_addresses;
};

trellis::StatusOr<Flags> ResolveFlags(const trellis::ParsedArgs& args) {
  const trellis::EnvSource no_environment(std::map<std::string, std::string>{});  // the operator reads flags only
  const trellis::Resolver r(kOptions, args, no_environment);
  Flags f;
  auto text = [&](const char* name, std::string* out) -> trellis::Status {
    TRELLIS_ASSIGN_OR_RETURN(*out, r.String(name, std::nullopt, *out));
    return trellis::Status();
  };
  auto number = [&](const char* name, int* out) -> trellis::Status {
    TRELLIS_ASSIGN_OR_RETURN(int64_t v, r.Int(name, std::nullopt, *out));
    *out = static_cast<int>(v);
    return trellis::Status();
  };
  for (auto [name, out] : {std::pair{"kubeconfig", &f.kubeconfig}, {"server", &f.server}, {"token-file", &f.token_file},
                           {"certificate-authority", &f.certificate_authority},
                           {"client-certificate", &f.client_certificate}, {"client-key", &f.client_key},
                           {"namespace", &f.ns}, {"image", &f.image}, {"metrics-host", &f.metrics_host},
                           {"lease-namespace", &f.lease_namespace}, {"scheduler-addresses", &f.scheduler_addresses}}) {
    TRELLIS_RETURN_IF_ERROR(text(name, out));
  }
  for (auto [name, out] : {std::pair{"api-unhealthy-seconds", &f.api_unhealthy_seconds},
                           {"progress-seconds", &f.progress_seconds}, {"metrics-port", &f.metrics_port},
                           {"resync-seconds", &f.resync_seconds}, {"watch-timeout-seconds", &f.watch_timeout_seconds}}) {
    TRELLIS_RETURN_IF_ERROR(number(name, out));
  }
  TRELLIS_ASSIGN_OR_RETURN(f.leader_elect, r.Bool("leader-elect", std::nullopt, false));
  if (!f.kubeconfig.empty() && !f.server.empty()) {
    return trellis::InvalidArgumentError("give --kubeconfig or --server, not both");
  }
  if (f.server.empty() && !(f.token_file + f.certificate_authority + f.client_certificate + f.client_key).empty()) {
    return trellis::InvalidArgumentError(
        "--token-file, --certificate-authority, --client-certificate and --client-key go with --server");
  }
  return f;
}

trellis::StatusOr<trellis::op::KubeConfig> Config(const Flags& f) {
  using namespace trellis::op;
  if (!f.kubeconfig.empty()) return KubeconfigFile(f.kubeconfig);
  if (f.server.empty()) return InClusterConfig();
  KubeConfig c;
  c.server = f.server;
  c.ca_file = f.certificate_authority;
  if (!c.ca_file.empty() && !std::ifstream(c.ca_file)) {
    return trellis::NotFoundError("--certificate-authority " + c.ca_file + ": cannot open");
  }
  if (!f.token_file.empty()) {
    std::ifstream in(f.token_file);
    if (!in) return trellis::NotFoundError("--token-file " + f.token_file + ": cannot open");
    std::getline(in, c.token);
    c.token_file = f.token_file;
  }
  TRELLIS_RETURN_IF_ERROR(LoadClientCertificate(c, f.client_certificate, f.client_key)
                              .Annotate("--client-certificate/--client-key"));
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace trellis::op;
  trellis::SetLogTag("operator");
  auto args = trellis::ParseArgs(kOptions, std::vector<std::string>(argv + 1, argv + argc));
  if (args.ok() && args->help) {
    std::cout << Usage();
    return trellis::kExitOk;
  }
  auto flags = args.ok() ? ResolveFlags(*args) : trellis::StatusOr<Flags>(args.status());
  if (!flags.ok()) {
    std::cerr << "trellis-operator: " << flags.status().message() << "\n" << Usage();
    return trellis::kExitUsage;
  }
  auto config = Config(*flags);
  if (!config.ok()) {
    std::cerr << "trellis-operator: " << config.status().message() << "\n";
    return trellis::kExitUsage;
  }
  // Block the stop signals before any thread starts, then wait for them here.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  trellis::MetricsRegistry registry(trellis::MetricLabels{"", "operator", -1});
  auto metrics = std::make_unique<OperatorMetrics>(registry);
  KubeClient client(*config);
  OperatorSettings settings;
  if (!flags->image.empty()) settings.default_image = flags->image;
  ReconcileObserver observer;
  observer.on_phase = [&](const std::string& job, const std::string& phase) { metrics->SetJobPhase(job, phase); };
  // The watches fill it, the reconciler and the progress poller read it: an idle operator makes
  // no request but its watches.
  ObjectCache cache;
  // One client per job's scheduler, shared: the poller asks for progress, the reconciler asks a
  // suspended job for its exit checkpoint.
  SchedulerClients schedulers(client, settings, flags->scheduler_addresses);
  Reconciler reconciler(client, settings, [] { return Clock::now(); }, observer, &cache, &schedulers);
  ControllerOptions opts;
  opts.watch_namespace = flags->ns;
  opts.resync = std::chrono::seconds(flags->resync_seconds);
  opts.watch_timeout_seconds = flags->watch_timeout_seconds;
  Controller controller(client, reconciler, opts, [&](double s) { metrics->ObserveReconcile(s); }, &cache);
  ProgressPollerOptions progress_opts;
  progress_opts.watch_namespace = flags->ns;
  progress_opts.interval = std::chrono::seconds(flags->progress_seconds);
  ProgressPoller progress(client, schedulers, progress_opts, &cache.jobs);

  // Standby replicas (waiting for the Lease) are healthy; the leader once it has listed.
  std::atomic<bool> leading{false};
  registry.OnCollect([&] {
    metrics->SetApiErrors(client.api_errors());
    metrics->SetWatchRestarts(controller.counters().watch_restarts.load());
    metrics->SetReconciles(controller.counters().reconciles.load());
    metrics->SetApiRequests(client.RequestCounts());
  });
  std::unique_ptr<trellis::MetricsHttpServer> server;
  if (flags->metrics_port != 0) {
    // Unhealthy too when the API server has refused us (or been unreachable) for a while: a
    // restarted pod reads its credentials afresh.
    const std::chrono::seconds api_window(flags->api_unhealthy_seconds);
    // Prometheus HTTP service discovery, answered from the pods the watches keep (docs/metrics.md).
    std::vector<trellis::HttpRoute> routes = {{"/sd/targets", "application/json", [&cache](const std::string& host) {
                                                 return trellis::op::TargetsJson(cache.pods.List(), host);
                                               }}};
    auto s = trellis::MetricsHttpServer::Start(
        flags->metrics_host, flags->metrics_port, registry,
        [&, api_window] { return (!leading.load() || controller.synced()) && client.Healthy(api_window); },
        std::move(routes));
    if (!s.ok()) {
      std::cerr << "trellis-operator: " << s.status().message() << "\n";
      return trellis::kExitFailure;
    }
    server = std::move(*s);
  }
  // Waits up to `d` for SIGTERM/SIGINT: the loops below sleep here so a signal ends them at once.
  auto wait_signal = [&](std::chrono::milliseconds d) {
    timespec ts{static_cast<time_t>(d.count() / 1000), static_cast<long>((d.count() % 1000) * 1000000)};
    return sigtimedwait(&stop, nullptr, &ts);
  };

  std::unique_ptr<LeaderElector> elector;
  LeaseOptions lease;
  if (flags->leader_elect) {
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    auto suffix = trellis::RandomToken();
    lease.identity = std::string(host) + "_" + (suffix.ok() ? suffix->substr(0, 8) : "0");
    lease.ns = flags->lease_namespace.empty() ? config->ns : flags->lease_namespace;
    elector = std::make_unique<LeaderElector>(client, lease, [] { return Clock::now(); });
    TLOG_INFO << "waiting for the Lease " << lease.ns << "/" << lease.name << " as " << lease.identity;
    while (true) {
      auto got = elector->TryAcquireOrRenew();
      if (!got.ok()) TLOG_WARN << "leader election: " << got.status().message();
      if (got.ok() && *got) break;
      if (wait_signal(std::chrono::seconds(2)) > 0) return trellis::kExitOk;
    }
    TLOG_INFO << "holding the Lease " << lease.ns << "/" << lease.name;
  }
  leading = true;
  TLOG_INFO << "watching TrainingJobs on " << config->server
            << (flags->ns.empty() ? " in every namespace" : " in namespace " + flags->ns);
  controller.Start();
  progress.Start();
  int sig = 0;
  if (elector) {
    // Renew every third of the lease; stop reconciling (and exit, to be restarted as a standby)
    // once the lease could not be renewed for its whole duration: another replica may hold it.
    auto last_renewed = std::chrono::steady_clock::now();
    while (true) {
      sig = wait_signal(std::chrono::duration_cast<std::chrono::milliseconds>(lease.duration) / 3);
      if (sig > 0) break;
      auto r = elector->TryAcquireOrRenew();
      if (r.ok() && *r) {
        last_renewed = std::chrono::steady_clock::now();
      } else if (r.ok() || std::chrono::steady_clock::now() - last_renewed > lease.duration) {
        TLOG_ERROR << "lost the Lease " << lease.ns << "/" << lease.name
                   << (r.ok() ? ": another replica holds it" : ": " + r.status().message()) << "; exiting";
        progress.Stop();
        controller.Stop();
        return trellis::kExitFailure;
      }
    }
  } else {
    sigwait(&stop, &sig);
  }
  TLOG_INFO << "stopping on signal " << sig;
  progress.Stop();
  controller.Stop();
  if (elector) {
    // Reconciling has stopped: hand the Lease over now rather than after its duration.
    trellis::Status released = elector->Release();
    if (released.ok()) {
      TLOG_INFO << "released the Lease " << lease.ns << "/" << lease.name;
    } else {
      TLOG_WARN << "cannot release the Lease " << lease.ns << "/" << lease.name << ": " << released.message()
                << " (a standby takes over once it expires)";
    }
  }
  return trellis::kExitOk;
}
