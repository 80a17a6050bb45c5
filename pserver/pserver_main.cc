#include "pserver/pserver_main.h"

#include <malloc.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <thread>

#include "common/tls.h"
#include "common/auth.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "datapath/tcp_wire.h"
#include "scheduler/scheduler_client.h"
#include "scheduler/scheduler_watch.h"

namespace trellis {

namespace {

// --name=value or --name value; --help is handled by the caller.
StatusOr<std::map<std::string, std::string>> ParseFlags(const std::vector<std::string>& args) {
  static const char* kKnown[] = {"port", "host", "listen", "scheduler", "rank", "token-file",
                                 "num-workers", "job", "threads", "tcp-port", "metrics-port",
                                 "local-socket"};
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) return InvalidArgumentError("unexpected argument '" + a + "'");
    std::string name = a.substr(2);
    std::string value;
    auto eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return InvalidArgumentError("flag --" + name + " needs a value");
    }
    if (std::find(std::begin(kKnown), std::end(kKnown), name) == std::end(kKnown)) {
      return InvalidArgumentError("unknown flag --" + name);
    }
    out[name] = value;
  }
  return out;
}

StatusOr<int64_t> ToInt(const std::string& what, const std::string& text, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) {
    return InvalidArgumentError(what + ": want an integer in [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "], got '" + text + "'");
  }
  return static_cast<int64_t>(v);
}

// flag > environment; empty when neither is set.
std::string Pick(const std::map<std::string, std::string>& flags, const std::string& flag,
                 const char* env, std::string* source) {
  if (auto it = flags.find(flag); it != flags.end()) {
    *source = "--" + flag;
    return it->second;
  }
  const char* v = std::getenv(env);
  if (v != nullptr && *v != '\0') {
    *source = env;
    return v;
  }
  return {};
}

}  // namespace

StatusOr<PserverConfig> LoadPserverConfig(const std::vector<std::string>& args) {
  TRELLIS_ASSIGN_OR_RETURN(auto flags, ParseFlags(args));
  PserverConfig c;
  std::string src;
  c.scheduler_address = Pick(flags, "scheduler", "TRELLIS_SCHEDULER", &src);
  std::string token_file = Pick(flags, "token-file", "TRELLIS_TOKEN_FILE", &src);
  TRELLIS_ASSIGN_OR_RETURN(c.token, ReadTokenFile(token_file));
  TRELLIS_ASSIGN_OR_RETURN(c.server.tls, LoadTlsFromEnv(EnvSource()));
  if (std::string h = Pick(flags, "host", "TRELLIS_HOST", &src); !h.empty()) c.advertise_host = h;
  // --listen > TRELLIS_LISTEN_HOST > every address.
  c.server.listen_host = ListenHost(EnvSource());
  if (auto it = flags.find("listen"); it != flags.end()) c.server.listen_host = it->second;
  if (std::string p = Pick(flags, "port", "TRELLIS_PSERVER_PORT", &src); !p.empty()) {
    TRELLIS_ASSIGN_OR_RETURN(int64_t port, ToInt(src, p, 0, 65535));
    c.server.port = static_cast<int>(port);
  }
  if (auto it = flags.find("tcp-port"); it != flags.end()) {
    TRELLIS_ASSIGN_OR_RETURN(int64_t port, ToInt("--tcp-port", it->second, -1, 65535));
    c.server.tcp_port = static_cast<int>(port);
  }
  // --local-socket > TRELLIS_LOCAL_SOCKET > off (trellis-launch sets it on).
  if (auto it = flags.find("local-socket"); it != flags.end()) {
    TRELLIS_ASSIGN_OR_RETURN(c.server.local_socket, ParseOnOff("--local-socket", it->second));
  } else {
    TRELLIS_ASSIGN_OR_RETURN(c.server.local_socket, LocalSocketEnabled(EnvSource(), false));
  }
  std::string rank = Pick(flags, "rank", "TRELLIS_RANK", &src);
  if (rank.empty()) return InvalidArgumentError("server rank not set (--rank or TRELLIS_RANK)");
  TRELLIS_ASSIGN_OR_RETURN(int64_t r, ToInt(src, rank, 0, 1 << 20));
  c.server.store.server_rank = static_cast<int32_t>(r);
  if (auto it = flags.find("threads"); it != flags.end()) {
    TRELLIS_ASSIGN_OR_RETURN(int64_t t, ToInt("--threads", it->second, 1, 256));
    c.server.service.pool_threads = static_cast<int>(t);
  }

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
  if (!job_yaml.empty()) {
    auto parsed = ParseJobSpec(job_yaml);
    if (!parsed.ok()) return parsed.status().Annotate(job_origin);
    job = *parsed;
  } else if (auto it = flags.find("job"); it != flags.end()) {
    auto parsed = LoadJobSpecFile(it->second);
    if (!parsed.ok()) return parsed.status();
    job = *parsed;
  }
  c.server.store.num_workers = job.workers.replicas;
  c.server.store.mode = job.serverMode;
  c.server.store.optimizer = job.optimizer;
  c.server.store.checkpoint_path = job.checkpoint.path;
  c.server.store.checkpoint_keep = job.checkpoint.keep;
  c.server.slice_bytes = job.sliceBytes;
  c.scheduler_ping = std::chrono::milliseconds(
      static_cast<int64_t>(std::max(0.05, job.scheduler.heartbeatIntervalSeconds) * 1000));
  if (std::string w = Pick(flags, "num-workers", "TRELLIS_NUM_WORKERS", &src); !w.empty()) {
    TRELLIS_ASSIGN_OR_RETURN(int64_t n, ToInt(src, w, 1, 1 << 20));
    c.server.store.num_workers = static_cast<int32_t>(n);
  }
  c.server.service.token = c.token;
  c.server.store.metrics =
      std::make_shared<MetricsRegistry>(MetricLabels{job.name, "server", c.server.store.server_rank});
  if (std::string p = Pick(flags, "metrics-port", "TRELLIS_METRICS_PORT", &src); !p.empty()) {
    TRELLIS_ASSIGN_OR_RETURN(int64_t port, ToInt(src, p, 0, 65535));
    c.metrics_port = static_cast<int>(port);
  }
  c.metrics_host = ListenHost(EnvSource(), "TRELLIS_METRICS_HOST");
  return c;
}

