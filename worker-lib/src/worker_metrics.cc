#include "worker-lib/src/worker_metrics.h"

namespace trellis {
namespace {

int OpIndex(wire::Op op) {
  switch (op) {
    case wire::Op::kPush:
    case wire::Op::kPushTwoBit: return 0;  // the user's operation, whatever its encoding
    case wire::Op::kPull:
    case wire::Op::kPullPacked: return 1;
    case wire::Op::kPushPull:
    case wire::Op::kPushPullTwoBit:
    case wire::Op::kPushPullTwoBitPacked: return 2;
    case wire::Op::kInit: return 3;  // a broadcast from the root
    default: return -1;              // kBulk and anything else: not a user operation
  }
}

}  // namespace

WorkerMetrics::WorkerMetrics(MetricsRegistry& r)
    : steps_(r.Counter("trellis_worker_steps_total", "Training steps: the highest push count any key reached")),
      step_seconds_(r.Histogram("trellis_worker_step_duration_seconds", "Time between consecutive completed steps",
                                MetricsRegistry::LatencyBuckets())),
      pushed_bytes_(r.Counter("trellis_worker_pushed_bytes_total", "Gradient bytes pushed to the servers (acknowledged)")),
      pulled_bytes_(r.Counter("trellis_worker_pulled_bytes_total", "Parameter bytes pulled from the servers")),
      slices_sent_(r.Counter("trellis_worker_slices_sent_total", "Slice requests sent to the servers")),
      queue_depth_(r.Gauge("trellis_worker_queue_depth", "Slices waiting in the priority queue")),
      in_flight_(r.Gauge("trellis_worker_inflight_slices", "Slices sent and not answered yet")),
      barrier_wait_(r.Histogram("trellis_worker_barrier_wait_seconds", "Time a worker waited in Barrier",
                                MetricsRegistry::LatencyBuckets())),
      reconnects_(r.Counter("trellis_worker_server_reconnects_total",
                            "Times a lost server connection was re-established or given up on")),
      replayed_(r.Counter("trellis_worker_replayed_slices_total",
                          "Retained pushes replayed to restarted servers")) {
  const char* ops[] = {"push", "pull", "pushpull", "init"};
  for (int i = 0; i < 4; ++i) {
    op_seconds_[i] = &r.Histogram("trellis_worker_operation_duration_seconds",
                                  "Latency of one Push/Pull/PushPull/Broadcast of a key, all its slices",
                                  MetricsRegistry::LatencyBuckets(), {{"op", ops[i]}});
    op_errors_[i] = &r.Counter("trellis_worker_operation_errors_total",
                               "Operations that failed (deadline, server error, shutdown)", {{"op", ops[i]}});
  }
}

void WorkerMetrics::KeyPushed(int64_t step) {
  MutexLock lock(&mu_);
  // The first push of a new step number starts that step. Keys pushed less often (an epoch's
  // statistics) never lead, so they do not hold the count back.
  if (step <= last_step_) return;
  const auto now = Clock::now();
  if (last_step_ > 0) step_seconds_.Observe(std::chrono::duration<double>(now - last_step_time_).count());
  steps_.Increment(static_cast<double>(step - last_step_));
  last_step_ = step;
  last_step_time_ = now;
}

void WorkerMetrics::OperationDone(wire::Op op, bool ok, double seconds) {
  const int i = OpIndex(op);
  if (i < 0) return;
  if (ok) {
    op_seconds_[i]->Observe(seconds);
  } else {
    op_errors_[i]->Increment();
  }
}

}  // namespace trellis
