// ProgressTracker: the job's step, samples/s, loss and ETA from the workers' batched reports,
// the slowest rank and its skew, and a straggler only after `window` above factor x median.
#include "scheduler/progress_tracker.h"

#include <gtest/gtest.h>

namespace trellis {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

v1::ReportProgressRequest Rep(int32_t rank, int64_t step, double step_s, double busy_s,
                              int64_t samples_per_step = 32, int64_t steps = 10) {
  v1::ReportProgressRequest r;
  r.set_rank(rank);
  r.set_incarnation(1);
  r.set_step(step);
  r.set_steps(steps);
  r.set_seconds(step_s * static_cast<double>(steps));
  r.set_busy_seconds(busy_s * static_cast<double>(steps));
  r.set_samples(samples_per_step * steps);
  return r;
}

v1::ClusterView View(int workers) {
  v1::ClusterView v;
  v.set_num_workers(workers);
  for (int i = 0; i < workers; ++i) {
    auto* n = v.add_workers();
    n->set_rank(i);
    n->set_pod_name("job-worker-" + std::to_string(i));
  }
  return v;
}

class ProgressTrackerTest : public ::testing::Test {
 protected:
  ProgressTracker Make(int workers, double factor = 2.0, milliseconds window = seconds(10)) {
    ProgressOptions o;
    o.straggler_factor = factor;
    o.straggler_window = window;
    o.judge_interval = milliseconds(0);
    return ProgressTracker(o, workers, &clock_);
  }
  ManualClock clock_;
};

TEST_F(ProgressTrackerTest, NothingReportedYet) {
  auto t = Make(2);
  v1::JobProgress p = t.Snapshot(View(2));
  EXPECT_FALSE(p.reported());
  EXPECT_EQ(p.slowest_rank(), -1);
  EXPECT_EQ(p.straggler_rank(), -1);
  EXPECT_EQ(p.eta_seconds(), -1);
  EXPECT_EQ(p.straggler_factor(), 2.0);
  EXPECT_EQ(p.straggler_window_seconds(), 10.0);
}

TEST_F(ProgressTrackerTest, AggregatesStepRateLossAndEta) {
  auto t = Make(3);
  auto r0 = Rep(0, 100, 0.1, 0.05);
  r0.set_total_steps(1000);
  r0.set_has_loss(true);
  r0.set_loss(2.5);
  ASSERT_TRUE(t.Report(r0).ok());
  ASSERT_TRUE(t.Report(Rep(1, 98, 0.1, 0.06)).ok());
  auto r2 = Rep(2, 101, 0.2, 0.07);
  r2.set_has_loss(true);
  r2.set_loss(1.25);  // the latest loss wins
  ASSERT_TRUE(t.Report(r2).ok());
  v1::JobProgress p = t.Snapshot(View(3));
  ASSERT_TRUE(p.reported());
  EXPECT_EQ(p.step(), 98);         // the lowest rank's step
  EXPECT_EQ(p.median_step(), 100);
  EXPECT_EQ(p.total_steps(), 1000);
  // 32 samples per step: 320/s + 320/s + 160/s.
  EXPECT_NEAR(p.samples_per_second(), 800.0, 1e-6);
  EXPECT_TRUE(p.has_loss());
  EXPECT_EQ(p.loss(), 1.25);
  EXPECT_NEAR(p.step_seconds(), 0.1, 1e-9);
  EXPECT_NEAR(p.eta_seconds(), (1000 - 98) * 0.1, 1e-6);
  EXPECT_EQ(p.slowest_rank(), 2);
  EXPECT_EQ(p.slowest_pod(), "job-worker-2");
  // 0.07 against the lower median of 0.05 and 0.06.
  EXPECT_NEAR(p.skew(), 0.07 / 0.05, 1e-9);
  EXPECT_EQ(p.straggler_rank(), -1);  // 1.4x is below the factor
  ASSERT_EQ(p.ranks_size(), 3);
  EXPECT_EQ(p.ranks(1).step(), 98);
  EXPECT_TRUE(p.ranks(1).live());
}

TEST_F(ProgressTrackerTest, StragglerOnlyAfterTheWindowAndNamesThePod) {
  auto t = Make(4, 2.0, seconds(10));
  auto round = [&](double slow_busy) {
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(t.Report(Rep(r, 50, 0.2, r == 3 ? slow_busy : 0.02)).ok());
    }
  };
  round(0.19);
  v1::JobProgress p = t.Snapshot(View(4));
  EXPECT_EQ(p.slowest_rank(), 3);
  EXPECT_NEAR(p.skew(), 0.19 / 0.02, 1e-9);
  EXPECT_EQ(p.straggler_rank(), -1) << "above, but not for the window yet";
  for (int i = 0; i < 9; ++i) {
    clock_.Advance(seconds(1));
    round(0.19);
  }
  EXPECT_EQ(t.Snapshot(View(4)).straggler_rank(), -1);  // 9 s of 10
  clock_.Advance(seconds(1));
  round(0.19);
  p = t.Snapshot(View(4));
  EXPECT_EQ(p.straggler_rank(), 3);
  EXPECT_EQ(p.straggler_pod(), "job-worker-3");
  EXPECT_GE(p.straggler_for_seconds(), 10.0);
  EXPECT_GE(p.ranks(3).slow_for_seconds(), 10.0);

