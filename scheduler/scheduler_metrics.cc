#include "scheduler/scheduler_metrics.h"

namespace trellis {
namespace {

// Counters mirror totals kept by the state: advanced by the difference at scrape time.
void Advance(prometheus::Counter& c, double total) {
  const double delta = total - c.Value();
  if (delta > 0) c.Increment(delta);
}

}  // namespace

void RegisterSchedulerMetrics(MetricsRegistry& r, const SchedulerState& state) {
  struct Series {
    prometheus::Gauge* nodes[2];
    prometheus::Gauge* dead[2];
    prometheus::Counter* restarts[2];
    prometheus::Counter* registrations;
    prometheus::Counter* dead_detected;
    prometheus::Counter* stalls;
    prometheus::Counter* barrier_releases;
    prometheus::Counter* barrier_wait;
    prometheus::Counter* rejoins;
    prometheus::Counter* fresh_rejoins;
    prometheus::Counter* resizes;
    prometheus::Counter* workers_lost;
    prometheus::Counter* servers_taken_over;
    prometheus::Gauge* world_workers;
    prometheus::Gauge* world_servers;
    prometheus::Gauge* waiters;
    prometheus::Gauge* version;
  } s{};
  const char* roles[] = {"server", "worker"};
  for (int i = 0; i < 2; ++i) {
    const MetricsRegistry::Labels l = {{"node_role", roles[i]}};
    s.nodes[i] = &r.Gauge("trellis_scheduler_nodes", "Nodes registered now, by role", l);
    s.dead[i] = &r.Gauge("trellis_scheduler_dead_nodes", "Nodes marked dead now (heartbeats stopped), by role", l);
    s.restarts[i] = &r.Counter("trellis_scheduler_restarts_total", "Program restarts reported by the agents, by role", l);
  }
  s.registrations = &r.Counter("trellis_scheduler_registrations_total", "Accepted Register calls, re-registrations included");
  s.dead_detected = &r.Counter("trellis_scheduler_dead_detected_total", "Times a node was marked dead");
  s.stalls = &r.Counter("trellis_scheduler_stalls_total",
                        "Programs found stalled (no liveness or no step progress) and restarted");
  s.barrier_releases = &r.Counter("trellis_scheduler_barrier_releases_total", "Barrier generations released");
  s.barrier_wait = &r.Counter("trellis_scheduler_barrier_wait_seconds_total",
                              "Time nodes spent waiting in barriers, summed over every released waiter");
  s.rejoins = &r.Counter("trellis_scheduler_rejoins_total",
                         "Restarted workers that rejoined the running job from a donor's commit");
  s.fresh_rejoins = &r.Counter("trellis_scheduler_fresh_rejoins_total",
                               "Rejoin requests answered 'start fresh' (no live worker had committed a step)");
  s.resizes = &r.Counter("trellis_scheduler_resizes_total",
                         "Elastic jobs: resizes of the workers or the servers decided (docs/elastic.md)");
  s.workers_lost = &r.Counter("trellis_scheduler_workers_lost_total",
                              "Elastic jobs: workers lost for good that the job went on without "
                              "(docs/elastic.md#losing-a-worker)");
  s.servers_taken_over = &r.Counter("trellis_scheduler_servers_taken_over_total",
                                    "Elastic servers: servers lost for good whose shards another server's pod "
                                    "took over (docs/elastic.md#losing-a-server)");
  s.world_workers = &r.Gauge("trellis_scheduler_world_workers",
                             "Workers taking part in the job's steps now (its world)");
  s.world_servers = &r.Gauge("trellis_scheduler_world_servers",
                             "Parameter servers holding the job's slices now (its world; docs/elastic.md#servers)");
  s.waiters = &r.Gauge("trellis_scheduler_waiting_calls", "Calls waiting now (cluster view, key declaration, barriers)");
  s.version = &r.Gauge("trellis_scheduler_cluster_version", "Version of the cluster view (bumped on every change)");
  r.OnCollect([s, &state] {
    const SchedulerStats st = state.stats();
    for (int i = 0; i < 2; ++i) {
      s.nodes[i]->Set(static_cast<double>(st.registered[i]));
      s.dead[i]->Set(static_cast<double>(st.dead[i]));
      Advance(*s.restarts[i], static_cast<double>(st.restarts_of[i]));
    }
    Advance(*s.registrations, static_cast<double>(st.registrations));
    Advance(*s.dead_detected, static_cast<double>(st.dead_detected));
    Advance(*s.stalls, static_cast<double>(st.stalls));
    Advance(*s.barrier_releases, static_cast<double>(st.barrier_releases));
    Advance(*s.barrier_wait, st.barrier_wait_seconds);
    Advance(*s.rejoins, static_cast<double>(st.rejoins));
    Advance(*s.fresh_rejoins, static_cast<double>(st.fresh_rejoins));
    Advance(*s.resizes, static_cast<double>(st.resizes));
    Advance(*s.workers_lost, static_cast<double>(st.workers_lost));
    Advance(*s.servers_taken_over, static_cast<double>(st.servers_taken_over));
    s.world_workers->Set(static_cast<double>(st.world_workers));
    s.world_servers->Set(static_cast<double>(st.world_servers));
    s.waiters->Set(static_cast<double>(st.waiters));
    s.version->Set(static_cast<double>(st.version));
  });
}

}  // namespace trellis