int PserverMain(int argc, char** argv) {
  SetLogTag("pserver");
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::fprintf(stderr,
                 "usage: trellis-pserver [--rank N] [--port P] [--scheduler host:port]\n"
                 "         [--token-file F] [--host advertised-host] [--listen bind-host]\n"
                 "         [--num-workers W] [--job job.yaml] [--threads T] [--tcp-port P]\n"
                 "         [--metrics-port P] [--local-socket on|off]\n"
                 "--tcp-port: the raw-TCP bulk listener (0 picks a port, -1 none); its port is\n"
                 "advertised in the data address as host:port;tcp=P.\n"
                 "--local-socket: also a Unix socket for workers in this network namespace\n"
                 "(default off, on under trellis-launch; not with TLS; advertised as ;local=NAME).\n"
                 "Flags override TRELLIS_RANK, TRELLIS_SCHEDULER, TRELLIS_TOKEN_FILE, "
                 "TRELLIS_HOST, TRELLIS_NUM_WORKERS, TRELLIS_METRICS_PORT, TRELLIS_LOCAL_SOCKET; the job comes from the "
                 "scheduler.\n");
    return 0;
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
    return 2;
  }
  auto server = ParameterServer::Start(config->server);
  if (!server.ok()) {
    TLOG_ERROR << "trellis-pserver: " << server.status().ToString();
    return 1;
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
  // The TCP port rides in the data address ("host:port;tcp=P"): no protocol change, and a
  // worker that only speaks gRPC ignores it.
  // So does the local socket's name (";local=NAME"), for workers in this network namespace.
  std::string address = tcpwire::JoinDataAddress(
      config->advertise_host + ":" + std::to_string((*server)->port()), (*server)->tcp_port(),
      (*server)->local_name());
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
      if (const char* inc = std::getenv("TRELLIS_INCARNATION"); inc != nullptr) {
        identity.set_incarnation(std::atoll(inc));
      }
      watch = std::make_unique<SchedulerWatch>(client.get(), ping->scheduler_id(),
                                               config->scheduler_ping, report,
                                               "server " + std::to_string(rank), identity);
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
      return 1;
    }
  }
  int sig = 0;
  sigwait(&sigs, &sig);
  TLOG_INFO << "signal " << sig << ", shutting down";
  (*server)->Shutdown();
  return 0;
}

}  // namespace trellis
