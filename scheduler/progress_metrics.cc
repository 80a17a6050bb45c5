#include "scheduler/progress_metrics.h"

namespace trellis {

void RegisterProgressMetrics(MetricsRegistry& r, const ProgressTracker& progress,
                             const SchedulerState& state) {
  struct Series {
    prometheus::Gauge* step;
    prometheus::Gauge* total_steps;
    prometheus::Gauge* samples;
    prometheus::Gauge* eta;
    prometheus::Gauge* skew;
    prometheus::Gauge* slowest;
    prometheus::Gauge* straggler;
    prometheus::Gauge* checkpoint_step;
    prometheus::Gauge* checkpoint_time;
  } s{};
  s.step = &r.Gauge("trellis_job_step", "Lowest training step reported by the workers");
  s.total_steps = &r.Gauge("trellis_job_total_steps", "Steps the job will run (0: not known)");
  s.samples = &r.Gauge("trellis_job_samples_per_second", "Samples per second, summed over the live workers");
  s.eta = &r.Gauge("trellis_job_eta_seconds", "Estimated seconds to the last step (-1: not known)");
  s.skew = &r.Gauge("trellis_job_step_skew_ratio",
                    "Slowest worker's compute time per step over the other workers' median (0: not known)");
  s.slowest = &r.Gauge("trellis_job_slowest_rank", "Worker with the highest compute time per step (-1: none)");
  s.straggler = &r.Gauge("trellis_job_straggler_rank",
                         "Worker above spec.monitoring.straggler.factor x the median for windowSeconds (-1: none)");
  s.checkpoint_step = &r.Gauge("trellis_job_checkpoint_step",
                               "Step of the newest checkpoint rank 0 wrote (0: none since the scheduler started)");
  s.checkpoint_time = &r.Gauge("trellis_job_checkpoint_timestamp_seconds",
                               "Unix time the newest checkpoint was reported (0: none); its age is "
                               "time() - this");
  r.OnCollect([s, &progress, &state] {
    const v1::JobProgress p = progress.Snapshot(state.GetCluster());
    s.step->Set(static_cast<double>(p.step()));
    s.total_steps->Set(static_cast<double>(p.total_steps()));
    s.samples->Set(p.samples_per_second());
    s.eta->Set(p.eta_seconds());
    s.skew->Set(p.skew());
    s.slowest->Set(p.slowest_rank());
    s.straggler->Set(p.straggler_rank());
    s.checkpoint_step->Set(static_cast<double>(p.checkpoint().step()));
    s.checkpoint_time->Set(static_cast<double>(p.checkpoint().unix_ms()) / 1000.0);
  });
}

}  // namespace trellis
