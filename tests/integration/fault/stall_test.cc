// Stalls are failures too (docs/scheduler.md#stalls): trellis-mlp under trellis-launch (2 servers
// x 2 workers, OnFailure), a server's or a worker's program is SIGSTOPped mid-training and never
// continued, while its agent heartbeats on. The scheduler must find it stalled from the program's
// own silence, name it, have its agent kill and restart it, and the other workers must wait for it
// past their operation deadline (5 s here: about what a detection and a restart take on a loaded
// machine, so often less) instead of failing. The job then ends as an undisturbed run does: the same
// accuracy and the very same final weights and momentum.
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

// mlp-tiny (as worker_kill_test): 128 steps per epoch, 3 epochs, a checkpoint every 32 steps.
constexpr int kSteps = 3 * 128;
constexpr int kInterval = 32;
constexpr int kStopAfter = 160;  // mid-epoch 2: once a checkpoint at or after this step exists

// Programs ping every 0.25 s; silent 2 s is a stall. Each operation's deadline is 5 s
// (TRELLIS_TIMEOUT_MS): the stall lasts for ever, far past it.
std::string JobYaml(const std::string& name, const std::string& ckpt_dir) {
  return MlpJobYaml(name, {.server_restart = "OnFailure", .worker_restart = "OnFailure",
                          .worker_env = "    - {name: TRELLIS_TIMEOUT_MS, value: \"5000\"}\n",
                          .checkpoint = ckpt_dir, .interval_steps = kInterval,
                          .scheduler = "    heartbeatIntervalSeconds: 0.25\n    livenessTimeoutSeconds: 2\n"});
}

class StallTest : public LaunchedJobsTest {
 protected:
  // The undisturbed run, once for the suite (both tests compare with it).
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/trellis-stall-base-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    base_dir_ = tmpl;
    base_job_ = "stall-base-" + std::to_string(::getpid());
    auto p = StartLaunch(TRELLIS_BIN_DIR, base_dir_, base_job_,
                         JobYaml(base_job_, base_dir_ + "/ckpt"));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    auto st = (*p)->WaitFor(200s);
    base_out_ = ReadFile(base_dir_ + "/" + base_job_ + ".out");
    base_ok_ = st && st->exit_code == 0;
    WaitNoProcessesOfJob(base_job_);
  }
  static void TearDownTestSuite() {
    if (base_ok_) std::filesystem::remove_all(base_dir_);
  }

  // SIGSTOPs `role` `rank`'s program once a checkpoint at or after kStopAfter exists, never
  // continues it, and compares the job's end with the undisturbed run's.
  void StopAndCompare(const std::string& role, int rank) {
    ASSERT_TRUE(base_ok_) << base_out_;
    const std::string job = NewJob("stall-" + role.substr(0, 1));
    const std::string ckpt = dir_ + "/ckpt-" + job;
    auto p = StartLaunch(TRELLIS_BIN_DIR, dir_, job, JobYaml(job, ckpt));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    CheckpointDir dir(ckpt, "model", 2);
    pid_t stopped = -1;
    int64_t stopped_after = -1;
    const auto deadline = std::chrono::steady_clock::now() + 150s;
    while (stopped < 0 && std::chrono::steady_clock::now() < deadline && !(*p)->Poll()) {
      auto steps = dir.Steps();
      const int64_t newest = steps.ok() && !steps->empty() ? steps->front() : 0;
      const pid_t victim = newest >= kStopAfter ? ProgramOf(job, role, rank) : -1;
      if (victim > 0 && ::kill(victim, SIGSTOP) == 0) {
        stopped = victim;
        stopped_after = newest;
      } else {
        std::this_thread::sleep_for(10ms);
      }
    }
    auto st = (*p)->WaitFor(200s);
    const std::string out = ReadFile(dir_ + "/" + job + ".out");
    if (stopped > 0) ::kill(stopped, SIGKILL);  // never left behind stopped, whatever happened
    ASSERT_GT(stopped, 0) << "the " << role << " was never stopped\n" << out;
    ASSERT_LT(stopped_after, kSteps) << "stopped only after the last step\n" << out;
    ASSERT_TRUE(st.has_value()) << "the job did not end\n" << out;
    ASSERT_EQ(st->exit_code, 0) << out;

    // Named: the scheduler's log says who stalled and why; its agent says it killed it.
    const std::string logs = dir_ + "/logs-" + job;
    const std::string scheduler = ReadFile(logs + "/scheduler.log");
    const std::string who = role + " " + std::to_string(rank) + " (pod " + job + "-" + role + "-" +
                            std::to_string(rank) + ") stalled: its program sent no liveness";
    EXPECT_NE(scheduler.find(who), std::string::npos) << scheduler;
    const std::string own = ReadFile(logs + "/" + role + "-" + std::to_string(rank) + ".log");
    EXPECT_NE(own.find("the scheduler reports its program stalled"), std::string::npos) << own;
    EXPECT_NE(own.find("after it stalled"), std::string::npos) << own;
    // Nobody else was restarted: the stalled one alone (1 restart), the others 0.
    EXPECT_EQ(scheduler.find("stalled: ", scheduler.find(who) + who.size()), std::string::npos)
        << "a second stall\n" << scheduler;
    for (int r = 0; r < 2; ++r) {
      if (role == "worker" && r == rank) continue;
      EXPECT_EQ(ReadFile(logs + "/worker-" + std::to_string(r) + ".log").find("; restart 1/"),
                std::string::npos)
          << "worker " << r << " restarted although it only waited";
    }

    const double whole = MlpAccuracy(base_out_), got = MlpAccuracy(out);
    ASSERT_GT(whole, 0) << base_out_;
    ASSERT_GT(got, 0) << out;
    EXPECT_NEAR(got, whole, 1.0);
    ExpectSameFinalModel(base_dir_ + "/ckpt", ckpt, kSteps, "a stalled " + role);
  }

  static inline std::string base_dir_, base_job_, base_out_;
  static inline bool base_ok_ = false;
};

TEST_F(StallTest, AStoppedServerIsNamedRestartedAndTheJobEndsAsUndisturbed) {
  StopAndCompare("server", 1);
}

TEST_F(StallTest, AStoppedWorkerIsNamedRestartedAndTheJobEndsAsUndisturbed) {
  StopAndCompare("worker", 1);
}

}  // namespace
}  // namespace trellis
