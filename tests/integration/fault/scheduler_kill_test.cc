// A restarted scheduler recovers the running job (docs/scheduler.md#scheduler-restart):
// trellis-mlp under trellis-launch (2 workers x 2 servers). Mid-training the scheduler is
// SIGKILLed; trellis-launch starts it again on the same port, the agents, servers and workers
// hand the job's state back, and the job ends as an undisturbed run of the same job does: the
// same final weights and momentum, bit for bit, and no server or worker process restarted.
// Prints the time from the kill to the job's state being whole again.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>

#include <gtest/gtest.h>

#include "common/checkpoint/checkpoint_dir.h"
#include "tests/integration/fault/mlp_outcome.h"
#include "tests/integration/job_processes.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// mlp-tiny on 16x the samples of tests/integration/checkpoint: 2048 steps per epoch, 3 epochs
// (some 7 s undisturbed), so that the job is still training while the members come back.
constexpr int kSteps = 3 * 2048;
constexpr int kInterval = 64;
constexpr int kKillAfter = 1024;  // mid-epoch 0: the first checkpoint at or after this step

std::string JobYaml(const std::string& name, const std::string& ckpt_dir) {
  return MlpJobYaml(name, {.worker_restart = "OnFailure", .train_samples = 131072, .checkpoint = ckpt_dir,
                          .interval_steps = kInterval});
}

struct KillRecord {
  bool then_worker = false;    // once recovered, also SIGKILL worker 1's program
  int killed_after = -1;       // the newest checkpoint step when the scheduler was killed
  int worker_killed_after = -1;  // the newest checkpoint step when worker 1 was killed
  double recovered_s = -1;     // kill -> the new scheduler logs that every member is back
  double next_commit_s = -1;   // kill -> the next checkpoint written (training went on)
};

class SchedulerKillTest : public LaunchedJobsTest {
 protected:
  // The undisturbed run, then one whose scheduler is killed (and, with then_worker, worker 1
  // after the restart); both must end with the same weights.
  void KillAndCompare(bool then_worker);

  // Runs one job to its end (bounded); with `kill`, SIGKILLs its scheduler once a checkpoint
  // at or after kKillAfter exists, and times the recovery.
  int Run(const std::string& job, bool kill, std::string* output, KillRecord* rec) {
    const std::string ckpt = dir_ + "/ckpt-" + job;
    auto p = StartLaunch(TRELLIS_BIN_DIR, dir_, job, JobYaml(job, ckpt));
    if (!p.ok()) {
      *output = p.status().ToString();
      return -1;
    }
    if (kill) {
      CheckpointDir dir(ckpt, "model", 2);
      auto newest = [&]() -> int64_t {
        auto steps = dir.Steps();
        return steps.ok() && !steps->empty() ? steps->front() : 0;
      };
      const auto deadline = Clock::now() + 150s;
      Clock::time_point killed_at{};
      while (rec->killed_after < 0 && Clock::now() < deadline && !p.value()->Poll().has_value()) {
        const int64_t step = newest();
        const pid_t victim = step >= kKillAfter ? SchedulerOf(job) : -1;
        if (victim > 0 && ::kill(victim, SIGKILL) == 0) {
          killed_at = Clock::now();
          rec->killed_after = static_cast<int>(step);
        } else {
          std::this_thread::sleep_for(5ms);
        }
      }
      const std::string log = dir_ + "/logs-" + job + "/scheduler.log";
      while (rec->killed_after >= 0 && Clock::now() < deadline &&
             (rec->recovered_s < 0 || rec->next_commit_s < 0)) {
        const double since = std::chrono::duration<double>(Clock::now() - killed_at).count();
        if (rec->next_commit_s < 0 && newest() > rec->killed_after) rec->next_commit_s = since;
        if (rec->recovered_s < 0 &&
            ReadFile(log).find("recovered the running job after a scheduler restart") !=
                std::string::npos) {
          rec->recovered_s = since;
        }
        if (p.value()->Poll().has_value()) break;
        std::this_thread::sleep_for(5ms);
      }
      // The state is really back: a worker crashing now rejoins through the new scheduler
      // (donors, the shard map for its declaration) as it would through the first one.
      while (rec->then_worker && rec->recovered_s >= 0 && rec->worker_killed_after < 0 &&
             Clock::now() < deadline && !p.value()->Poll().has_value()) {
        const int64_t step = newest();
        const bool handed = ReadFile(dir_ + "/logs-" + job + "/worker-1.log")
                                .find("handed back the shard map") != std::string::npos;
        const pid_t victim =
            handed && step > rec->killed_after + kInterval ? WorkerProgram(job, 1) : -1;
        if (victim > 0 && ::kill(victim, SIGKILL) == 0) {
          rec->worker_killed_after = static_cast<int>(step);
        } else {
          std::this_thread::sleep_for(5ms);
        }
      }
    }
    auto st = (*p)->WaitFor(200s);
    *output = ReadFile(dir_ + "/" + job + ".out");
    return st ? st->exit_code : -1;
  }
};

