// The parameter server's one serving queue, under both transports (the gRPC stream,
// pserver/data_service.h, and the TCP listener, pserver/tcp_data_server.h): requests that wait
// are served highest priority first, FIFO within a priority, by a small pool ("pserver-pool",
// one thread per core by default). A small request with nothing waiting is served on the
// transport's own thread (no hand-off latency): nothing it could overtake is queued. So is a
// request of any size when its transport saw nothing more arrive behind it (Inline::kAnySize):
// the thread would only wait for the pool otherwise, and each hand-off costs a wake-up.
//
// The queue holds what the transports have read; each transport bounds what one connection may
// have in it (gRPC: its flow control per message; TCP: a per-connection budget), so a peer that
// sends many requests is slowed by its own socket, not by the server's memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <queue>
#include <thread>
#include <vector>

#include "common/base/by_priority.h"
#include "common/base/mutex.h"
#include "datapath/link.h"

namespace trellis {

using link::ReadAhead;
using link::ReadAheadLimit;

struct ServingQueueOptions {
  int threads = 0;                     // 0: one per core
  size_t inline_max_bytes = 64 << 10;  // serve payloads up to this size inline when idle
};

class ServingQueue {
 public:
  using Job = std::function<void()>;
  // Which requests Submit may serve on the caller's thread when nothing waits.
  enum class Inline {
    kSmallOnly,  // payloads up to ServingQueueOptions::inline_max_bytes
    kAnySize,    // any: the caller's link holds nothing more to read (nothing to overtake)
  };

  explicit ServingQueue(ServingQueueOptions options);
  ~ServingQueue();  // Stop()
  ServingQueue(const ServingQueue&) = delete;
  ServingQueue& operator=(const ServingQueue&) = delete;

  // Runs `job` (a request of `payload_bytes`): on the caller's thread when nothing waits, the
  // queue is not held and `policy` allows the size; else queued by `priority`. False after
  // Stop() (`job` is dropped unrun: the caller answers UNAVAILABLE). Thread-safe.
  bool Submit(int32_t priority, size_t payload_bytes, Job job,
              Inline policy = Inline::kSmallOnly) EXCLUDES(mu_);

  // Stops the pool (jobs still queued are dropped unrun); idempotent.
  void Stop() EXCLUDES(mu_);

 private:
  // Holds the serving and counts what waits (tests/unit/pserver/serving_queue_peer.h).
  friend class ServingQueueTestPeer;

  using Item = ByPriority<Job>;
  void PoolLoop() EXCLUDES(mu_);

  const ServingQueueOptions options_;
  mutable Mutex mu_;
  CondVar cv_;  // a job queued, or stopping
  std::priority_queue<Item> queue_ GUARDED_BY(mu_);
  uint64_t seq_ GUARDED_BY(mu_) = 0;
  bool held_ GUARDED_BY(mu_) = false;  // tests only: every Submit queues, none runs
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> pool_;  // started by the constructor, joined by Stop
};

// One connection's requests, served one at a time through a ServingQueue, highest priority
// first (FIFO within a priority): the TCP listener keeps serving a connection in its arrival
// order where priorities tie, as when it served inline, while what waits is served by
// priority. Each request is one job in the queue (so it competes with every other connection
// by its priority); a job that finds the strand busy leaves its request to the one in service,
// which hands the strand on when it is done.
class ServingStrand : public std::enable_shared_from_this<ServingStrand> {
 public:
  explicit ServingStrand(ServingQueue* queue) : queue_(queue) {}

  // As ServingQueue::Submit; `job` runs after every higher-priority (and earlier equal-priority)
  // job of this strand, never beside one.
  bool Submit(int32_t priority, size_t payload_bytes, ServingQueue::Job job,
              ServingQueue::Inline policy = ServingQueue::Inline::kSmallOnly) EXCLUDES(mu_);
  // Drops the jobs not started (shutdown: what they hold is released). The queue's Stop does it
  // too, for a strand with jobs waiting.
  void Clear() EXCLUDES(mu_);

 private:
  using Item = ByPriority<ServingQueue::Job>;
  ServingQueue::Job NextTurn();  // a job that runs RunOne, or clears the strand if dropped
  void RunOne() EXCLUDES(mu_);

  ServingQueue* const queue_;
  Mutex mu_;
  std::priority_queue<Item> waiting_ GUARDED_BY(mu_);
  uint64_t seq_ GUARDED_BY(mu_) = 0;
  bool busy_ GUARDED_BY(mu_) = false;  // a job of this strand is running
  size_t deferred_ GUARDED_BY(mu_) = 0;  // jobs that found it busy
};

}  // namespace trellis
