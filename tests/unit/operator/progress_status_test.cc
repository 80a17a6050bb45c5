// status.progress and the Straggler and Stalled conditions from the scheduler's JobProgress.
#include "operator/progress_status.h"

#include <gtest/gtest.h>

#include "common/base/eta.h"

namespace trellis::op {
namespace {

v1::JobProgress Running(int32_t straggler) {
  v1::JobProgress p;
  p.set_reported(true);
  p.set_step(120);
  p.set_total_steps(1000);
  p.set_samples_per_second(1234.567);
  p.set_has_loss(true);
  p.set_loss(0.251234);
  p.set_eta_seconds(750.4);
  p.set_step_seconds(0.0853);
  p.set_slowest_rank(1);
  p.set_slowest_pod("mlp-worker-1");
  p.set_skew(7.51);
  p.set_straggler_rank(straggler);
  p.set_straggler_factor(2);
  p.set_straggler_window_seconds(30);
  for (int r = 0; r < 2; ++r) {
    auto* rp = p.add_ranks();
    rp->set_rank(r);
    rp->set_pod_name("mlp-worker-" + std::to_string(r));
    rp->set_busy_seconds(r == 1 ? 0.0751 : 0.01);
  }
  if (straggler >= 0) {
    p.set_straggler_pod("mlp-worker-" + std::to_string(straggler));
    p.set_straggler_for_seconds(31);
  }
  return p;
}

const Json* Condition(const Json& status, const std::string& type) {
  const Json* conds = At(status, {"conditions"});
  if (!conds) return nullptr;
  for (size_t i = 0; i < conds->size(); ++i) {
    if (Str(conds->at(i), {"type"}) == type) return &conds->at(i);
  }
  return nullptr;
}

TEST(FormatEtaTest, ReadableAtEveryScale) {
  EXPECT_EQ(FormatEta(0), "0s");
  EXPECT_EQ(FormatEta(45.4), "45s");
  EXPECT_EQ(FormatEta(750), "12m30s");
  EXPECT_EQ(FormatEta(3 * 3600 + 5 * 60 + 9), "3h05m");
  EXPECT_EQ(FormatEta(2 * 86400 + 4 * 3600), "2d04h");
  EXPECT_EQ(FormatEta(-1), "");
}

TEST(ProgressStatusTest, WritesRoundedProgress) {
  Json status = Json::object();
  const auto t0 = Clock::from_time_t(1'800'000'000);
  EXPECT_TRUE(ApplyProgress(status, Running(-1), t0));
  const Json& p = status["progress"];
  EXPECT_EQ(*Int(p, {"step"}), 120);
  EXPECT_EQ(*Int(p, {"totalSteps"}), 1000);
  EXPECT_DOUBLE_EQ(p.at("samplesPerSecond").as_double(), 1230);
  EXPECT_DOUBLE_EQ(p.at("loss").as_double(), 0.251);
  EXPECT_EQ(Str(p, {"eta"}), "12m30s");
  EXPECT_EQ(*Int(p, {"etaSeconds"}), 750);
  EXPECT_EQ(*Int(p, {"slowestRank"}), 1);
  EXPECT_EQ(Str(p, {"slowestPod"}), "mlp-worker-1");
  EXPECT_DOUBLE_EQ(p.at("skew").as_double(), 7.51);
  EXPECT_EQ(Condition(status, "Straggler"), nullptr) << "never a straggler: no condition at all";
  // The same figures again (or noise below the rounding): nothing to write.
  v1::JobProgress again = Running(-1);
  again.set_samples_per_second(1231.2);
  EXPECT_FALSE(ApplyProgress(status, again, t0 + std::chrono::seconds(5)));
}

TEST(ProgressStatusTest, StragglerConditionNamesRankAndPodThenClears) {
  Json status = Json::object();
  const auto t0 = Clock::from_time_t(1'800'000'000);
  ASSERT_TRUE(ApplyProgress(status, Running(1), t0));
  const Json* c = Condition(status, "Straggler");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Str(*c, {"status"}), "True");
  EXPECT_EQ(Str(*c, {"reason"}), "SlowWorker");
  EXPECT_NE(Str(*c, {"message"}).find("worker rank 1 (pod mlp-worker-1)"), std::string::npos)
      << Str(*c, {"message"});
  EXPECT_NE(Str(*c, {"message"}).find("7.5x"), std::string::npos) << Str(*c, {"message"});
  const std::string since = Str(*c, {"lastTransitionTime"});

  ASSERT_TRUE(ApplyProgress(status, Running(-1), t0 + std::chrono::seconds(10)));
  c = Condition(status, "Straggler");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Str(*c, {"status"}), "False");
  EXPECT_EQ(Str(*c, {"reason"}), "NoStraggler");
  EXPECT_NE(Str(*c, {"lastTransitionTime"}), since);
}

TEST(ProgressStatusTest, StalledConditionNamesTheStalledProgramThenClears) {
  Json status = Json::object();
  const auto t0 = Clock::from_time_t(1'800'000'000);
  v1::JobProgress p = Running(-1);
  p.add_stalled("server 1 (pod mlp-server-1) stalled: its program sent no liveness for 31.0 s "
                "(livenessTimeoutSeconds 30.0); being restarted");
  ASSERT_TRUE(ApplyProgress(status, p, t0));
  const Json* c = Condition(status, "Stalled");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Str(*c, {"status"}), "True");
  EXPECT_EQ(Str(*c, {"reason"}), "ProgramStalled");
  EXPECT_NE(Str(*c, {"message"}).find("server 1 (pod mlp-server-1) stalled"), std::string::npos)
      << Str(*c, {"message"});

  ASSERT_TRUE(ApplyProgress(status, Running(-1), t0 + std::chrono::seconds(10)));
  c = Condition(status, "Stalled");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Str(*c, {"status"}), "False");
  EXPECT_EQ(Str(*c, {"reason"}), "NoStall");
}

TEST(ProgressStatusTest, NothingReportedWritesNothing) {
  Json status = Json::object();
  v1::JobProgress none;
  none.set_slowest_rank(-1);
  none.set_straggler_rank(-1);
  none.set_eta_seconds(-1);
  EXPECT_FALSE(ApplyProgress(status, none, Clock::now()));
  EXPECT_EQ(At(status, {"progress"}), nullptr);
}

// status.checkpoint (the newest) and status.resumedFrom (where this run started) come from the
// scheduler; a scheduler that knows of none (replaced, or the job between runs) leaves them.
TEST(ProgressStatusTest, CheckpointsReachTheStatusAndStayWhileTheSchedulerKnowsNone) {
  Json status = Json::object();
  v1::JobProgress p;
  EXPECT_FALSE(ApplyCheckpoint(status, p));
  EXPECT_EQ(At(status, {"checkpoint"}), nullptr);
  p.mutable_checkpoint()->set_step(64);
  p.mutable_checkpoint()->set_path("/ckpt/model-000000000064.ckpt");
  p.mutable_checkpoint()->set_unix_ms(1'800'000'000'500);
  EXPECT_FALSE(ApplyCheckpoint(status, p)) << "no resume to tell of";
  EXPECT_EQ(Int(status, {"checkpoint", "step"}), 64);
  EXPECT_EQ(Str(status, {"checkpoint", "path"}), "/ckpt/model-000000000064.ckpt");
  EXPECT_EQ(Str(status, {"checkpoint", "time"}), FormatTime(Clock::from_time_t(1'800'000'000)));
  EXPECT_FALSE(Bool(status, {"checkpoint", "onExit"}, true));
  p.mutable_resumed_from()->set_step(32);
  p.mutable_resumed_from()->set_path("/ckpt/model-000000000032.ckpt");
  p.mutable_resumed_from()->set_unix_ms(1'800'000'000'000);
  EXPECT_TRUE(ApplyCheckpoint(status, p)) << "a resume: worth an Event";
  EXPECT_EQ(Int(status, {"resumedFrom", "step"}), 32);
  p.mutable_resumed_from()->set_unix_ms(1'800'000'060'000);  // the same resume, heard again
  EXPECT_FALSE(ApplyCheckpoint(status, p));
  const Json before = status;
  EXPECT_FALSE(ApplyCheckpoint(status, v1::JobProgress()));
  EXPECT_EQ(status, before);
}

}  // namespace
}  // namespace trellis::op
