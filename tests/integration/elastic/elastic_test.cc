// Elastic jobs (docs/elastic.md): trellis-mlp under trellis-launch, its workers resized by
// `trellis-launch resize RUN_DIR N` while it trains, as a user does. The resize takes effect at a
// step boundary the workers agree on; the worker resized away exits 0; the others re-shard their
// data and the job reaches its target accuracy.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/checkpoint/checkpoint_dir.h"
#include "common/process/subprocess.h"
#include "tests/integration/fault/mlp_outcome.h"
#include "tests/integration/job_processes.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

class ElasticTest : public LaunchedJobsTest {
 protected:
  // `trellis-launch resize <run dir of job> <workers>`: its exit code; its output in *out.
  int Resize(const std::string& job, int workers, std::string* out) {
    SpawnOptions o;
    o.argv = {std::string(TRELLIS_BIN_DIR) + "/trellis-launch", "resize", dir_ + "/logs-" + job,
              std::to_string(workers)};
    o.env = CurrentEnvironment();
    o.stdout_mode = SpawnOptions::Output::kFile;
    o.stdout_path = dir_ + "/" + job + ".resize.out";
    o.stderr_mode = SpawnOptions::Output::kStdout;
    auto p = Subprocess::Start(o);
    if (!p.ok()) {
      *out = p.status().ToString();
      return -1;
    }
    auto st = (*p)->WaitFor(90s);
    *out = ReadFile(o.stdout_path);
    return st ? st->exit_code : -1;
  }

  // Starts the job and waits until its newest checkpoint is at `step` or later (it trains).
  std::unique_ptr<Subprocess> StartAndWaitForStep(const std::string& job, const MlpJob& spec,
                                                  int64_t step) {
    auto p = StartLaunch(TRELLIS_BIN_DIR, dir_, job, MlpJobYaml(job, spec));
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return nullptr;
    CheckpointDir dir(spec.checkpoint, "model", 2);
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while (std::chrono::steady_clock::now() < deadline && !(*p)->Poll().has_value()) {
      auto steps = dir.Steps();
      if (steps.ok() && !steps->empty() && steps->front() >= step) break;
      std::this_thread::sleep_for(10ms);
    }
    return std::move(p).value();
  }

  // 2 workers x 2 servers, elastic 1..2; rank 0 sleeps a little each step so the resize lands
  // mid-training. Checkpoints every 16 steps (how the test sees the job's progress).
  MlpJob Spec(const std::string& job, const char* server_mode) {
    MlpJob j;
    j.elastic = "{minWorkers: 1, maxWorkers: 2}";
    j.rank0_step_sleep_ms = 8;
    j.checkpoint = dir_ + "/ckpt-" + job;
    j.interval_steps = 16;
    j.server_mode = server_mode;
    return j;
  }

  void ShrinksMidTrainingAndReachesTheTarget(const char* server_mode) {
    const std::string job = NewJob(std::string("el-") + server_mode);
    auto launch = StartAndWaitForStep(job, Spec(job, server_mode), 48);
    ASSERT_NE(launch, nullptr);
    std::string resize_out;
    ASSERT_EQ(Resize(job, 1, &resize_out), 0) << resize_out << ReadFile(dir_ + "/" + job + ".out");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(resize_out, m,
                                  std::regex("trellis-launch resize: 1 workers from step ([0-9]+) "
                                             "\\(decided ([0-9.]+) s after")))
        << resize_out;
    const int from_step = std::stoi(m[1]);
    EXPECT_GT(from_step, 48) << resize_out;
    std::printf("resize 2 -> 1 (%s mode): decided %s s after the request, from step %d\n",
                server_mode, m[2].str().c_str(), from_step);

