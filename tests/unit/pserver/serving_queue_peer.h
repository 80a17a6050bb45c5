// A test's hand on a ServingQueue (pserver/serving_queue.h): hold its serving, so that requests
// that arrive meanwhile all wait in it, and count them.
#pragma once

#include <cstddef>

#include "pserver/serving_queue.h"

namespace trellis {

class ServingQueueTestPeer {
 public:
  explicit ServingQueueTestPeer(ServingQueue* queue) : q_(queue) {}

  // While held no job starts: every Submit queues (none runs on the caller's thread) and the
  // pool waits, until Release() lets it serve them.
  void Hold() {
    MutexLock lock(&q_->mu_);
    q_->held_ = true;
  }
  void Release() {
    {
      MutexLock lock(&q_->mu_);
      q_->held_ = false;
    }
    q_->cv_.SignalAll();
  }
  size_t Queued() const {  // jobs waiting
    MutexLock lock(&q_->mu_);
    return q_->queue_.size();
  }

 private:
  ServingQueue* const q_;
};

}  // namespace trellis
