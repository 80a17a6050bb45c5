#include "pserver/pserver_metrics.h"

namespace trellis {

PserverMetrics::PserverMetrics(MetricsRegistry& r)
    : received_bytes_(r.Counter("trellis_pserver_received_bytes_total", "Payload bytes received in push and init requests")),
      sent_bytes_(r.Counter("trellis_pserver_sent_bytes_total", "Payload bytes answered to pulls")),
      request_errors_(r.Counter("trellis_pserver_request_errors_total",
                                "Requests answered with an error (unknown key, wrong step or length, shutdown)")),
      aggregation_seconds_(r.Histogram("trellis_pserver_aggregation_duration_seconds",
                                       "Time to add one pushed slice into its step's sum",
                                       MetricsRegistry::LatencyBuckets())),
      update_seconds_(r.Histogram("trellis_pserver_update_duration_seconds",
                                  "Time to finish a slice's step once all workers pushed (mean and optimizer in "
                                  "update mode, publishing the result)",
                                  MetricsRegistry::LatencyBuckets())),
      slice_steps_(r.Counter("trellis_pserver_slice_steps_total", "Steps completed, summed over the slices held")),
      waiting_pulls_(r.Gauge("trellis_pserver_waiting_pulls", "Pulls waiting for their step to complete")),
      slices_(r.Gauge("trellis_pserver_slices", "Slices this server holds")),
      slice_bytes_(r.Gauge("trellis_pserver_slice_bytes", "Bytes of the slices this server holds")),
      checkpoint_save_seconds_(r.Histogram("trellis_pserver_checkpoint_save_seconds",
                                           "Time to write this server's checkpoint file (update mode)",
                                           MetricsRegistry::LatencyBuckets())),
      checkpoint_size_bytes_(r.Gauge("trellis_pserver_checkpoint_size_bytes",
                                     "Size of the newest checkpoint file this server wrote")),
      checkpoint_saves_(r.Counter("trellis_pserver_checkpoint_saves_total",
                                  "Checkpoint files this server wrote")),
      checkpoint_restores_(r.Counter("trellis_pserver_checkpoint_restores_total",
                                     "Checkpoints this server restored its slices from")),
      rebuilt_slices_(r.Counter("trellis_pserver_rebuilt_slices_total",
                                "Slices rebuilt from the workers' replayed pushes after a restart")),
      moved_in_slices_(r.Counter("trellis_pserver_slices_moved_in_total",
                                 "Slices a server resize moved here, their whole state handed in")),
      moved_out_slices_(r.Counter("trellis_pserver_slices_moved_out_total",
                                  "Slices a server resize moved away, taken by every worker")) {
  const char* ops[] = {"push", "pull", "pushpull", "init"};
  for (int i = 0; i < 4; ++i) {
    requests_[i] = &r.Counter("trellis_pserver_requests_total", "Requests received, by operation", {{"op", ops[i]}});
  }
}

void PserverMetrics::Request(wire::Op op, uint64_t payload_bytes) {
  int i = -1;  // kBulk (its entries are counted one by one) and unknown ops: no op series
  if (op == wire::Op::kPush || op == wire::Op::kPushTwoBit) i = 0;  // either encoding
  if (op == wire::Op::kPull || op == wire::Op::kPullPacked) i = 1;
  if (op == wire::Op::kPushPull || op == wire::Op::kPushPullTwoBit ||
      op == wire::Op::kPushPullTwoBitPacked) {
    i = 2;
  }
  if (op == wire::Op::kInit) i = 3;
  if (i >= 0) requests_[i]->Increment();
  if (payload_bytes > 0) received_bytes_.Increment(static_cast<double>(payload_bytes));
}

}  // namespace trellis
