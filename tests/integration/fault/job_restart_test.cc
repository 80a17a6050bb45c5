// Whole-job restart (issue 35 part 4; docs/checkpoints.md#whole-job-restart): every worker's
// program of a trellis-mlp job under trellis-launch SIGKILLed at once mid-training. No worker is
// left to hand the model to the restarted programs, so in-job recovery cannot heal it: the
// scheduler fails the job at the first rejoin, saying why. Under runPolicy.failurePolicy
// RestartJob, trellis-launch then stops every process and starts the whole job again; rank 0
// resumes from the newest checkpoint and the job ends as an undisturbed run does (aggregate
// mode, deterministic data: the same final weights and momentum, bit for bit).
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <regex>

#include <gtest/gtest.h>

#include "common/checkpoint/checkpoint_dir.h"
#include "tests/integration/fault/mlp_outcome.h"
#include "tests/integration/job_processes.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

constexpr int kSteps = 3 * 128;
constexpr int kKillAfter = 160;

std::string JobYaml(const std::string& name, const std::string& ckpt, bool restart_job) {
  MlpJob j;
  j.worker_restart = "OnFailure";
  j.checkpoint = ckpt;
  j.interval_steps = 32;
  j.rank0_step_sleep_ms = 5;  // training still runs when both kills land
  if (restart_job) j.run_policy += "    failurePolicy: RestartJob\n";
  return MlpJobYaml(name, j);
}

class JobRestartTest : public LaunchedJobsTest {
 protected:
  // Runs the job to its end (bounded); with `kill`, SIGKILLs both workers' programs at once
  // once a checkpoint at or after kKillAfter exists. Returns trellis-launch's exit code.
  int Run(const std::string& job, bool restart_job, bool kill, std::string* out, int* killed_after) {
    jobs_.push_back(job);
    const std::string ckpt = dir_ + "/ckpt-" + job;
    auto p = StartLaunch(TRELLIS_BIN_DIR, dir_, job, JobYaml(job, ckpt, restart_job));
    if (!p.ok()) {
      *out = p.status().ToString();
      return -1;
    }
    CheckpointDir dir(ckpt, "model", 2);
    const auto deadline = std::chrono::steady_clock::now() + 150s;
    while (kill && *killed_after < 0 && std::chrono::steady_clock::now() < deadline && !(*p)->Poll()) {
      auto steps = dir.Steps();
      const int64_t newest = steps.ok() && !steps->empty() ? steps->front() : 0;
      const pid_t w0 = newest >= kKillAfter ? WorkerProgram(job, 0) : -1;
      const pid_t w1 = newest >= kKillAfter ? WorkerProgram(job, 1) : -1;
      if (w0 > 0 && w1 > 0) {
        ::kill(w0, SIGKILL);
        ::kill(w1, SIGKILL);
        *killed_after = static_cast<int>(newest);
      } else {
        std::this_thread::sleep_for(10ms);
      }
    }
    auto st = (*p)->WaitFor(200s);
    *out = ReadFile(dir_ + "/" + job + ".out");
    return st ? st->exit_code : -1;
  }
};

TEST_F(JobRestartTest, EveryWorkerKilledAtOnceRestartsTheWholeJobFromItsNewestCheckpoint) {
  const std::string base = "jr-" + std::to_string(::getpid());
  std::string whole_out, out;
  int none = -1, killed_after = -1;
  ASSERT_EQ(Run(base + "-whole", true, false, &whole_out, &none), 0) << whole_out;
  ASSERT_EQ(Run(base + "-kill", true, true, &out, &killed_after), 0) << out;
  ASSERT_GE(killed_after, kKillAfter) << "the workers were never killed\n" << out;
  ASSERT_LT(killed_after, kSteps) << out;

  EXPECT_NE(out.find("every worker that held the model is gone"), std::string::npos) << out;
  EXPECT_NE(out.find("restarting every process, from the newest checkpoint (runPolicy.failurePolicy RestartJob; "
                     "restart 1 of at most 2)"),
            std::string::npos)
      << out;
  const std::string log = ReadFile(dir_ + "/logs-" + base + "-kill/worker-0.log");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("restored step ([0-9]+) from "))) << log;
  EXPECT_GE(std::stoi(m[1]), killed_after) << "not the newest checkpoint\n" << log;
  EXPECT_NEAR(MlpAccuracy(out), MlpAccuracy(whole_out), 1.0) << out;
  ExpectSameFinalModel(dir_ + "/ckpt-" + base + "-whole", dir_ + "/ckpt-" + base + "-kill", kSteps,
                       "a whole-job restart");
  std::printf("whole-job restart: both workers killed after checkpoint %d, resumed from step %s\n", killed_after,
              m[1].str().c_str());
}

// The default (FailJob): the job fails at once, naming why, instead of each restarted program
// failing on the servers until backoffLimit.
TEST_F(JobRestartTest, UnderFailJobEveryWorkerKilledAtOnceFailsTheJobSayingWhy) {
  const std::string job = "jf-" + std::to_string(::getpid());
  std::string out;
  int killed_after = -1;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Run(job, false, true, &out, &killed_after), 1) << out;
  ASSERT_GE(killed_after, kKillAfter) << out;
  // The launcher's own last word carries the scheduler's reason, not only the exit code.
  EXPECT_TRUE(std::regex_search(out, std::regex("job " + job + " failed: worker [01] exited with code [0-9]+ .*; the "
                                                "job's scheduler failed the job: worker [01] \\(incarnation 2\\) asks "
                                                "to rejoin, but every worker that held the model is gone")))
      << out;
  EXPECT_NE(out.find("runPolicy.failurePolicy: RestartJob"), std::string::npos) << out;
  EXPECT_EQ(out.find("restarting every process"), std::string::npos) << out;
  std::printf("FailJob: failed %.1f s after the start\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace
}  // namespace trellis
