// Time behind a small interface so tests drive heartbeat timeouts and wait deadlines by hand.
#pragma once

#include <atomic>
#include <chrono>

namespace trellis {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

class SteadyClock : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

// A clock that moves only when told to (tests).
class ManualClock : public Clock {
 public:
  TimePoint Now() const override { return TimePoint(std::chrono::nanoseconds(now_ns_.load())); }
  void Advance(std::chrono::nanoseconds d) { now_ns_ += d.count(); }

 private:
  std::atomic<int64_t> now_ns_{1'000'000'000};
};

// A duration in seconds, for log lines and answers.
inline double Seconds(Clock::TimePoint::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace trellis
