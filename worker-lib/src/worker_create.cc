// Worker::Create: the environment contract (TRELLIS_SCHEDULER, TRELLIS_RANK, TRELLIS_TOKEN_FILE,
// TRELLIS_NUM_WORKERS, TRELLIS_TIMEOUT_MS, TRELLIS_INCARNATION, TRELLIS_METRICS_PORT/HOST), the job from the scheduler
// (incl. spec.transport and spec.compression), the complete cluster view; precedence
// WorkerOptions > environment > job > default.
// A multi-GPU pod (TRELLIS_LOCAL_SIZE > 1, set by the agent) gets a LocalGroupWorker around the
// pod's WorkerImpl (local_group_worker.h); TRELLIS_RANK is then the pod's rank.
#include <chrono>
#include <cstdlib>

#include "common/tls/auth.h"
#include "common/config/env_names.h"
#include "common/config/env.h"
#include "common/job/job_spec.h"
#include "common/base/logging.h"
#include "scheduler/scheduler_client.h"
#include "worker-lib/src/group_key_exchange.h"
#include "worker-lib/src/local_group_worker.h"
#include "worker-lib/src/push_retention.h"
#include "worker-lib/src/scheduler_session.h"
#include "worker-lib/src/worker_impl.h"

namespace trellis {

StatusOr<std::unique_ptr<Worker>> Worker::Create(const WorkerOptions& options) {
  const EnvSource env;  // read once, here
  WorkerSetup setup;
  std::string scheduler = options.scheduler_address;
  if (scheduler.empty()) scheduler = env.GetOr(kEnvScheduler, "");
  if (scheduler.empty()) {
    return InvalidArgumentError(
        std::string("no scheduler address: set ") + kEnvScheduler + "=host:port (trellis-launch and the agent do)");
  }
  std::string token_file = options.token_file.empty() ? env.GetOr(kEnvTokenFile, "")
                                                      : options.token_file;
  TRELLIS_ASSIGN_OR_RETURN(setup.token, ReadTokenFile(token_file));
  TRELLIS_ASSIGN_OR_RETURN(setup.tls, LoadTlsFromEnv(env));
  if (options.rank >= 0) {
    setup.rank = options.rank;
  } else {
    TRELLIS_ASSIGN_OR_RETURN(std::optional<int64_t> v, env.OptionalInt(kEnvRank, 0, 1 << 20));
    if (!v) return InvalidArgumentError(std::string("no worker rank: set ") + kEnvRank);
    setup.rank = static_cast<int32_t>(*v);
  }
  setup.timeout_ms = 120000;
  if (options.timeout_ms > 0) {
    setup.timeout_ms = options.timeout_ms;
  } else {
    TRELLIS_ASSIGN_OR_RETURN(std::optional<int64_t> t, env.OptionalInt(kEnvTimeoutMs, 1, INT64_MAX / 2));
    if (t) setup.timeout_ms = *t;
  }
  const auto wait = std::chrono::milliseconds(setup.timeout_ms);

  std::shared_ptr<SchedulerClient> client;
  {
    TRELLIS_ASSIGN_OR_RETURN(auto c, SchedulerClient::Connect(
                                         {scheduler, setup.token, std::chrono::milliseconds(10000),
                                          setup.tls}));
    client = std::move(c);
  }
  auto yaml = client->GetJobYaml();
  if (!yaml.ok()) return yaml.status().Annotate("reading the job from the scheduler " + scheduler);
  auto job = ParseJobSpec(*yaml);
  if (!job.ok()) return job.status().Annotate("the scheduler's job");
  setup.water_mark = options.water_mark > 0 ? options.water_mark : job->priority.waterMark;
  setup.priority_enabled = job->priority.enabled;
  setup.bulking = {job->bulking.enabled,      job->bulking.thresholdBytes,
                   job->bulking.pushMaxBytes, job->bulking.pushMaxCount,
                   job->bulking.pullMaxBytes, job->bulking.pullMaxCount};
  setup.slice_bytes_override = options.slice_bytes;
  setup.checkpoint = {job->checkpoint.path, job->checkpoint.intervalSteps, job->checkpoint.keep,
                      job->serverMode == ServerMode::kUpdate};
  setup.compression = job->compression;
  // The data path: WorkerOptions > the job's spec.transport (default tcp).
  setup.transport =
      !options.transport.empty() ? options.transport : std::string(ToString(job->transport));

  TRELLIS_ASSIGN_OR_RETURN(setup.local_socket, LocalSocketEnabled(env, true));

  // Crash recovery: after a restart (incarnation > 1) the checkpointer asks to rejoin.
  TRELLIS_ASSIGN_OR_RETURN(std::optional<int64_t> inc, env.OptionalInt(kEnvIncarnation, 1, 1 << 30));
  if (inc) setup.incarnation = *inc;
  // Every scheduler call goes through the session, which outlives a scheduler restart.
  TRELLIS_ASSIGN_OR_RETURN(
      std::shared_ptr<SchedulerSession> session,
      SchedulerSession::Start(client, setup.rank, setup.incarnation,
                              std::chrono::milliseconds(static_cast<int64_t>(
                                  std::max(0.05, job->scheduler.heartbeatIntervalSeconds) * 1000))));
  SchedulerSession* ss = session.get();
  using std::chrono::milliseconds;

  // The complete cluster view: every server ready with its data address.
  const auto deadline = std::chrono::steady_clock::now() + wait;
  v1::ClusterView view;
  int64_t version = 0;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return DeadlineExceededError("cluster not complete within " +
                                   std::to_string(setup.timeout_ms) + " ms: " +
                                   std::to_string(view.servers_size()) + " of " +
                                   std::to_string(view.num_servers()) + " servers known");
    }
    auto v = ss->Call<StatusOr<v1::ClusterView>>(
        [c = client.get(), version](milliseconds w) { return c->GetCluster(version, true, w); },
        left);
    if (!v.ok()) return v.status().Annotate("waiting for the cluster");
    view = *v;
    version = view.version();
    if (view.failed()) return AbortedError("job failed: " + view.failure_message());
    if (view.complete()) break;
  }
  setup.num_workers = view.num_workers();
  for (const auto& s : view.servers()) setup.server_addresses.push_back(s.address());
  setup.server_slots = view.server_slots();  // an elastic job's maxServers
  session->HoldServerAddresses(setup.server_addresses);
  if (setup.rank >= setup.num_workers) {
    return InvalidArgumentError("worker rank " + std::to_string(setup.rank) + " but the job has " +
                                std::to_string(setup.num_workers) + " workers");
  }
  SchedulerClient* c = client.get();
  const int32_t rank = setup.rank;
  setup.declare = [ss, c, rank, wait](const std::vector<v1::KeySpec>& keys) {
    auto map = ss->Call<StatusOr<v1::ShardMap>>(
        [&](milliseconds w) { return c->DeclareKeys(rank, keys, w); }, wait);
    if (map.ok()) ss->HoldShardMap(*map);  // a restarted scheduler gets it back from us
    return map;
  };
  setup.barrier = [ss, c, rank, wait](const std::string& name, int64_t generation) {
    return ss->Call<Status>(
        [&](milliseconds w) {
          return c->Barrier(name, v1::ROLE_WORKER, rank, generation, /*all_nodes=*/false, w);
        },
        wait);
  };
  const int64_t incarnation = setup.incarnation;
  setup.request_rejoin = [ss, c, rank, incarnation, wait] {
    return ss->Call<StatusOr<v1::RequestRejoinResponse>>(
        [&](milliseconds w) { return c->RequestRejoin(rank, incarnation, w); }, wait);
  };
  setup.watch_rejoins = [ss, c, rank, incarnation](SchedulerClient::WatchMode m,
                                                    milliseconds w) {
    // The watcher's polls repeat anyway; registering as a donor outlasts a restart.
    if (m != SchedulerClient::WatchMode::kRegister) return c->WatchRejoins(rank, incarnation, m, w);
    return ss->Call<StatusOr<v1::WatchRejoinsResponse>>(
        [&](milliseconds left) { return c->WatchRejoins(rank, incarnation, m, left); }, w);
  };
  setup.rejoin_served = [c](const v1::RejoinServedRequest& r) { return c->RejoinServed(r); };
  // Dropped when it fails (a restarting scheduler): the next interval's report carries on.
  setup.report_progress = [c](const v1::ReportProgressRequest& r) { return c->ReportProgress(r); };
  // The job's end from outside: the pings carry it; rank 0 reports its checkpoints.
  setup.job_stopping = [ss] { return ss->JobStopping(); };
  setup.report_checkpoint = [c](const v1::ReportCheckpointRequest& r) { return c->ReportCheckpoint(r); };
  // Elastic jobs (docs/elastic.md): the world now (after a resize, a restarted worker's is not
  // the first one), and the resize protocol at step boundaries.
  if (job->elastic.enabled) {
    setup.world = view.world();
    setup.join_grows = options.join_grows;
    setup.resize_epoch = [ss] { return ss->ResizeEpoch(); };
    setup.listen_resizes = [ss](std::function<void(int64_t)> f) {
      ss->SetResizeListener(std::move(f));
    };
    setup.hand_back_world = [ss](std::function<v1::WorldInfo()> f) { ss->HoldWorld(std::move(f)); };
    setup.reach_step = [ss, c](const v1::ReachStepRequest& r, milliseconds w) {
      return ss->Call<StatusOr<v1::ReachStepResponse>>(
          [&](milliseconds left) { return c->ReachStep(r, left); }, w);
    };
  }
  // Operations wait for a member the scheduler is restarting (docs/scheduler.md#stalls).
  setup.peers_restarting = [ss] { return ss->PeersRestarting(); };
  setup.keep_alive = session;
  setup.retain_pushes = RetainsPushes(*job);
  setup.servers_resized = [ss](const v1::ShardMap& map, const std::vector<std::string>& addresses) {
    ss->HoldShardMap(map);
    ss->HoldServerAddresses(addresses);
  };
  // A restarted server reports ready again, maybe at another port: ask the cluster view.
  setup.resolve_server = [ss, c](int32_t server, int64_t wait_ms) -> StatusOr<std::string> {
    TRELLIS_ASSIGN_OR_RETURN(
        v1::ClusterView view,
        ss->Call<StatusOr<v1::ClusterView>>(
            [&](milliseconds w) { return c->GetCluster(0, /*wait_complete=*/true, w); },
            milliseconds(wait_ms)));
    for (const auto& s : view.servers()) {
      if (s.rank() == server && s.ready() && !s.address().empty()) {
        ss->HoldServerAddress(server, s.address());
        return s.address();
      }
    }
    return UnavailableError("server " + std::to_string(server) +
                            " is not ready in the scheduler's cluster view");
  };

  // The pod's local group: TRELLIS_LOCAL_RANK of TRELLIS_LOCAL_SIZE, named TRELLIS_LOCAL_GROUP.
  int64_t local_size = 1, local_rank = 0;
  TRELLIS_ASSIGN_OR_RETURN(std::optional<int64_t> size, env.OptionalInt(kEnvLocalSize, 1, 64));
  if (size) local_size = *size;
  if (local_size > 1) {
    TRELLIS_ASSIGN_OR_RETURN(std::optional<int64_t> lr, env.OptionalInt(kEnvLocalRank, 0, local_size - 1));
    if (!lr) return InvalidArgumentError(std::string(kEnvLocalSize) + " is set but " + kEnvLocalRank + " is not");
    local_rank = *lr;
  }

  // Metrics: labelled with the job and the process's (global) rank; served when the agent or
  // launcher gave a port.
  const int32_t global_rank = static_cast<int32_t>(setup.rank * local_size + local_rank);
  setup.metrics = std::make_shared<MetricsRegistry>(MetricLabels{job->name, "worker", global_rank});
  TRELLIS_ASSIGN_OR_RETURN(std::optional<int64_t> metrics_port, env.OptionalInt(kEnvMetricsPort, 0, 65535));
  if (metrics_port) {
    auto server = MetricsHttpServer::Start(ListenHost(env, kEnvMetricsHost), static_cast<int>(*metrics_port),
                                           *setup.metrics);
    // Metrics are not worth failing the training for: say so and go on without them.
    if (server.ok()) {
      setup.metrics_server = std::move(*server);
    } else {
      TLOG_ERROR << "worker /metrics not served: " << server.status().ToString();
    }
  }
  if (local_size == 1) return CreateWorker(std::move(setup));

  LocalGroupOptions lo;
  lo.name = env.GetOr(kEnvLocalGroup, "");
  if (lo.name.empty()) lo.name = job->name + "-w" + std::to_string(rank);
  lo.rank = static_cast<int>(local_rank);
  lo.size = static_cast<int>(local_size);
  lo.timeout_ms = setup.timeout_ms;
  // The NCCL unique id goes through the scheduler.
  lo.exchange_key = SchedulerGroupKeyExchange(client, wait);
  const bool force_cpu = env.GetOr(kEnvLocalBackend, "") == "shm";
  LocalGroupSetup group;
  group.pod_rank = setup.rank;
  group.num_pods = setup.num_workers;
  group.metrics = setup.metrics;
  TRELLIS_ASSIGN_OR_RETURN(group.inner, CreateWorker(std::move(setup)));
  lo.channel = "rs";
  TRELLIS_ASSIGN_OR_RETURN(group.reduce, OpenLocalGroup(lo, force_cpu));
  lo.channel = "ag";
  TRELLIS_ASSIGN_OR_RETURN(group.gather, OpenLocalGroup(lo, force_cpu));
  TLOG_INFO << "worker pod " << group.pod_rank << ": local rank " << lo.rank << " of " << lo.size
            << " (" << group.reduce->kind() << " local group " << lo.name << ")";
  return CreateLocalGroupWorker(std::move(group));
}

}  // namespace trellis
