#include "pserver/pserver_main.h"

#include <malloc.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "common/tls/tls.h"
#include "common/tls/auth.h"
#include "common/config/env_names.h"
#include "common/config/options.h"
#include "common/config/env.h"
#include "common/process/exit_codes.h"
#include "common/base/logging.h"
#include "common/metrics/metrics_http.h"
#include "datapath/address.h"
#include "scheduler/scheduler_client.h"
#include "scheduler/scheduler_watch.h"

namespace trellis {

namespace {

// Every option, flag and environment; --help is generated from it.
constexpr Option kOptions[] = {
    {"rank", kEnvRank, OptionType::kInt, 0, 1 << 20, "N", "this server's rank (required)"},
    {"port", kEnvPserverPort, OptionType::kInt, 0, 65535, "P", "the gRPC port (0 picks one)"},
    {"scheduler", kEnvScheduler, OptionType::kString, 0, 0, "HOST:PORT",
     "where the job comes from (none: standalone, with --job)"},
    {"token-file", kEnvTokenFile, OptionType::kString, 0, 0, "F", "the job token (none: no auth)"},
    {"host", kEnvHost, OptionType::kString, 0, 0, "HOST", "the host advertised to workers (default 127.0.0.1)"},
    {"listen", kEnvListenHost, OptionType::kString, 0, 0, "HOST", "the address to bind (default 0.0.0.0)"},
    {"num-workers", kEnvNumWorkers, OptionType::kInt, 1, 1 << 20, "W", "workers (default: the job's)"},
    {"job", nullptr, OptionType::kString, 0, 0, "FILE", "the job when there is no scheduler"},
    {"threads", nullptr, OptionType::kInt, 1, 256, "T", "serving threads"},
    {"tcp-port", nullptr, OptionType::kInt, -1, 65535, "P",
     "the raw-TCP bulk listener (0 picks a port, -1 none); advertised in the data\n"
     "address as host:port;tcp=P"},
    {"metrics-port", kEnvMetricsPort, OptionType::kInt, 0, 65535, "P", "/metrics and /healthz (default: none)"},
    {"local-socket", kEnvLocalSocket, OptionType::kOnOff, 0, 0, "on|off",
     "also a Unix socket for workers in this network namespace (default off, on\n"
     "under trellis-launch; not with TLS; advertised as ;local=NAME)"},
    {nullptr, kEnvMetricsHost, OptionType::kString, 0, 0, "", "where /metrics listens (default: --listen's)"},
    {nullptr, kEnvIncarnation, OptionType::kInt, 1, 1 << 30, "", "this program's start (the agent sets it)"},
};

}  // namespace

std::string PserverUsage() {
  return HelpText("usage: trellis-pserver [FLAGS]\n", kOptions,
                  "Flags win over the environment; the job comes from the scheduler.\n");
}

StatusOr<PserverConfig> LoadPserverConfig(const std::vector<std::string>& args) {
  TRELLIS_ASSIGN_OR_RETURN(ParsedArgs parsed, ParseArgs(kOptions, args));
  const EnvSource env;
  const Resolver r(kOptions, parsed, env);
  PserverConfig c;
  TRELLIS_ASSIGN_OR_RETURN(c.scheduler_address, r.String("scheduler"));
  TRELLIS_ASSIGN_OR_RETURN(std::string token_file, r.String("token-file"));
  TRELLIS_ASSIGN_OR_RETURN(c.token, ReadTokenFile(token_file));
  TRELLIS_ASSIGN_OR_RETURN(c.server.tls, LoadTlsFromEnv(env));
  TRELLIS_ASSIGN_OR_RETURN(std::string host, r.String("host"));
  if (!host.empty()) c.advertise_host = host;
  // --listen > TRELLIS_LISTEN_HOST > every address.
  TRELLIS_ASSIGN_OR_RETURN(c.server.listen_host, r.String("listen", std::nullopt, "0.0.0.0"));
  TRELLIS_ASSIGN_OR_RETURN(int64_t port, r.Int("port", std::nullopt, c.server.port));
  c.server.port = static_cast<int>(port);
  TRELLIS_ASSIGN_OR_RETURN(int64_t tcp_port, r.Int("tcp-port", std::nullopt, c.server.tcp_port));
  c.server.tcp_port = static_cast<int>(tcp_port);
  // --local-socket > TRELLIS_LOCAL_SOCKET > off (trellis-launch sets it on).
  TRELLIS_ASSIGN_OR_RETURN(c.server.local_socket, r.Bool("local-socket", std::nullopt, false));
  TRELLIS_ASSIGN_OR_RETURN(std::optional<int64_t> rank, r.OptionalInt("rank"));
  if (!rank) return InvalidArgumentError(std::string("server rank not set (--rank or ") + kEnvRank + ")");
  c.server.store.server_rank = static_cast<int32_t>(*rank);
  TRELLIS_ASSIGN_OR_RETURN(int64_t threads, r.Int("threads", std::nullopt, c.server.service.pool_threads));
  c.server.service.pool_threads = static_cast<int>(threads);
  TRELLIS_ASSIGN_OR_RETURN(c.incarnation, r.Int(kEnvIncarnation, std::nullopt, 0));

  // The job: from the scheduler (the one source of job settings), or a file when standalone.
  std::string job_yaml;
  std::string job_origin;
  if (!c.scheduler_address.empty()) {
    TRELLIS_ASSIGN_OR_RETURN(auto client,
                             SchedulerClient::Connect({c.scheduler_address, c.token,
                                                               std::chrono::milliseconds(10000),
                                                               c.server.tls}));
    auto y = client->GetJobYaml();
    if (!y.ok()) return y.status().Annotate("reading the job from the scheduler");
    job_yaml = *y;
    job_origin = "the scheduler's job";
  }
  JobSpec job;
  TRELLIS_ASSIGN_OR_RETURN(std::string job_file, r.String("job"));
  if (!job_yaml.empty()) {
    auto parsed_job = ParseJobSpec(job_yaml);
    if (!parsed_job.ok()) return parsed_job.status().Annotate(job_origin);
    job = *parsed_job;
  } else if (!job_file.empty() || parsed.flags.count("job") > 0) {
    auto parsed_job = LoadJobSpecFile(job_file);
    if (!parsed_job.ok()) return parsed_job.status();
    job = *parsed_job;
  }
  c.server.store.mode = job.serverMode;
  c.server.store.optimizer = job.optimizer;
  c.server.store.checkpoint_path = job.checkpoint.path;
  c.server.store.checkpoint_keep = job.checkpoint.keep;
  c.server.slice_bytes = job.sliceBytes;
  c.scheduler_ping = std::chrono::milliseconds(
      static_cast<int64_t>(std::max(0.05, job.scheduler.heartbeatIntervalSeconds) * 1000));
  TRELLIS_ASSIGN_OR_RETURN(int64_t workers, r.Int("num-workers", std::nullopt, job.workers.replicas));
  c.server.store.num_workers = static_cast<int32_t>(workers);
  // Elastic jobs: every worker rank the job may ever have can connect (docs/elastic.md).
  c.server.store.worker_slots = job.WorkerSlots();
  c.server.service.token = c.token;
  c.server.store.metrics =
      std::make_shared<MetricsRegistry>(MetricLabels{job.name, "server", c.server.store.server_rank});
  TRELLIS_ASSIGN_OR_RETURN(int64_t metrics_port, r.Int("metrics-port", std::nullopt, -1));
  c.metrics_port = static_cast<int>(metrics_port);
  TRELLIS_ASSIGN_OR_RETURN(c.metrics_host, r.String(kEnvMetricsHost, std::nullopt, ListenHost(env)));
  return c;
}

int PserverMain(int argc, char** argv) {
  SetLogTag("pserver");
  std::vector<std::string> args(argv + 1, argv + argc);
  if (auto parsed = ParseArgs(kOptions, args); parsed.ok() && parsed->help) {
    std::fputs(PserverUsage().c_str(), stderr);
    return kExitOk;
  }
  // Keep big buffers (slices, step results, gRPC receive slices) in the heap instead of fresh
  // mmap()s, and do not hand freed memory back to the kernel: a step then reuses warm pages
  // instead of page-faulting multi-MiB buffers in again (measured: docs/performance.md). Only
  // here, in the server process; the worker library leaves the user's process alone.
  mallopt(M_MMAP_THRESHOLD, 128 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // Signals are taken by sigwait below; block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  auto config = LoadPserverConfig(args);
  if (!config.ok()) {
    TLOG_ERROR << "trellis-pserver: " << config.status().ToString();
    return kExitUsage;
  }
  auto server = ParameterServer::Start(config->server);
  if (!server.ok()) {
    TLOG_ERROR << "trellis-pserver: " << server.status().ToString();
    return kExitFailure;
  }
  SetLogTag("pserver-" + std::to_string(config->server.store.server_rank));
  std::unique_ptr<MetricsHttpServer> metrics_server;
  if (config->metrics_port >= 0) {
    auto m = MetricsHttpServer::Start(config->metrics_host, config->metrics_port, *config->server.store.metrics);
    // Metrics are not worth failing the job for: say so and go on without them.
    if (m.ok()) {
      metrics_server = std::move(*m);
    } else {
      TLOG_ERROR << "/metrics not served: " << m.status().ToString();
    }
  }
  // Where workers reach this server: its service, TCP port and local socket in one data address
  // (datapath/address.h).
  std::string address =
      DataAddress{config->advertise_host + ":" + std::to_string((*server)->port()),
                  (*server)->tcp_port(), (*server)->local_name()}
          .ToString();
  TLOG_INFO << "serving on " << address << " (" << config->server.store.num_workers
            << " workers, " << ToString(config->server.store.mode) << " mode)";
  if (config->server.tls) {
    TLOG_INFO << "TLS on: mutual, on gRPC and the TCP data port (certificates for '"
              << config->server.tls->server_name << "' signed by the job CA)";
  }
  std::unique_ptr<SchedulerClient> client;
  std::unique_ptr<SchedulerWatch> watch;  // declared after the client: stops first
  if (!config->scheduler_address.empty()) {
    auto c = SchedulerClient::Connect({config->scheduler_address, config->token,
                                       std::chrono::milliseconds(10000), config->server.tls});
    Status st = c.status();
    if (st.ok()) client = std::move(*c);
    const int32_t rank = config->server.store.server_rank;
    auto report = [&client, rank, address] {
      return client->ReportReady(v1::ROLE_SERVER, rank, address);
    };
    auto ping = st.ok() ? client->Ping() : StatusOr<v1::PingResponse>(st);
    st = ping.status();
    if (st.ok()) {
      // A restarted scheduler learns this server's address again from it.
      // Its pings name it: this program's own liveness (docs/scheduler.md#stalls).
      v1::PingRequest identity;
      identity.set_role(v1::ROLE_SERVER);
      identity.set_rank(rank);
      if (config->incarnation > 0) identity.set_incarnation(config->incarnation);
      watch = std::make_unique<SchedulerWatch>(client.get(), ping->scheduler_id(),
                                               config->scheduler_ping, report,
                                               "server " + std::to_string(rank), identity);
      // Elastic jobs: workers lost for good are no longer waited for (docs/elastic.md).
      SliceStore* store = (*server)->store();
      watch->SetLostListener([store](const std::vector<v1::LostWorker>& lost) {
        for (const auto& l : lost) {
          if (Status st = store->LoseWorker(l.slot(), l.epoch()); !st.ok()) {
            TLOG_WARN << "the scheduler's lost worker " << l.slot() << ": " << st.ToString();
          }
        }
      });
      st = report();
      // The scheduler went away meanwhile, or restarted before our agent registered again.
      const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(5);
      while (SchedulerGoneOrRestarted(st) && std::chrono::steady_clock::now() < until) {
        watch->WaitUp(std::chrono::seconds(10));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        st = report();
      }
    }
    if (!st.ok()) {
      TLOG_ERROR << "trellis-pserver: reporting ready: " << st.ToString();
      return kExitFailure;
    }
  }
  // Until a signal, or until a server resize removed this server (docs/elastic.md#servers):
  // every slice moved to the others, it exits 0, a departure the scheduler expects.
  const timespec every{0, 200 * 1000 * 1000};
  int sig = -1;
  int64_t away = 0;
  while (sig < 0 && away == 0) {
    sig = sigtimedwait(&sigs, nullptr, &every);
    if (sig < 0) away = (*server)->store()->ResizedAway();
  }
  if (away != 0) {
    TLOG_INFO << "server " << config->server.store.server_rank << " resized away in world " << away
              << ": every slice it held moved to the others; exiting";
  } else {
    TLOG_INFO << "signal " << sig << ", shutting down";
  }
  (*server)->Shutdown();
  return kExitOk;
}

}  // namespace trellis