    auto st = launch->WaitFor(200s);
    const std::string out = ReadFile(dir_ + "/" + job + ".out");
    ASSERT_TRUE(st.has_value()) << out;
    EXPECT_EQ(st->exit_code, 0) << out;
    EXPECT_NE(out.find("trellis-mlp: resized to 1 worker(s) from step " +
                       std::to_string(from_step)),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("RESULT: test accuracy"), std::string::npos) << out;
    EXPECT_NE(out.find("-- reached"), std::string::npos) << out;
    EXPECT_NE(out.find(", 1 worker(s), "), std::string::npos) << "the result names the world at the end\n" << out;
    EXPECT_NE(out.find("trellis-launch: worker-1 left the job: resized away"), std::string::npos)
        << out;
    const std::string left = ReadFile(dir_ + "/logs-" + job + "/worker-1.log");
    EXPECT_NE(left.find("trellis-mlp: worker left the job after step " +
                        std::to_string(from_step - 1)),
              std::string::npos)
        << left;
    // The last checkpoint is the job's last step with one worker's step count.
    auto newest = CheckpointDir(dir_ + "/ckpt-" + job, "model", 2).LoadNewest();
    ASSERT_TRUE(newest.ok()) << newest.status().ToString();
    EXPECT_GT(newest->checkpoint.step, 3 * 128) << "one worker takes more steps per epoch";
  }

  // Growing back (docs/elastic.md#growing): 4 workers shrunk to 2, grown to `grow_to` (3 or 4)
  // while they train (trellis-launch starts the lowest ones resized away again; each takes the
  // model from a live worker and joins at the step the members agree on), then shrunk to 1. The job reaches its
  // target, the workers of each world end their epochs together (the MLP sums its statistics
  // over the world at each epoch's end: a joiner that counted its epoch otherwise would hang it),
  // and the last world trains on to the job's end.
  void GrowsBackAndReachesTheTarget(const char* server_mode, int grow_to) {
    const std::string job = NewJob(std::string("el-grow-") + server_mode);
    MlpJob spec = Spec(job, server_mode);
    spec.workers = 4;
    spec.elastic = "{minWorkers: 1, maxWorkers: 4}";
    spec.train_samples = 16384;  // 128 steps per epoch with 4 workers
    spec.rank0_step_sleep_ms = 12;
    auto launch = StartAndWaitForStep(job, spec, 32);
    ASSERT_NE(launch, nullptr);
    std::string out;
    std::vector<int> from_steps;
    for (const int to : {2, grow_to, 1}) {
      ASSERT_EQ(Resize(job, to, &out), 0) << out << ReadFile(dir_ + "/" + job + ".out");
      std::smatch m;
      ASSERT_TRUE(std::regex_search(out, m, std::regex("trellis-launch resize: " + std::to_string(to) +
                                                       " workers from step ([0-9]+) \\(decided ([0-9.]+) s after")))
          << out;
      from_steps.push_back(std::stoi(m[1]));
      std::printf("%s mode, resize to %d: decided %s s after the request, from step %s\n", server_mode, to, m[2].str().c_str(),
                  m[1].str().c_str());
      // Let the new world train a while before the next resize.
      CheckpointDir dir(spec.checkpoint, "model", 2);
      const auto deadline = std::chrono::steady_clock::now() + 60s;
      while (std::chrono::steady_clock::now() < deadline) {
        auto steps = dir.Steps();
        if (steps.ok() && !steps->empty() && steps->front() >= from_steps.back() + 32) break;
        std::this_thread::sleep_for(10ms);
      }
    }
    auto st = launch->WaitFor(240s);
    const std::string log = ReadFile(dir_ + "/" + job + ".out");
    ASSERT_TRUE(st.has_value()) << log;
    EXPECT_EQ(st->exit_code, 0) << log;
    const std::string grows = "starts again: the job grows to " + std::to_string(grow_to) + " workers";
    EXPECT_NE(log.find("trellis-launch: worker-2 " + grows), std::string::npos) << log;
    EXPECT_EQ(log.find("trellis-launch: worker-3 " + grows) != std::string::npos, grow_to == 4) << log;
    EXPECT_NE(log.find("trellis-mlp: resized to " + std::to_string(grow_to) + " worker(s) from step " +
                       std::to_string(from_steps[1])),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("RESULT: test accuracy"), std::string::npos) << log;
    EXPECT_NE(log.find("-- reached"), std::string::npos) << log;
    EXPECT_NE(log.find(", 1 worker(s), 3 epochs"), std::string::npos) << log;
    auto newest = CheckpointDir(spec.checkpoint, "model", 2).LoadNewest();
    ASSERT_TRUE(newest.ok()) << newest.status().ToString();
    EXPECT_GT(newest->checkpoint.step, from_steps[2]);
    // The joiners took the members' commit of the step before the new world's first.
    for (int w = 2; w < grow_to; ++w) {
      const std::string wl = ReadFile(dir_ + "/logs-" + job + "/worker-" + std::to_string(w) + ".log");
      EXPECT_NE(wl.find("joins world 2 from step " + std::to_string(from_steps[1])), std::string::npos)
          << w << ":\n" << wl;
      EXPECT_NE(wl.find("rejoined the running job after step " + std::to_string(from_steps[1] - 1)), std::string::npos)
          << w << ":\n" << wl;
    }
  }
};

TEST_F(ElasticTest, AggregateModeShrinksTwoToOneMidTrainingAndReachesTheTarget) {
  ShrinksMidTrainingAndReachesTheTarget("aggregate");
}

