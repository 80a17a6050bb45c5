// trellis-operator: watches TrainingJobs and keeps their pods and status true. Flags parsed here,
// everything else lives in the trellis_operator library.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "common/logging.h"
#include "operator/controller.h"
#include "operator/kube_client.h"
#include "operator/leader_election.h"
#include "common/metrics_http.h"
#include "operator/operator_metrics.h"
#include "operator/progress_poller.h"
#include "operator/reconciler.h"

namespace {

constexpr char kUsage[] =
    "usage: trellis-operator [--kubeconfig PATH | --server URL [--token-file PATH] [--certificate-authority PATH]\n"
    "         [--client-certificate PATH --client-key PATH]] [--namespace NS]\n"
    "         [--image IMAGE] [--metrics-host HOST] [--metrics-port PORT] [--resync-seconds N]\n"
    "         [--watch-timeout-seconds N] [--leader-elect true|false] [--lease-namespace NS]\n"
    "         [--progress-seconds N] [--scheduler-addresses FILE]\n"
    "  Without --kubeconfig or --server: in-cluster config (service account, KUBERNETES_SERVICE_HOST).\n"
    "  --kubeconfig: its current context; token, tokenFile or client-certificate/-key (or their -data)\n"
    "  --token-file: read again every minute and after a 401 (rotated service-account tokens)\n"
    "  --certificate-authority: PEM bundle that signs the API server's certificate (default: system roots)\n"
    "  --client-certificate, --client-key: authenticate with a client certificate (PEM files)\n"
    "  --api-unhealthy-seconds: /healthz fails once every API request has been refused (401/403) or\n"
    "    has not reached the server for this long (default 60)\n"
    "  --namespace: watch only this namespace (default: all)\n"
    "  --image: the image of pods whose TrainingJob sets no spec.image\n"
    "  --metrics-port: /metrics and /healthz (default 8080; 0 disables)\n"
    "  --leader-elect: hold the Lease trellis-operator before reconciling (replicas > 1); the Lease\n"
    "    lives in --lease-namespace (default: the service account's namespace)\n"
    "  --progress-seconds: how often status.progress is read from each running job's scheduler and\n"
    "    written (default 5; at most one status write per job per round)\n"
    "  --scheduler-addresses: JSON {\"<ns>/<job>-scheduler:<port>\": \"host:port\"} for clusters whose\n"
    "    Services the operator cannot reach by DNS (test clusters); default <job>-scheduler.<ns>.svc\n";

struct Flags {
  std::string kubeconfig, server, token_file, ns, image, metrics_host = "0.0.0.0";
  std::string certificate_authority, client_certificate, client_key;
  int metrics_port = 8080, resync_seconds = 30, watch_timeout_seconds = 300, api_unhealthy_seconds = 60;
  bool leader_elect = false;
  std::string lease_namespace;
  int progress_seconds = 5;
  std::string scheduler_addresses;
};

trellis::StatusOr<int> ParseInt(const std::string& flag, const std::string& v, int lo, int hi) {
  try {
    size_t used = 0;
    long n = std::stol(v, &used);
    if (used == v.size() && n >= lo && n <= hi) return static_cast<int>(n);
  } catch (const std::exception&) {
  }
  return trellis::InvalidArgumentError("flag " + flag + ": must be an integer in [" + std::to_string(lo) + ", " +
                                       std::to_string(hi) + "], got \"" + v + "\"");
}

trellis::StatusOr<Flags> ParseFlags(const std::vector<std::string>& args) {
  Flags f;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], v;
    if (auto eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      v = a.substr(eq + 1);
      a = a.substr(0, eq);
    } else if (a.rfind("--", 0) == 0) {
      if (i + 1 >= args.size()) return trellis::InvalidArgumentError("flag " + a + " needs a value");
      v = args[++i];
    } else {
      return trellis::InvalidArgumentError("unexpected argument \"" + a + "\"");
    }
    if (a == "--kubeconfig") f.kubeconfig = v;
    else if (a == "--server") f.server = v;
    else if (a == "--token-file") f.token_file = v;
    else if (a == "--certificate-authority") f.certificate_authority = v;
    else if (a == "--client-certificate") f.client_certificate = v;
    else if (a == "--client-key") f.client_key = v;
    else if (a == "--api-unhealthy-seconds") { TRELLIS_ASSIGN_OR_RETURN(f.api_unhealthy_seconds, ParseInt(a, v, 1, 86400)); }
    else if (a == "--namespace") f.ns = v;
    else if (a == "--image") f.image = v;
    else if (a == "--metrics-host") f.metrics_host = v;
    else if (a == "--lease-namespace") f.lease_namespace = v;
    else if (a == "--scheduler-addresses") f.scheduler_addresses = v;
    else if (a == "--progress-seconds") { TRELLIS_ASSIGN_OR_RETURN(f.progress_seconds, ParseInt(a, v, 1, 3600)); }
    else if (a == "--leader-elect") {
      if (v != "true" && v != "false") {
        return trellis::InvalidArgumentError("flag --leader-elect: must be true or false, got \"" + v + "\"");
      }
      f.leader_elect = v == "true";
    }
    else if (a == "--metrics-port") { TRELLIS_ASSIGN_OR_RETURN(f.metrics_port, ParseInt(a, v, 0, 65535)); }
    else if (a == "--resync-seconds") { TRELLIS_ASSIGN_OR_RETURN(f.resync_seconds, ParseInt(a, v, 1, 86400)); }
    else if (a == "--watch-timeout-seconds") {
      TRELLIS_ASSIGN_OR_RETURN(f.watch_timeout_seconds, ParseInt(a, v, 1, 3600));
    } else {
      return trellis::InvalidArgumentError("unknown flag " + a);
    }
  }
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
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const auto& a : args) {
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    }
  }
  auto flags = ParseFlags(args);
  if (!flags.ok()) {
    std::cerr << "trellis-operator: " << flags.status().message() << "\n" << kUsage;
    return 2;
  }
  auto config = Config(*flags);
  if (!config.ok()) {
    std::cerr << "trellis-operator: " << config.status().message() << "\n";
    return 2;
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
  Reconciler reconciler(client, settings, [] { return Clock::now(); }, observer);
  ControllerOptions opts;
  opts.watch_namespace = flags->ns;
  opts.resync = std::chrono::seconds(flags->resync_seconds);
  opts.watch_timeout_seconds = flags->watch_timeout_seconds;
  Controller controller(client, reconciler, opts, [&](double s) { metrics->ObserveReconcile(s); });
  ProgressPollerOptions progress_opts;
  progress_opts.watch_namespace = flags->ns;
  progress_opts.interval = std::chrono::seconds(flags->progress_seconds);
  progress_opts.scheduler_addresses_file = flags->scheduler_addresses;
  ProgressPoller progress(client, settings, progress_opts);

  // Standby replicas (waiting for the Lease) are healthy; the leader once it has listed.
  std::atomic<bool> leading{false};
  registry.OnCollect([&] {
    metrics->SetApiErrors(client.api_errors());
    metrics->SetWatchRestarts(controller.counters().watch_restarts.load());
    metrics->SetReconciles(controller.counters().reconciles.load());
  });
  std::unique_ptr<trellis::MetricsHttpServer> server;
  if (flags->metrics_port != 0) {
    // Unhealthy too when the API server has refused us (or been unreachable) for a while: a
    // restarted pod reads its credentials afresh.
    const std::chrono::seconds api_window(flags->api_unhealthy_seconds);
    auto s = trellis::MetricsHttpServer::Start(flags->metrics_host, flags->metrics_port, registry, [&, api_window] {
      return (!leading.load() || controller.synced()) && client.Healthy(api_window);
    });
    if (!s.ok()) {
      std::cerr << "trellis-operator: " << s.status().message() << "\n";
      return 1;
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
    auto suffix = RandomToken();
    lease.identity = std::string(host) + "_" + (suffix.ok() ? suffix->substr(0, 8) : "0");
    lease.ns = flags->lease_namespace.empty() ? config->ns : flags->lease_namespace;
    elector = std::make_unique<LeaderElector>(client, lease, [] { return Clock::now(); });
    TLOG_INFO << "waiting for the Lease " << lease.ns << "/" << lease.name << " as " << lease.identity;
    while (true) {
      auto got = elector->TryAcquireOrRenew();
      if (!got.ok()) TLOG_WARN << "leader election: " << got.status().message();
      if (got.ok() && *got) break;
      if (wait_signal(std::chrono::seconds(2)) > 0) return 0;
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
        return 1;
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
  return 0;
}
