// Crash recovery of a worker (docs/checkpoints.md#crash-recovery-workers): trellis-mlp under
// trellis-launch (2 workers x 2 servers, restartPolicy OnFailure). Mid-training a worker's
// program (not its agent) is SIGKILLed; its agent restarts it, it rejoins under its rank from a
// live worker's commit, and the job ends as an undisturbed run of the same job does: the same
// final accuracy and, in aggregate mode, the very same final weights and momentum.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <tuple>

#include <gtest/gtest.h>

#include "common/checkpoint/checkpoint_dir.h"
#include "tests/integration/fault/mlp_outcome.h"
#include "tests/integration/job_processes.h"

namespace trellis {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// mlp-tiny (as tests/integration/checkpoint): 128 steps per epoch, 3 epochs.
constexpr int kSteps = 3 * 128;
constexpr int kInterval = 32;
constexpr int kKillAfter = 160;  // mid-epoch 2: the first checkpoint at or after this step

std::string JobYaml(const std::string& name, const std::string& ckpt_dir) {
  return MlpJobYaml(name, {.worker_restart = "OnFailure", .checkpoint = ckpt_dir, .interval_steps = kInterval});
}

class WorkerKillTest : public LaunchedJobsTest {
 protected:

  // Runs one job to its end (bounded). With kill_rank >= 0, SIGKILLs that worker's program
  // once a checkpoint at or after kKillAfter exists (the job's own progress record).
  int Run(const std::string& job, int kill_rank, std::string* output, int* killed_after) {
    jobs_.push_back(job);
    const std::string ckpt = dir_ + "/ckpt-" + job;
    auto p = StartLaunch(TRELLIS_BIN_DIR, dir_, job, JobYaml(job, ckpt));
    if (!p.ok()) {
      *output = p.status().ToString();
      return -1;
    }
    if (kill_rank >= 0) {
      CheckpointDir dir(ckpt, "model", 2);
      const auto deadline = std::chrono::steady_clock::now() + 150s;
      while (*killed_after < 0 && std::chrono::steady_clock::now() < deadline &&
             !(*p)->Poll().has_value()) {
        auto steps = dir.Steps();
        const int64_t newest = steps.ok() && !steps->empty() ? steps->front() : 0;
        const pid_t victim = newest >= kKillAfter ? WorkerProgram(job, kill_rank) : -1;
        if (victim > 0 && ::kill(victim, SIGKILL) == 0) {
          *killed_after = static_cast<int>(newest);
        } else {
          std::this_thread::sleep_for(10ms);
        }
      }
    }
    auto st = (*p)->WaitFor(200s);
    *output = ReadFile(dir_ + "/" + job + ".out");
    return st ? st->exit_code : -1;
  }

  // The undisturbed run, then the one with a kill; compares what they end with.
  void KillAndCompare(int kill_rank) {
    const std::string base = "wk" + std::to_string(kill_rank) + "-" + std::to_string(::getpid());
    std::string whole_out, fault_out;
    int none = -1, killed_after = -1;
    ASSERT_EQ(Run(base + "-whole", -1, &whole_out, &none), 0) << whole_out;
    ASSERT_EQ(Run(base + "-kill", kill_rank, &fault_out, &killed_after), 0) << fault_out;
    ASSERT_GE(killed_after, kKillAfter) << "the worker was never killed\n" << fault_out;
    ASSERT_LT(killed_after, kSteps) << "killed only after the last step\n" << fault_out;

    // The restart is visible: the launcher's summary and the rejoiner's own log.
    // (The launcher prints its summary when it changes: running, or already exited 0.)
    EXPECT_TRUE(std::regex_search(fault_out, std::regex("workers: .*\\b" + std::to_string(kill_rank) +
                                                        " (running|exited 0) \\(1 restart\\)")))
        << fault_out;
    const std::string log = ReadFile(dir_ + "/logs-" + base + "-kill/worker-" +
                                     std::to_string(kill_rank) + ".log");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, std::regex("rejoined the running job after step ([0-9]+)")))
        << log;
    EXPECT_GE(std::stoi(m[1]), killed_after - 1) << log;  // from the donor's latest commit

    const double whole = MlpAccuracy(whole_out), fault = MlpAccuracy(fault_out);
    ASSERT_GT(whole, 0) << whole_out;
    ASSERT_GT(fault, 0) << fault_out;
    EXPECT_NEAR(fault, whole, 1.0);
    // The byte totals are the whole job's (docs/user-guide.md#byte-totals): the killed process's
    // bytes are kept by its agent, so the total is an undisturbed run's plus what the rejoiner
    // exchanged again: the slices of the steps after the donor's commit that the killed process
    // had already been answered (seen: 1 to 2.4 steps of one worker; bound: 3), less at most the
    // answers of a step in flight the killed process never received (one step). Before the
    // ledger the killed process's share (here ~160 steps of one worker) was missing.
    const std::regex restarted("RESULT: bytes pushed .*; 1 restarted, their killed processes' bytes included\\)");
    EXPECT_FALSE(std::regex_search(whole_out, restarted)) << whole_out;
    EXPECT_TRUE(std::regex_search(fault_out, restarted)) << fault_out;
    EXPECT_EQ(fault_out.find("UNDERCOUNTED"), std::string::npos) << fault_out;
    for (auto [what, whole_bytes, fault_bytes] :
         {std::tuple{"pushed", MlpBytesPushed(whole_out), MlpBytesPushed(fault_out)},
          std::tuple{"pulled", MlpBytesPulled(whole_out), MlpBytesPulled(fault_out)}}) {
      ASSERT_GT(whole_bytes, 0) << what << "\n" << whole_out;
      const double step = whole_bytes / (2.0 * kSteps);  // one worker's bytes of one step
      EXPECT_GE(fault_bytes, whole_bytes - 1.0 * step)
          << what << ": " << fault_bytes << " B after the kill, " << whole_bytes
          << " B undisturbed (one step of one worker: " << step << " B)\n" << fault_out;
      EXPECT_LE(fault_bytes, whole_bytes + 3.0 * step)
          << what << ": " << fault_bytes << " B after the kill, " << whole_bytes
          << " B undisturbed (one step of one worker: " << step << " B)\n" << fault_out;
      std::printf("bytes %s: undisturbed %.0f, with the kill %.0f (%+.2f steps of one worker)\n", what,
                  whole_bytes, fault_bytes, (fault_bytes - whole_bytes) / step);
    }
    // Aggregate mode without compression loses nothing: the same final weights and momentum.
    ExpectSameFinalModel(dir_ + "/ckpt-" + base + "-whole", dir_ + "/ckpt-" + base + "-kill", kSteps,
                         "a kill");
  }
};

TEST_F(WorkerKillTest, KilledWorkerOneRejoinsAndTheJobEndsAsUndisturbed) { KillAndCompare(1); }

// Rank 0 is the usual donor and the checkpoint writer: rank 1 serves the rejoin, and the
// restarted rank 0 writes the final checkpoint.
TEST_F(WorkerKillTest, KilledRankZeroRejoinsFromRankOne) { KillAndCompare(0); }

}  // namespace
}  // namespace trellis
