// A job stopped from outside with checkpoints on (docs/checkpoints.md#stopping-a-job-the-exit-checkpoint): SIGTERM to
// trellis-launch mid-training makes rank 0 write an exit checkpoint at its next step boundary
// before any process is stopped, and the same job file run again resumes from that step and ends
// bit for bit where an undisturbed run ends (aggregate mode: weights and momentum; update mode:
// the servers' files are part of the exit checkpoint too; multigpu: pods of 2 local ranks).
#include <signal.h>
#include <unistd.h>

#include <regex>
#include <thread>

#include <gtest/gtest.h>

#include "common/checkpoint/checkpoint_dir.h"
#include "tests/integration/fault/mlp_outcome.h"
#include "tests/integration/job_processes.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

// mlp-tiny: 128 steps per epoch, 3 epochs; periodic checkpoints at 128, 256 and 384.
constexpr int kSteps = 3 * 128;
constexpr int kInterval = 128;

class ExitCheckpointTest : public LaunchedJobsTest, public ::testing::WithParamInterface<const char*> {
 protected:
  // `slow`: rank 0 sleeps 10 ms a step (the values are the same), so that the stop lands in the
  // middle of training on any machine: mlp-tiny trains its 384 steps in well under a second.
  // Pings every 0.2 s: the workers learn of the stop sooner.
  std::string Yaml(const std::string& job, const std::string& ckpt, bool slow) {
    MlpJob j{.checkpoint = ckpt, .interval_steps = kInterval,
             .scheduler = "    heartbeatIntervalSeconds: 0.2\n"};
    if (std::string(GetParam()) == "update") j.server_mode = "update";
    if (std::string(GetParam()) == "multigpu") {
      // 2 pods x 2 local ranks: rank 0 is pod 0's local rank 0, which sees the stop through its
      // pod's worker; twice the samples keep 128 steps an epoch.
      j.gpus_per_worker = 2;
      j.train_samples = 2 * 8192;
    }
    std::string y = MlpJobYaml(job, j);
    if (slow) {
      const std::string last = "--target-accuracy, \"0.85\"]";
      y.replace(y.find(last), last.size(), "--target-accuracy, \"0.85\", --slow-rank, \"0\", --step-sleep-ms, \"10\"]");
    }
    // Update mode: the servers' SGD with momentum, whose state is in their own files.
    if (j.server_mode != nullptr) y += "  optimizer:\n    type: sgd\n    learningRate: 0.02\n    momentum: 0.9\n";
    return y;
  }

  // Runs `job` on `ckpt`; with `stop`, SIGTERMs the launcher once the checkpoint of step 128
  // exists. Returns the launcher's exit code; its output in *out.
  int Run(const std::string& job, const std::string& ckpt, bool stop, std::string* out) {
    auto p = StartLaunch(TRELLIS_BIN_DIR, dir_, job, Yaml(job, ckpt, stop));
    if (!p.ok()) {
      *out = p.status().ToString();
      return -1;
    }
    if (stop) {
      CheckpointDir dir(ckpt, "model", 2);
      const auto deadline = std::chrono::steady_clock::now() + 150s;
      while (std::chrono::steady_clock::now() < deadline && !(*p)->Poll().has_value()) {
        auto steps = dir.Steps();
        if (steps.ok() && !steps->empty() && steps->front() >= kInterval) {
          (void)(*p)->Signal(SIGTERM);
          break;
        }
        std::this_thread::sleep_for(10ms);
      }
    }
    auto st = (*p)->WaitFor(200s);
    *out = ReadFile(dir_ + "/" + job + ".out");
    return st ? st->exit_code : -1;
  }
};

TEST_P(ExitCheckpointTest, SigtermWritesAnExitCheckpointAndTheRerunEndsAsUndisturbed) {
  const std::string tag = std::string(GetParam()) + "-" + std::to_string(::getpid());
  const std::string whole = dir_ + "/whole", split = dir_ + "/split";
  std::string out;
  ASSERT_EQ(Run(NewJob("xw-" + tag), whole, false, &out), 0) << out;

  const std::string stopped = NewJob("xs-" + tag);
  ASSERT_EQ(Run(stopped, split, true, &out), 128 + SIGTERM) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("exit checkpoint of step ([0-9]+) written")))
      << "no exit checkpoint:\n" << out;
  const int64_t exit_step = std::stoll(m[1]);
  // Not before the periodic checkpoint the signal waited for. Usually later; equal when the stop
  // reached rank 0 between writing that file and its stop check at the same boundary (then that
  // periodic save is the exit checkpoint: one in a few dozen runs on a loaded machine).
  EXPECT_GE(exit_step, kInterval) << out;
  EXPECT_LT(exit_step, kSteps) << out;
  CheckpointDir dir(split, "model", 2);
  ASSERT_EQ(dir.Steps().value().front(), exit_step) << "the exit checkpoint is the newest file";
  const std::string log = ReadFile(dir_ + "/logs-" + stopped + "/worker-0.log");
  EXPECT_NE(log.find("saved step " + std::to_string(exit_step) + " to " + dir.FileFor(exit_step)),
            std::string::npos) << log;
  EXPECT_NE(log.find("stopped after step " + std::to_string(exit_step) + " (exit checkpoint " +
                     dir.FileFor(exit_step) + ")"),
            std::string::npos) << log;
  if (std::string(GetParam()) == "update") {
    for (int server = 0; server < 2; ++server) {
      CheckpointDir sd(split, "server-" + std::to_string(server), 2);
      ASSERT_EQ(sd.Steps().value().front(), exit_step) << "server " << server;
    }
  }

  // The same job file again: it resumes after the exit checkpoint's step, nothing trained twice
  // on the way to the end, and ends where the undisturbed run ended.
  ASSERT_EQ(Run(NewJob("xr-" + tag), split, false, &out), 0) << out;
  EXPECT_NE(out.find("resuming after step " + std::to_string(exit_step)), std::string::npos) << out;
  ExpectSameFinalModel(whole, split, kSteps, "a SIGTERM and a rerun");
}

INSTANTIATE_TEST_SUITE_P(Modes, ExitCheckpointTest, ::testing::Values("aggregate", "update", "multigpu"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace trellis
