// The demo MLP through trellis-launch with spec.checkpoint: a run stopped after a checkpoint and
// started again resumes from it and ends bit for bit where an uninterrupted run ends; a corrupt
// newer file in the directory is skipped with a warning naming it.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "common/checkpoint/checkpoint_dir.h"
#include "tests/integration/job_processes.h"

namespace trellis {
namespace {

namespace fs = std::filesystem;

// mlp-tiny (tests/unit/examples/testdata): 2 workers x 2 servers, 128 steps per epoch, 3 epochs.
constexpr int kSteps = 3 * 128;
constexpr int kInterval = 64;

std::string JobYaml(const std::string& name, const std::string& ckpt_dir, int stop_at_step) {
  std::string y =
      "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: " + name +
      "\nspec:\n  servers:\n    replicas: 2\n  workers:\n    replicas: 2\n"
      "    command: [trellis-mlp]\n"
      "    args: [--layers, \"16,128,64,10\", --latent-dim, \"8\", --teacher-hidden, \"16\",\n"
      "           --epochs, \"3\", --batch, \"32\", --lr, \"0.02\", --train-samples, \"8192\",\n"
      "           --test-samples, \"1000\", --target-accuracy, \"0.85\"";
  if (stop_at_step > 0) y += ", --stop-at-step, \"" + std::to_string(stop_at_step) + "\"";
  y += "]\n  sliceBytes: 16384\n  checkpoint:\n    path: " + ckpt_dir +
       "\n    intervalSteps: " + std::to_string(kInterval) +
       "\n    keep: 2\n  runPolicy:\n    restartPolicy: Never\n    activeDeadlineSeconds: 200\n";
  return y;
}

class CheckpointResumeTest : public LaunchedJobsTest {
 protected:

  // Runs one job to its end (bounded); returns the exit code and the launcher's output.
  int Run(const std::string& ckpt_dir, int stop_at_step, std::string* output) {
    const std::string job = NewJob("ck");
    auto p = StartLaunch(TRELLIS_BIN_DIR, dir_, job, JobYaml(job, ckpt_dir, stop_at_step));
    if (!p.ok()) {
      *output = p.status().ToString();
      return -1;
    }
    auto st = (*p)->WaitFor(std::chrono::seconds(240));
    *output = ReadFile(dir_ + "/" + job + ".out");
    return st ? st->exit_code : -1;
  }
};

TEST_F(CheckpointResumeTest, StopRestoreContinueEqualsAnUninterruptedRunBitForBit) {
  const std::string whole_dir = dir_ + "/whole";
  const std::string split_dir = dir_ + "/split";
  std::string out;
  ASSERT_EQ(Run(whole_dir, 0, &out), 0) << out;
  EXPECT_EQ(out.find("resuming"), std::string::npos) << out;

  // First half: stops right after the checkpoint of step 192 (epoch 2, half way).
  ASSERT_EQ(Run(split_dir, 192, &out), 0) << out;
  EXPECT_NE(out.find("stopped after step 192"), std::string::npos) << out;
  CheckpointDir split(split_dir, "model", 2);
  ASSERT_EQ(split.Steps().value(), (std::vector<int64_t>{192, 128}));

  // A newer file that is garbage: rank 0 must skip it, name it, and use step 192.
  const std::string bad = split.FileFor(200);
  std::ofstream(bad) << "TRLSCKPT but not really a checkpoint";
  ASSERT_EQ(Run(split_dir, 0, &out), 0) << out;
  EXPECT_NE(out.find("resuming after step 192"), std::string::npos) << out;
  // Library log lines go to the worker's log file (the launcher shows its stdout).
  const std::string log = ReadFile(dir_ + "/logs-" + jobs_.back() + "/worker-0.log");
  EXPECT_NE(log.find("skipping checkpoint: " + bad + ": "), std::string::npos) << log;
  EXPECT_NE(log.find("restored step 192 from " + split.FileFor(192)), std::string::npos) << log;

  auto a = CheckpointDir(whole_dir, "model", 2).LoadNewest();
  auto b = split.LoadNewest();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(a->checkpoint.step, kSteps);
  ASSERT_EQ(b->checkpoint.step, kSteps);
  ASSERT_EQ(a->checkpoint.entries.size(), b->checkpoint.entries.size());
  for (size_t i = 0; i < a->checkpoint.entries.size(); ++i) {
    const auto& x = a->checkpoint.entries[i];
    const auto& y = b->checkpoint.entries[i];
    ASSERT_EQ(x.name, y.name);
    ASSERT_EQ(x.values.size(), y.values.size());
    EXPECT_EQ(std::memcmp(x.values.data(), y.values.data(), x.values.size() * sizeof(float)), 0)
        << x.name << " differs between the uninterrupted and the resumed run";
  }
}

}  // namespace
}  // namespace trellis