  // One report back within the factor ends it, and the window starts over.
  clock_.Advance(seconds(1));
  round(0.03);
  EXPECT_EQ(t.Snapshot(View(4)).straggler_rank(), -1);
  clock_.Advance(seconds(1));
  round(0.19);
  EXPECT_EQ(t.Snapshot(View(4)).straggler_rank(), -1);
}

TEST_F(ProgressTrackerTest, TwoWorkersCompareEachAgainstTheOther) {
  auto t = Make(2, 2.0, seconds(1));
  ASSERT_TRUE(t.Report(Rep(0, 10, 0.1, 0.001)).ok());
  ASSERT_TRUE(t.Report(Rep(1, 10, 0.1, 0.099)).ok());
  clock_.Advance(seconds(2));
  ASSERT_TRUE(t.Report(Rep(0, 20, 0.1, 0.001)).ok());
  ASSERT_TRUE(t.Report(Rep(1, 20, 0.1, 0.099)).ok());
  EXPECT_EQ(t.Snapshot(View(2)).straggler_rank(), 1);
}

TEST_F(ProgressTrackerTest, TinyDifferencesAreNotStragglers) {
  // 40 us against 10 us is 4x, but below the 5 ms floor: jitter, not a straggler.
  auto t = Make(2, 2.0, seconds(1));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(t.Report(Rep(0, 10, 0.001, 0.00001)).ok());
    ASSERT_TRUE(t.Report(Rep(1, 10, 0.001, 0.00004)).ok());
    clock_.Advance(seconds(1));
  }
  EXPECT_EQ(t.Snapshot(View(2)).straggler_rank(), -1);
}

TEST_F(ProgressTrackerTest, ExitedDeadAndSilentRanksAreNotLive) {
  auto t = Make(3, 2.0, seconds(1));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(t.Report(Rep(0, 10, 0.1, 0.01)).ok());
    ASSERT_TRUE(t.Report(Rep(1, 10, 0.1, 0.01)).ok());
    ASSERT_TRUE(t.Report(Rep(2, 10, 0.1, 0.09)).ok());
    clock_.Advance(seconds(1));
  }
  v1::ClusterView view = View(3);
  EXPECT_EQ(t.Snapshot(view).straggler_rank(), 2);
  view.mutable_workers(2)->set_exited(true);
  v1::JobProgress p = t.Snapshot(view);
  EXPECT_EQ(p.straggler_rank(), -1);
  EXPECT_FALSE(p.ranks(2).live());
  EXPECT_EQ(p.step(), 10);  // its step still counts
  EXPECT_NEAR(p.samples_per_second(), 640.0, 1e-6);
  // Silent past stale_after (15 s): not live either.
  clock_.Advance(seconds(20));
  p = t.Snapshot(View(3));
  EXPECT_EQ(p.samples_per_second(), 0);
  EXPECT_EQ(p.slowest_rank(), -1);
}

TEST_F(ProgressTrackerTest, EtaUnknownWithoutTotalAndZeroAtTheEnd) {
  auto t = Make(1);
  ASSERT_TRUE(t.Report(Rep(0, 10, 0.1, 0.1)).ok());
  EXPECT_EQ(t.Snapshot(View(1)).eta_seconds(), -1);
  auto r = Rep(0, 500, 0.1, 0.1);
  r.set_total_steps(500);
  ASSERT_TRUE(t.Report(r).ok());
  v1::JobProgress p = t.Snapshot(View(1));
  EXPECT_EQ(p.eta_seconds(), 0);
  EXPECT_EQ(p.skew(), 0);  // one worker: nothing to compare with
  EXPECT_EQ(p.straggler_rank(), -1);
}

TEST_F(ProgressTrackerTest, BadReportsAreRefusedAndOldIncarnationsIgnored) {
  auto t = Make(2);
  EXPECT_EQ(t.Report(Rep(2, 1, 0.1, 0.1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Report(Rep(-1, 1, 0.1, 0.1)).code(), StatusCode::kInvalidArgument);
  auto r = Rep(0, 1, 0.1, 0.1);
  r.set_steps(0);
  EXPECT_EQ(t.Report(r).code(), StatusCode::kInvalidArgument);
  r = Rep(0, 1, 0.1, 0.1);
  r.set_seconds(std::numeric_limits<double>::infinity());
  EXPECT_EQ(t.Report(r).code(), StatusCode::kInvalidArgument);
  r = Rep(0, 1, 0.1, 0.1);
  r.set_has_loss(true);
  r.set_loss(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(t.Report(r).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(t.Snapshot(View(2)).reported());

  auto now = Rep(0, 40, 0.1, 0.1);
  now.set_incarnation(2);
  ASSERT_TRUE(t.Report(now).ok());
  auto old = Rep(0, 7, 0.1, 0.1);  // incarnation 1: a report from before the restart
  ASSERT_TRUE(t.Report(old).ok());
  EXPECT_EQ(t.Snapshot(View(2)).ranks(0).step(), 40);
}

}  // namespace
}  // namespace trellis
