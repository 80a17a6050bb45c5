// Handle::State: one asynchronous operation (PushPull, Push, Pull, Broadcast) made of slices.
//
// Completion happens once: when the last slice is answered (OK), at the first slice error, or
// when the watchdog sees the deadline pass (DEADLINE_EXCEEDED). Answers copy into the user's
// `out` under a shared lock and completion takes it exclusively, so no byte lands in `out`
// after the handle completed (the user may free it then).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <cstdint>
#include <shared_mutex>
#include <string>
#include <vector>

#include "common/base/mutex.h"
#include "trellis/trellis.h"

namespace trellis {

struct Handle::State {
  using Clock = std::chrono::steady_clock;

  // Operations of at most this many bytes per direction may spin in Wait(), for at most kWaitSpin.
  static constexpr int64_t kSpinMaxBytes = 64 << 10;
  static constexpr std::chrono::microseconds kWaitSpin{50};

  // Immutable after creation, but `deadline`: the watchdog moves it while a member of the job is
  // being restarted (only the watchdog reads or writes it after Launch).
  std::string what;  // "PushPull key 3 (fc1.weight) step 5"
  Clock::time_point deadline;
  bool extended = false;  // the watchdog moved the deadline once already (logged once)
  std::vector<uint32_t> slice_index;  // per part: the key's slice number
  std::vector<int32_t> slice_server;  // per part: its server
  // Where Wait() adds the time it waited, polling or blocked (the worker's wait total, for
  // ReportProgress's busy time); null: not counted. Shared: a handle may outlive its worker.
  std::shared_ptr<std::atomic<int64_t>> wait_ns;
  // A small operation, answered within tens of microseconds: Wait() polls `done` for up to
  // kWaitSpin before it blocks. On an idle host a blocked waiter's wake-up crosses a core that
  // went to sleep (on a VM, an exit to the hypervisor): it doubled a 4 KiB round trip.
  bool spin_before_blocking = false;

  std::atomic<int64_t> remaining{0};
  // closed: the outcome is decided, no more copies into `out` (set under data_mu exclusive).
  // done: the callback has run and waiters may go (so its effects are visible after Wait()).
  std::atomic<bool> closed{false};
  std::atomic<bool> done{false};

  // Shared: a copy into `out` in progress; exclusive: completing. A std::shared_mutex, not an
  // annotated lock: it guards the user's buffer, no member, and the transport holds it too
  // (SliceRequest::out_mu).
  std::shared_mutex data_mu;
  Mutex mu;  // taken inside data_mu when both are held (Complete)
  CondVar cv;
  Status status GUARDED_BY(mu);
  Callback callback GUARDED_BY(mu);
  std::vector<char> part_done GUARDED_BY(mu);

  // Before the operation is shared: what runs when it completes, and how many parts it has.
  void SetCallback(Callback cb) EXCLUDES(mu) {
    MutexLock lock(&mu);
    callback = std::move(cb);
  }
  void ExpectParts(size_t n) EXCLUDES(mu) {
    {
      MutexLock lock(&mu);
      part_done.assign(n, 0);
    }
    remaining.store(static_cast<int64_t>(n));
  }
  // First call wins; runs the callback (outside the locks), then wakes Wait().
  void Complete(const Status& st) EXCLUDES(mu);
  // Part `i` answered: `copy` (may be empty) writes the payload into the user's buffer unless
  // the operation already completed.
  template <typename CopyFn>
  void PartDone(size_t i, CopyFn copy) EXCLUDES(mu) {
    {
      std::shared_lock dl(data_mu);
      if (closed.load()) return;
      copy();
    }
    {
      MutexLock lock(&mu);
      part_done[i] = 1;
    }
    if (remaining.fetch_sub(1) == 1) Complete(Status::Ok());
  }
  // The first part not answered yet, or -1.
  int64_t FirstPending() EXCLUDES(mu);
};

// An operation that failed before it started: completed with `st`, `done` already called.
Handle FailedHandle(const Status& st, Callback done);

// INVALID_ARGUMENT naming the key when `root` is not a rank of a job of `size` workers.
Status CheckBroadcastRoot(KeyId key, int root, int size);

}  // namespace trellis
