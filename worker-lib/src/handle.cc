#include "worker-lib/src/op_state.h"

#include <thread>

namespace trellis {

void Handle::State::Complete(const Status& st) {
  Callback cb;
  {
    std::unique_lock dl(data_mu);  // waits for copies in progress
    MutexLock lock(&mu);
    if (closed.load()) return;
    status = st;
    closed.store(true);
    cb = std::move(callback);
  }
  if (cb) cb(st);
  {
    MutexLock lock(&mu);
    done.store(true);
  }
  cv.SignalAll();
}

int64_t Handle::State::FirstPending() {
  MutexLock lock(&mu);
  for (size_t i = 0; i < part_done.size(); ++i) {
    if (!part_done[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

Handle FailedHandle(const Status& st, Callback done) {
  auto state = std::make_shared<Handle::State>();
  state->SetCallback(std::move(done));
  state->Complete(st);
  return Handle(std::move(state));
}

Status CheckBroadcastRoot(KeyId key, int root, int size) {
  if (root >= 0 && root < size) return Status::Ok();
  return InvalidArgumentError("Broadcast key " + std::to_string(key) + ": root " +
                              std::to_string(root) + " outside [0, " + std::to_string(size) +
                              ")");
}

Handle::Handle() : state_(std::make_shared<State>()) {
  state_->closed.store(true);
  state_->done.store(true);
}

Handle::Handle(std::shared_ptr<State> state) : state_(std::move(state)) {}

namespace {

// Whether spinning can help: on one CPU the spinner only delays the thread that completes it.
bool HostHasCoresToSpin() {
  static const bool many = std::thread::hardware_concurrency() > 1;
  return many;
}

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

Status Handle::Wait() const {
  if (!state_) return Status::Ok();
  State& s = *state_;
  if (s.done.load()) {  // nothing to wait for, nothing counted in wait_ns
    MutexLock lock(&s.mu);
    return s.status;
  }
  const auto start = State::Clock::now();
  if (s.spin_before_blocking && HostHasCoresToSpin()) {
    const auto until = start + State::kWaitSpin;
    while (!s.done.load(std::memory_order_acquire) && State::Clock::now() < until) CpuRelax();
  }
  MutexLock lock(&s.mu);
  while (!s.done.load()) s.cv.Wait(&s.mu);
  if (s.wait_ns) {
    s.wait_ns->fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(State::Clock::now() - start).count(),
        std::memory_order_relaxed);
  }
  return s.status;
}

bool Handle::Done() const { return !state_ || state_->done.load(); }

Worker::~Worker() = default;

}  // namespace trellis
