// What a job's scheduler is told at start (flags, environment, the job file: scheduler/main.cc),
// and the figures it reports (metrics). Every part of SchedulerState reads the one config.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/base/status.h"

namespace trellis {

// spec.elastic (docs/elastic.md): the bounds a running job's workers may be resized within.
struct ElasticBounds {
  bool enabled = false;  // off: Resize is refused, the world never changes
  int32_t min_workers = 1;
  int32_t max_workers = 1;
  // The servers' bounds (spec.elastic.minServers/maxServers); 0: the job's servers, fixed.
  int32_t min_servers = 0;
  int32_t max_servers = 0;
};

struct SchedulerConfig {
  std::string job_name;  // checked against RegisterRequest.job when both are set
  int32_t num_servers = 1;
  int32_t num_workers = 1;
  std::string dispatch = "roundRobin";  // see shard_map.h
  int64_t slice_bytes = 1 << 20;  // JobSpec::sliceBytes's default
  std::chrono::milliseconds heartbeat_timeout{10000};
  // After a restart: how long the scheduler waits for the old members to register again before
  // those still missing are marked dead (docs/scheduler.md#scheduler-restart).
  std::chrono::milliseconds recovery_grace{30000};
  uint64_t instance_id = 0;  // PingResponse.scheduler_id; 0: the state picks a random one
  // How long a preempted node's rank waits for its replacement pod to register before the job
  // fails (the job's scheduler.registrationTimeoutSeconds).
  std::chrono::milliseconds replacement_timeout{300000};
  // Stalls (docs/scheduler.md#stalls; spec.scheduler.livenessTimeoutSeconds and
  // progressTimeoutSeconds): a program whose own pings stopped for `liveness_timeout`, or a worker
  // whose reported step stood still for `progress_timeout` while another worker was ahead of it,
  // is stalled and its agent restarts it. 0 turns that check off. A member being restarted must
  // be back within `replacement_timeout`, or the job fails.
  std::chrono::milliseconds liveness_timeout{30000};
  std::chrono::milliseconds progress_timeout{300000};
  // Pods stopped from outside (pod_stops.h): a pod waits `pod_stop_window` for the others to
  // follow; everyone waits for the exit checkpoint at most `stop_limit` (the job's
  // terminationGracePeriodSeconds less a margin to exit in).
  std::chrono::milliseconds pod_stop_window{2000};
  std::chrono::milliseconds stop_limit{27000};
  ElasticBounds elastic;

  // The worker ranks (slots) the job may ever have: an elastic job's maxWorkers, else its
  // workers. Slots beyond the first `num_workers` start outside the world (growing beyond the
  // first size brings them in; docs/elastic.md#growing).
  int32_t worker_slots() const {
    return elastic.enabled && elastic.max_workers > num_workers ? elastic.max_workers : num_workers;
  }
  // The server ranks likewise: an elastic job's maxServers, else its servers. Slots beyond the
  // first `num_servers` start outside the world (a server grow brings them in).
  int32_t server_slots() const {
    return elastic.enabled && elastic.max_servers > num_servers ? elastic.max_servers : num_servers;
  }
  int32_t min_servers() const {
    return elastic.enabled && elastic.min_servers > 0 ? elastic.min_servers : num_servers;
  }
  // The servers' bounds let them be resized (spec.elastic.minServers < maxServers): its servers
  // are elastic, and a server lost for good is taken over by the others
  // (docs/elastic.md#losing-a-server).
  bool servers_elastic() const { return elastic.enabled && min_servers() < server_slots(); }
};

Status ValidateSchedulerConfig(const SchedulerConfig& config);

// The scheduler's figures (SchedulerState::stats(); scheduler_metrics.cc). Each part of the state
// adds its own (AddTo).
struct SchedulerStats {
  int64_t version = 0;
  int64_t registrations = 0;  // accepted Register calls, re-registrations included
  int64_t restarts = 0;       // all nodes together
  int64_t dead_detected = 0;  // times a node was marked dead
  int64_t waiters = 0;        // calls waiting now
  // Per role, indexed [0] servers, [1] workers (metrics).
  int64_t registered[2] = {0, 0};  // registered now (alive or not)
  int64_t dead[2] = {0, 0};        // marked dead now
  int64_t restarts_of[2] = {0, 0};
  int64_t barrier_releases = 0;        // barrier generations released
  double barrier_wait_seconds = 0;     // summed over every released waiter
  int64_t rejoins = 0;                 // rejoin requests served by a donor
  int64_t fresh_rejoins = 0;           // rejoin requests answered "start fresh"
  int64_t recoveries = 0;              // times this scheduler rebuilt a running job's state
  int64_t stalls = 0;                  // programs found stalled (liveness.cc)
  int64_t resizes = 0;                 // elastic jobs: resizes decided (world_plan.h)
  int64_t workers_lost = 0;            // elastic jobs: workers lost for good, the job going on
  int64_t servers_taken_over = 0;      // elastic servers: servers lost for good, taken over
  int64_t world_workers = 0;           // the workers taking part now
  int64_t world_servers = 0;           // the servers holding the slices now
  bool recovering = false;             // waiting for the old members now
};

}  // namespace trellis
