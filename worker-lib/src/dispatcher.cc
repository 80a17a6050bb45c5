// Dispatcher (dispatcher.h): draining the priority queue into the servers' connections,
// bulking small slices, and turning answers into completed parts.
//
// A slice's in-flight place is freed once its bytes went to the kernel (or its reply came
// first, on an error), not when the answer is back: a PushPull's answer waits until every
// worker pushed, and holding places for that would couple the workers' queues (one worker's
// places all taken by answers that wait on keys another worker has not reached yet).
//
// Bulks: a popped slice no bigger than bulking.thresholdBytes takes the following queue heads
// with it while they are small, go to the same server, go the same direction (pulls, or slices
// that carry a payload) and fit the direction's byte and count limits. Only the head is ever
// taken, so a bulk never jumps a higher-priority slice; the bulk takes one place.
#include "worker-lib/src/dispatcher.h"

#include "datapath/codec/packed_sum.h"
#include "worker-lib/src/packed_answer.h"

namespace trellis {
namespace {

// A pull without payload (plain or accepting a packed answer): bulks by the pull direction.
bool IsPullOnly(wire::Op op) { return op == wire::Op::kPull || op == wire::Op::kPullPacked; }

}  // namespace

Dispatcher::Dispatcher(const BulkingOptions& bulking, int water_mark, ServerSet& servers,
                       WorkerCompression& compression, WorkerMetrics& series,
                       SliceMetrics& slice_metrics, ByteLedger* ledger)
    : bulking_(bulking),
      servers_(servers),
      compression_(compression),
      series_(series),
      slice_metrics_(slice_metrics),
      ledger_(ledger),
      queue_(water_mark) {}

void Dispatcher::Enqueue(int priority, std::vector<SliceTask> tasks) {
  for (auto& t : tasks) queue_.Push(priority, std::move(t));
  series_.SampleQueue(queue_.queued(), queue_.in_flight());
  slice_metrics_.SetDepth(queue_.queued_by_band());
  Pump();
}

void Dispatcher::Close() {
  closed_.store(true);
  // Queued slices never reach the wire: fail their operations.
  for (SliceTask& t : queue_.TakeAll()) {
    t.op->Complete(CancelledError(t.op->what + ": worker shutting down"));
  }
}

bool Dispatcher::Bulkable(const SliceTask& t) const {
  const BulkingOptions& b = bulking_;
  // Server-wide commands (a checkpoint's save or load, a rejoin) are never bulked: they travel alone.
  return b.enabled && t.request.op != wire::Op::kInit && t.request.op != wire::Op::kSave &&
         t.request.op != wire::Op::kLoad && t.request.op != wire::Op::kWorld &&
         !wire::IsRejoinOp(static_cast<uint8_t>(t.request.op)) &&
         t.slice_bytes <= b.threshold_bytes;
}

void Dispatcher::Pump() {
  // One thread drains at a time: popping a slice and handing it to its transport must be one
  // step, or a thread popped earlier (a low-priority tail) could hand its slice over after a
  // later one popped by another thread, and order would depend on scheduling. A thread that
  // finds a drain running counts its request and leaves; the draining thread loops until no
  // request came meanwhile. This covers a reply that runs inline inside Send (dead connection)
  // and calls Pump again on the same thread.
  if (pump_requests_.fetch_add(1, std::memory_order_acq_rel) != 0) return;
  do {
    pump_requests_.store(1, std::memory_order_release);  // what came so far, this drain covers
    DrainQueue();
  } while (pump_requests_.fetch_sub(1, std::memory_order_acq_rel) != 1);
}

void Dispatcher::DrainQueue() {
  while (!closed_.load()) {
    auto t = queue_.TryPop();
    if (!t) break;
    if (!Bulkable(*t)) {
      Dispatch(std::move(*t));
      continue;
    }
    const bool pull = IsPullOnly(t->request.op);
    const BulkingOptions& b = bulking_;
    const int64_t max_bytes = pull ? b.pull_max_bytes : b.push_max_bytes;
    const int32_t max_count = pull ? b.pull_max_count : b.push_max_count;
    // Push direction: what goes up (headers + payloads); pull direction: what comes back.
    auto cost = [pull](const SliceTask& x) {
      return pull ? x.slice_bytes
                  : static_cast<int64_t>(wire::kRequestHeaderBytes + PayloadBytes(x.request));
    };
    std::vector<SliceTask> bulk;
    int64_t bytes = cost(*t);
    const int32_t server = t->server;
    bulk.push_back(std::move(*t));
    while (static_cast<int32_t>(bulk.size()) < max_count) {
      auto next = queue_.TryPopIf([&](const SliceTask& x) {
        return x.server == server && Bulkable(x) && IsPullOnly(x.request.op) == pull &&
               bytes + cost(x) <= max_bytes;
      });
      if (!next) break;
      bytes += cost(*next);
      bulk.push_back(std::move(*next));
    }
    if (bulk.size() == 1) {
      Dispatch(std::move(bulk.front()));
    } else {
      DispatchBulk(std::move(bulk));
    }
  }
  series_.SampleQueue(queue_.queued(), queue_.in_flight());
  slice_metrics_.SetDepth(queue_.queued_by_band());
}

// Frees the place once: on the first of "sent" and any reply.
std::function<void()> Dispatcher::PlaceReleaser() {
  auto released = std::make_shared<std::atomic<bool>>(false);
  return [this, released] {
    if (released->exchange(true)) return;
    queue_.Release();
    Pump();
  };
}

SliceReply Dispatcher::ReplyFor(const SliceTask& task, std::function<void()> release) {
  auto op = task.op;
  const size_t part = task.part;
  float* out = task.out;
  const uint32_t slice = task.request.slice;
  const int32_t server = task.server;
  // Bytes that went up: a compressed push counts its 2-bit frame.
  const uint64_t push_bytes = PayloadBytes(task.request);
  // The 2-bit frame stays alive until the reply ran (the transport holds its own reference
  // until the bytes were sent).
  auto encoded = task.request.encoded;
  // Bytes expected back: the slice (pull/pushpull), else none.
  const int64_t want = out != nullptr ? task.slice_bytes : 0;
  const auto dispatched = SliceClock::now();
  const bool accepts_packed = wire::AcceptsPacked(task.request.op);
  return [this, op, part, out, want, slice, server, push_bytes, release = std::move(release),
          dispatched, encoded = std::move(encoded), accepts_packed](const Status& s,
                                                                     const Payload& p) {
    auto where = [&] {
      return op->what + ": slice " + std::to_string(slice) + " on server " +
             std::to_string(server) + " (" + servers_.address(server) + "): ";
    };
    if (!s.ok()) {
      op->Complete(Status(s.code(), where() + s.message()));
    } else if (p.packed) {
      std::vector<uint8_t> scratch;
      auto view = ParsePackedAnswer(p, out != nullptr && accepts_packed, want, &scratch);
      if (!view.ok()) {
        op->Complete(DataLossError(where() + view.status().message()));
      } else {
        Answered(dispatched, push_bytes);
        op->PartDone(part, [&] {
          UnpackParsedSum(*view, out);
          Pulled(p.bytes);
          compression_.CountPackedAnswer(static_cast<uint64_t>(want), p.bytes);
        });
      }
    } else if (out != nullptr && p.bytes != static_cast<size_t>(want)) {
      op->Complete(DataLossError(op->what + ": slice " + std::to_string(slice) + " on server " +
                                 std::to_string(server) + " answered " +
                                 std::to_string(p.bytes) + " bytes, expected " +
                                 std::to_string(want)));
    } else {
      Answered(dispatched, push_bytes);
      op->PartDone(part, [&] {
        if (out != nullptr) {
          if (!p.in_place) wire::CopyOut(*p.chunks, p.offset, p.bytes, out);
          Pulled(p.bytes);
        }
      });
    }
    release();
  };
}

void Dispatcher::Answered(SliceClock::time_point dispatched, uint64_t push_bytes) {
  slice_metrics_.ObserveRoundTrip(SecondsBetween(dispatched, SliceClock::now()));
  bytes_pushed_.fetch_add(push_bytes);
  if (ledger_ != nullptr) ledger_->AddPushed(push_bytes);
  series_.BytesPushed(push_bytes);
}

void Dispatcher::Pulled(uint64_t bytes) {
  bytes_pulled_.fetch_add(bytes);
  if (ledger_ != nullptr) ledger_->AddPulled(bytes);
  series_.BytesPulled(bytes);
}

void Dispatcher::Dispatch(SliceTask task) {
  if (task.op->closed.load()) {  // failed or timed out meanwhile: do not send the rest
    queue_.Release();
    return;
  }
  auto release = PlaceReleaser();
  series_.SliceSent();
  const auto enqueued = task.enqueued;
  servers_.connection(task.server).Send(task.request, ReplyFor(task, release), [this, release, enqueued] {
    slice_metrics_.ObserveWait(SecondsBetween(enqueued, SliceClock::now()));
    release();
  });
}

void Dispatcher::DispatchBulk(std::vector<SliceTask> tasks) {
  std::erase_if(tasks, [](const SliceTask& t) { return t.op->closed.load(); });
  if (tasks.empty()) {
    queue_.Release();
    return;
  }
  if (tasks.size() == 1) {
    Dispatch(std::move(tasks.front()));
    return;
  }
  auto release = PlaceReleaser();
  std::vector<SliceRequest> requests;
  std::vector<SliceReply> replies;
  std::vector<SliceClock::time_point> enqueued;
  for (const SliceTask& t : tasks) {
    series_.SliceSent();
    requests.push_back(t.request);
    replies.push_back(ReplyFor(t, release));
    enqueued.push_back(t.enqueued);
  }
  bulks_sent_.fetch_add(1, std::memory_order_relaxed);
  slice_metrics_.CountBulk();
  servers_.connection(tasks.front().server).SendBulk(
      requests, std::move(replies), [this, release, enqueued = std::move(enqueued)] {
        const auto now = SliceClock::now();
        for (auto e : enqueued) slice_metrics_.ObserveWait(SecondsBetween(e, now));
        release();
      });
}

}  // namespace trellis