TEST_F(ElasticTest, UpdateModeShrinksTwoToOneMidTrainingAndReachesTheTarget) {
  ShrinksMidTrainingAndReachesTheTarget("update");
}

// Grown to 3 of the 4 it started with: the joiner's world is smaller than the job's first, and
// it still declares the keys the others did (the MLP's per-rank statistics keys).
TEST_F(ElasticTest, AggregateModeFourShrunkToTwoGrownToThreeThenShrunkToOneReachesTheTarget) {
  GrowsBackAndReachesTheTarget("aggregate", 3);
}

TEST_F(ElasticTest, UpdateModeFourShrunkToTwoGrownToFourThenShrunkToOneReachesTheTarget) {
  GrowsBackAndReachesTheTarget("update", 4);
}

// What a user is told when a resize cannot be done: a job that is not elastic, a size outside
// its bounds. The job runs on undisturbed.
TEST_F(ElasticTest, ResizesThatCannotBeDoneAreRefusedSayingWhy) {
  const std::string job = NewJob("el-refused");
  MlpJob spec = Spec(job, "aggregate");
  spec.elastic = "";
  auto launch = StartAndWaitForStep(job, spec, 16);
  ASSERT_NE(launch, nullptr);
  std::string out;
  EXPECT_EQ(Resize(job, 1, &out), 1) << out;
  EXPECT_NE(out.find("the job is not elastic"), std::string::npos) << out;
  EXPECT_EQ(Resize(job, 0, &out), 2) << out;
  EXPECT_NE(out.find("WORKERS must be a number >= 1, got '0'"), std::string::npos) << out;
  EXPECT_EQ(Resize(job + "-none", 1, &out), 2) << out;
  EXPECT_NE(out.find("scheduler.client not found"), std::string::npos) << out;
  auto st = launch->WaitFor(200s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->exit_code, 0) << ReadFile(dir_ + "/" + job + ".out");
}

// The scheduler killed after a resize (trellis-launch restarts it on the same address): the
// workers hand it back the world with the rest of their state, so it neither waits for the worker
// resized away nor starts the world's epochs again; the next resize works and the job succeeds.
TEST_F(ElasticTest, TheSchedulerKilledAfterAResizeRecoversTheWorldAndResizesAgain) {
  const std::string job = NewJob("el-sched");
  MlpJob spec = Spec(job, "aggregate");
  spec.workers = 3;
  spec.elastic = "{minWorkers: 1, maxWorkers: 3}";
  spec.worker_restart = "OnFailure";
  spec.epochs = 12;
  auto launch = StartAndWaitForStep(job, spec, 32);
  ASSERT_NE(launch, nullptr);
  std::string out;
  ASSERT_EQ(Resize(job, 2, &out), 0) << out << ReadFile(dir_ + "/" + job + ".out");
  // Killed once worker 2 has left (the launcher asks the scheduler why a worker exited).
  const std::string left = "trellis-launch: worker-2 left the job: resized away";
  const auto left_by = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < left_by &&
         ReadFile(dir_ + "/" + job + ".out").find(left) == std::string::npos) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_NE(ReadFile(dir_ + "/" + job + ".out").find(left), std::string::npos) << ReadFile(dir_ + "/" + job + ".out");

  const pid_t scheduler = SchedulerOf(job);
  ASSERT_GT(scheduler, 0);
  ASSERT_EQ(::kill(scheduler, SIGKILL), 0);
  const std::string log = dir_ + "/logs-" + job + "/scheduler.log";
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline &&
         ReadFile(log).find("recovered the running job after a scheduler restart") == std::string::npos) {
    std::this_thread::sleep_for(20ms);
  }
  const std::string recovered = ReadFile(log);
  ASSERT_NE(recovered.find("recovered the running job after a scheduler restart: all 2 servers and 2 workers"),
            std::string::npos)
      << recovered.substr(recovered.size() > 6000 ? recovered.size() - 6000 : 0);

  ASSERT_EQ(Resize(job, 1, &out), 0) << out << ReadFile(log);
  EXPECT_NE(out.find("2 -> 1 workers asked for"), std::string::npos) << out;
  auto st = launch->WaitFor(200s);
  const std::string job_out = ReadFile(dir_ + "/" + job + ".out");
  ASSERT_TRUE(st.has_value()) << job_out;
  EXPECT_EQ(st->exit_code, 0) << job_out;
  EXPECT_NE(job_out.find("-- reached"), std::string::npos) << job_out;
  EXPECT_NE(job_out.find("trellis-launch: worker-1 left the job: resized away"), std::string::npos) << job_out;
  EXPECT_NE(job_out.find(", 1 worker(s), "), std::string::npos) << job_out;
}

}  // namespace
}  // namespace trellis
