// ProgressReporter: ReportProgress per step, one batched report per interval, busy time net of
// the time blocked in Trellis waits, the last batch sent at the end.
#include "worker-lib/src/progress_reporter.h"

#include <cmath>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace trellis {
namespace {

using std::chrono::milliseconds;

struct Sink {
  std::mutex mu;
  std::vector<v1::ReportProgressRequest> sent;  // GUARDED_BY(mu)
  ProgressReporter::Send fn() {
    return [this](const v1::ReportProgressRequest& r) {
      std::lock_guard lock(mu);
      sent.push_back(r);
      return Status::Ok();
    };
  }
};

TEST(ProgressReporterTest, BatchesStepsIntoFewReports) {
  Sink sink;
  std::atomic<int64_t> wait_ns{0};
  {
    ProgressReporter r(3, 2, sink.fn(), &wait_ns, milliseconds(200));
    ASSERT_TRUE(r.SetTotalSteps(500).ok());
    for (int step = 0; step <= 200; ++step) {
      ASSERT_TRUE(r.Report(step, 32, step == 200 ? 0.5 : std::nan("")).ok());
      std::this_thread::sleep_for(milliseconds(2));
    }
  }  // the destructor sends what is left
  std::lock_guard lock(sink.mu);
  ASSERT_FALSE(sink.sent.empty());
  // 200 timed steps of >= 2 ms: >= 400 ms, so a few reports -- never one per step.
  EXPECT_LE(sink.sent.size(), 20u);
  int64_t steps = 0, samples = 0;
  double seconds = 0;
  for (const auto& s : sink.sent) {
    EXPECT_EQ(s.rank(), 3);
    EXPECT_EQ(s.incarnation(), 2);
    EXPECT_EQ(s.total_steps(), 500);
    EXPECT_GE(s.steps(), 1);
    EXPECT_LE(s.busy_seconds(), s.seconds() + 1e-9);
    steps += s.steps();
    samples += s.samples();
    seconds += s.seconds();
  }
  EXPECT_EQ(steps, 200);  // the first report only starts the clock
  EXPECT_EQ(samples, 200 * 32);
  EXPECT_GE(seconds, 0.4);
  EXPECT_EQ(sink.sent.back().step(), 200);
  EXPECT_TRUE(sink.sent.back().has_loss());
  EXPECT_EQ(sink.sent.back().loss(), 0.5);
}

TEST(ProgressReporterTest, BusyTimeExcludesWaits) {
  Sink sink;
  std::atomic<int64_t> wait_ns{0};
  {
    ProgressReporter r(0, 1, sink.fn(), &wait_ns, milliseconds(10000));
    ASSERT_TRUE(r.Report(0, 0, std::nan("")).ok());
    for (int step = 1; step <= 5; ++step) {
      std::this_thread::sleep_for(milliseconds(20));
      wait_ns += 15'000'000;  // 15 ms of each 20 ms step "blocked in Wait"
      ASSERT_TRUE(r.Report(step, 0, std::nan("")).ok());
    }
  }
  std::lock_guard lock(sink.mu);
  ASSERT_EQ(sink.sent.size(), 1u);  // one interval never passed: the final flush only
  const auto& s = sink.sent[0];
  EXPECT_EQ(s.steps(), 5);
  EXPECT_GE(s.seconds(), 0.1);
  EXPECT_NEAR(s.busy_seconds(), s.seconds() - 0.075, 1e-6);
  EXPECT_FALSE(s.has_loss());
}

TEST(ProgressReporterTest, RefusesNegativesAndNeedsNoScheduler) {
  ProgressReporter none(0, 1, nullptr, nullptr);
  EXPECT_EQ(none.Report(-1, 0, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(none.Report(1, -5, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(none.SetTotalSteps(-1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(none.Report(1, 10, 1.0).ok());  // recorded, dropped: no thread, no send
  EXPECT_TRUE(none.Report(2, 10, 1.0).ok());
  EXPECT_EQ(none.reports_sent(), 0);
}

TEST(ProgressReporterTest, AFailingSchedulerNeverBlocksTheExit) {
  std::atomic<int> calls{0};
  {
    ProgressReporter r(0, 1, [&](const v1::ReportProgressRequest&) {
      ++calls;
      return UnavailableError("scheduler gone");
    }, nullptr, milliseconds(20));
    for (int step = 0; step < 50; ++step) {
      ASSERT_TRUE(r.Report(step, 1, std::nan("")).ok());
      std::this_thread::sleep_for(milliseconds(2));
    }
    EXPECT_EQ(r.reports_sent(), 0);
  }
  EXPECT_GE(calls.load(), 1);
}

}  // namespace
}  // namespace trellis