void SchedulerKillTest::KillAndCompare(bool then_worker) {
  const std::string whole = NewJob("sk-whole");
  const std::string fault = NewJob("sk-kill");
  std::string whole_out, fault_out;
  KillRecord none, rec;
  rec.then_worker = then_worker;
  ASSERT_EQ(Run(whole, false, &whole_out, &none), 0) << whole_out;
  ASSERT_EQ(Run(fault, true, &fault_out, &rec), 0) << fault_out;
  ASSERT_GE(rec.killed_after, kKillAfter) << "the scheduler was never killed\n" << fault_out;
  ASSERT_LT(rec.killed_after, kSteps) << "killed only after the last step\n" << fault_out;

  // The restart is visible: in the launcher's output and the new scheduler's log.
  EXPECT_TRUE(std::regex_search(
      fault_out, std::regex("the scheduler killed by SIGKILL.*; restarting it on 127\\.0\\.0\\.1:[0-9]+ "
                            "\\(restart 1 of at most 2\\)")))
      << fault_out;
  const std::string logs = dir_ + "/logs-" + fault;
  const std::string sched = ReadFile(logs + "/scheduler.log");
  EXPECT_NE(sched.find("recovered the running job after a scheduler restart: all 2 servers and 2 "
                       "workers are back"),
            std::string::npos)
      << sched;
  for (int w = 0; w < 2; ++w) {
    const std::string log = ReadFile(logs + "/worker-" + std::to_string(w) + ".log");
    EXPECT_NE(log.find("handed back the shard map"), std::string::npos) << log;
    if (!then_worker || w == 0) {
      EXPECT_EQ(log.find("incarnation 2"), std::string::npos) << "no worker restarted\n" << log;
    }
  }
  if (then_worker) {
    ASSERT_GT(rec.worker_killed_after, rec.killed_after) << "worker 1 was never killed\n" << fault_out;
    ASSERT_LT(rec.worker_killed_after, kSteps) << fault_out;
    const std::string log = ReadFile(logs + "/worker-1.log");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, std::regex("rejoined the running job after step ([0-9]+)")))
        << log;
    EXPECT_GE(std::stoi(m[1]), rec.worker_killed_after - 1) << log;
  }
  ASSERT_GE(rec.recovered_s, 0) << "the new scheduler never logged the recovery\n" << sched;
  std::printf("scheduler SIGKILLed after checkpoint step %d: every member back with the restarted "
              "scheduler %.2f s after the kill; next checkpoint (training going on) %.2f s after "
              "it\n",
              rec.killed_after, rec.recovered_s, rec.next_commit_s);

  const double a = MlpAccuracy(whole_out), b = MlpAccuracy(fault_out);
  ASSERT_GT(a, 0) << whole_out;
  ASSERT_GT(b, 0) << fault_out;
  EXPECT_DOUBLE_EQ(a, b);
  // Nothing restarted but the scheduler: the very same final weights and momentum.
  ExpectSameFinalModel(dir_ + "/ckpt-" + whole, dir_ + "/ckpt-" + fault, kSteps, "a scheduler kill");
}

TEST_F(SchedulerKillTest, KilledSchedulerIsRestartedAndTheJobEndsAsUndisturbed) {
  KillAndCompare(false);
}

// After the restart, worker 1's program is SIGKILLed too: its agent restarts it and it rejoins
// from a live worker's commit, the new scheduler choosing the donor and answering its
// declaration with the shard map handed back.
TEST_F(SchedulerKillTest, AWorkerKilledAfterTheRestartRejoinsThroughTheNewScheduler) {
  KillAndCompare(true);
}

}  // namespace
}  // namespace trellis
