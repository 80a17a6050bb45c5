#include "pserver/serving_queue.h"

#include <pthread.h>

#include <algorithm>
#include <cstdint>

namespace trellis {

ServingQueue::ServingQueue(ServingQueueOptions options) : options_(options) {
  int n = options_.threads > 0 ? options_.threads
                               : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 0; i < n; ++i) {
    pool_.emplace_back([this] {
      pthread_setname_np(pthread_self(), "pserver-pool");
      PoolLoop();
    });
  }
}

ServingQueue::~ServingQueue() { Stop(); }

void ServingQueue::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.SignalAll();
  for (auto& t : pool_) t.join();
  pool_.clear();
  std::priority_queue<Item> dropped;  // let go of outside the lock: a job may hold a strand
  MutexLock lock(&mu_);
  dropped.swap(queue_);
}

bool ServingQueue::Submit(int32_t priority, size_t payload_bytes, Job job, Inline policy) {
  {
    MutexLock lock(&mu_);
    if (stopping_) return false;
    const bool too_big = policy == Inline::kSmallOnly && payload_bytes > options_.inline_max_bytes;
    if (held_ || !queue_.empty() || too_big) {
      queue_.push(Item{priority, seq_++, std::move(job)});
      cv_.Signal();
      return true;
    }
  }
  job();  // small and nothing waiting: no hand-off
  return true;
}

void ServingQueue::PoolLoop() {
  MutexLock lock(&mu_);
  while (true) {
    while (!stopping_ && (held_ || queue_.empty())) cv_.Wait(&mu_);
    if (stopping_) return;
    Job job = std::move(const_cast<Item&>(queue_.top()).value);
    queue_.pop();
    lock.Unlock();
    job();
    job = nullptr;  // what the job held (request bytes, a connection) goes before the next wait
    lock.Lock();
  }
}

namespace {
// The strand's turn in the queue. A turn the queue drops unrun (it stopped) clears the strand:
// no turn will come for what waits there, and its jobs may hold the strand's owner.
struct Turn {
  explicit Turn(std::shared_ptr<ServingStrand> s) : strand(std::move(s)) {}
  ~Turn() {
    if (!ran) strand->Clear();
  }
  const std::shared_ptr<ServingStrand> strand;
  bool ran = false;
};
}  // namespace

ServingQueue::Job ServingStrand::NextTurn() {
  auto turn = std::make_shared<Turn>(shared_from_this());
  return [turn] {
    turn->ran = true;
    turn->strand->RunOne();
  };
}

bool ServingStrand::Submit(int32_t priority, size_t payload_bytes, ServingQueue::Job job,
                           ServingQueue::Inline policy) {
  {
    MutexLock lock(&mu_);
    waiting_.push(Item{priority, seq_++, std::move(job)});
  }
  // Stopped: the turn, dropped, cleared the strand.
  return queue_->Submit(priority, payload_bytes, NextTurn(), policy);
}

void ServingStrand::Clear() {
  std::priority_queue<Item> dropped;
  MutexLock lock(&mu_);
  dropped.swap(waiting_);
}

void ServingStrand::RunOne() {
  ServingQueue::Job job;
  {
    MutexLock lock(&mu_);
    if (busy_) {
      ++deferred_;  // the running one hands on
      return;
    }
    if (waiting_.empty()) return;  // cleared
    busy_ = true;
    job = std::move(const_cast<Item&>(waiting_.top()).value);
    waiting_.pop();
  }
  job();
  job = nullptr;  // what it held goes before the next one is handed on
  int32_t next = 0;
  {
    MutexLock lock(&mu_);
    busy_ = false;
    if (deferred_ == 0 || waiting_.empty()) return;
    --deferred_;
    next = waiting_.top().priority;
  }
  // Queued, never run here: a strand's backlog is served by the pool, not by recursion.
  (void)queue_->Submit(next, SIZE_MAX, NextTurn());
}

}  // namespace trellis
