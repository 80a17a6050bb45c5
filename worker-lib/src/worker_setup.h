// What a WorkerImpl is made from, independent of how the cluster was found: Worker::Create
// (worker_create.cc) fills a WorkerSetup from the environment and the scheduler; tests may fill
// one by hand (servers started in-process, a shard map built locally).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/job/job_spec.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_http.h"
#include "scheduler/scheduler_client.h"
#include "trellis/trellis.h"
#include "trellis/v1/scheduler.pb.h"
#include "worker-lib/src/server_connection.h"

namespace trellis {

// Bulking of small slices (the job's spec.bulking; docs/job-spec.md).
struct BulkingOptions {
  bool enabled = true;
  int64_t threshold_bytes = 64 << 10;  // slices up to this size may share a message
  int64_t push_max_bytes = 1 << 20;    // per bulk going up: headers + payloads
  int32_t push_max_count = 64;
  int64_t pull_max_bytes = 1 << 20;    // per bulk of pulls: the bytes they bring back
  int32_t pull_max_count = 64;
};

struct WorkerSetup {
  int32_t rank = 0;
  int32_t num_workers = 1;
  std::vector<std::string> server_addresses;  // index = server rank: the servers in force
  // The servers the job may ever have (spec.elastic.maxServers; a server resize grows up to it);
  // 0: server_addresses.size().
  int32_t server_slots = 0;
  std::string token;
  TlsPtr tls;  // TRELLIS_TLS_*: mutual TLS to the scheduler and the servers; nullptr: plaintext
  int64_t slice_bytes_override = 0;  // WorkerOptions.slice_bytes: must match the map's
  int32_t water_mark = 8;
  bool priority_enabled = true;  // off: every slice FIFO
  BulkingOptions bulking;
  int64_t timeout_ms = 120000;
  CheckpointConfig checkpoint;  // the job's spec.checkpoint
  // The job's spec.compression: with 2bit, pushes of keys that allow it are sent as 2-bit
  // frames (per-slice residuals here) once a key passed warmupSteps full-precision steps.
  CompressionSpec compression;

  // Collective declaration (the scheduler's DeclareKeys): this worker's keys -> the map.
  std::function<StatusOr<v1::ShardMap>(const std::vector<v1::KeySpec>&)> declare;
  // Barrier(name, generation).
  std::function<Status(const std::string&, int64_t)> barrier;
  // "grpc" or "tcp" (the job's spec.transport, WorkerOptions.transport); picks `connect`.
  std::string transport = "grpc";
  bool local_socket = true;  // TRELLIS_LOCAL_SOCKET (common/config/env.h)
  // Opens a link to a server (default: by `transport`); tests hand in links of their own.
  LinkOpener connect;
  // The job's spec.recovery.retainPushes: keep the last two pushes per slice and, when a
  // server's connection ends, reconnect and replay them (server_connection.h).
  bool retain_pushes = true;
  // The current data address of server `server` (the scheduler's cluster view, waiting at most
  // `wait_ms` for it to be complete); null: addresses do not change.
  std::function<StatusOr<std::string>(int32_t server, int64_t wait_ms)> resolve_server;
  // A server resize took effect here: the map and servers' addresses now in force (what a
  // restarted scheduler gets back). Optional.
  std::function<void(const v1::ShardMap&, const std::vector<std::string>&)> servers_resized;
  // Crash recovery (rejoin_keeper.h; docs/checkpoints.md#crash-recovery-workers): this
  // process's incarnation (TRELLIS_INCARNATION: > 1 after its agent restarted it) and the
  // scheduler's rejoin calls. Hooks left unset: rejoining is off (workers built by hand).
  int64_t incarnation = 1;
  std::function<StatusOr<v1::RequestRejoinResponse>()> request_rejoin;
  // (register / long poll up to the duration / stop being a donor)
  std::function<StatusOr<v1::WatchRejoinsResponse>(SchedulerClient::WatchMode,
                                                   std::chrono::milliseconds)>
      watch_rejoins;
  std::function<Status(const v1::RejoinServedRequest&)> rejoin_served;
  // When the scheduler last said another member of the job is being restarted (a stalled or
  // crashed process, docs/scheduler.md#stalls) and which; null: never. An operation whose
  // deadline passes within one timeout of that waits on (its deadline moves) instead of failing.
  std::function<std::pair<std::chrono::steady_clock::time_point, std::string>()> peers_restarting;
  // Sends a batched progress report (the scheduler's ReportProgress); null: reports are dropped.
  std::function<Status(const v1::ReportProgressRequest&)> report_progress;
  // Whether the whole job is being stopped from outside (the scheduler's pings say so after
  // StopJob): rank 0's checkpointer writes an exit checkpoint at the next step boundary and
  // waits there to be stopped (docs/checkpoints.md#stopping-a-job-the-exit-checkpoint). Null: never.
  std::function<bool()> job_stopping;
  // Elastic jobs (docs/elastic.md; world_switch.h): the world the worker starts in (no members:
  // ranks 0..num_workers-1 from step 1; `rank` is then its slot, its rank for life), the resize
  // the scheduler's pings say is under way (0: none) and its ReachStep. Null hooks: the world
  // never changes.
  v1::WorldInfo world;
  bool join_grows = true;  // WorkerOptions::join_grows
  std::function<int64_t()> resize_epoch;
  // Registers a listener the scheduler's pings call while a resize is under way (its epoch).
  std::function<void(std::function<void(int64_t)>)> listen_resizes;
  // Registers where the world comes from, for a restarted scheduler (the worker hands it back).
  std::function<void(std::function<v1::WorldInfo()>)> hand_back_world;
  std::function<StatusOr<v1::ReachStepResponse>(const v1::ReachStepRequest&,
                                                std::chrono::milliseconds)>
      reach_step;
  // Tells the scheduler of a checkpoint rank 0 wrote (its ReportCheckpoint); null: not told.
  std::function<Status(const v1::ReportCheckpointRequest&)> report_checkpoint;
  // Kept alive as long as the worker (e.g. the scheduler client the hooks use).
  std::shared_ptr<void> keep_alive;
  // The process's metrics (job, role worker, rank); null: the worker makes its own.
  std::shared_ptr<MetricsRegistry> metrics;
  // Serves `metrics` on TRELLIS_METRICS_PORT (Worker::Create); declared after `metrics` so it
  // stops before the registry goes.
  std::shared_ptr<MetricsHttpServer> metrics_server;
};

}  // namespace trellis
