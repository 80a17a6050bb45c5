// Elastic jobs (docs/elastic.md): trellis-mlp under trellis-launch, its workers resized by
// `trellis-launch resize RUN_DIR N` while it trains, as a user does. The resize takes effect at a
// step boundary the workers agree on; the worker resized away exits 0; the others re-shard their
// data and the job reaches its target accuracy.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
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
  // Waits (at most `limit`) until the file at `path` holds `text`; whether it does.
  static bool WaitForText(const std::string& path, const std::string& text, std::chrono::seconds limit) {
    const auto by = std::chrono::steady_clock::now() + limit;
    while (ReadFile(path).find(text) == std::string::npos) {
      if (std::chrono::steady_clock::now() >= by) return false;
      std::this_thread::sleep_for(20ms);
    }
    return true;
  }

  // `trellis-launch resize <run dir of job> <workers>`: its exit code; its output in *out.
  int Resize(const std::string& job, int workers, std::string* out) {
    return RunLauncherResize(TRELLIS_BIN_DIR, dir_ + "/logs-" + job, {std::to_string(workers)},
                             dir_ + "/" + job + ".resize.out", out);
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

  // 3 workers in update mode, elastic 2..3: one of them may be lost.
  MlpJob ThreeOfMinTwo(const std::string& job) {
    MlpJob spec = Spec(job, "update");
    spec.workers = 3;
    spec.elastic = "{minWorkers: 2, maxWorkers: 3}";
    spec.train_samples = 16384;
    return spec;
  }

  // Starts `spec` with its workers under restartPolicy Never, SIGKILLs worker 1's program once
  // the job reached `step`, and waits for the job's end: how trellis-launch exited (none: it
  // did not); its output in *out. `regrow` (not null): once the others train without it (the
  // loss's resize took effect: another is refused until then), `trellis-launch resize` back to
  // spec.workers, its output there.
  std::optional<ExitStatus> KillWorkerOneForGood(const std::string& job, MlpJob spec, int64_t step,
                                                 std::string* out, std::string* regrow = nullptr) {
    spec.worker_restart = "Never";
    auto launch = StartAndWaitForStep(job, spec, step);
    if (launch == nullptr) return std::nullopt;
    const pid_t program = WorkerProgram(job, 1);
    EXPECT_GT(program, 0);
    if (program > 0) {
      EXPECT_EQ(::kill(program, SIGKILL), 0);
    }
    if (regrow != nullptr) {
      WaitForText(dir_ + "/" + job + ".out", "trellis-mlp: resized to " + std::to_string(spec.workers - 1) + " worker(s)",
                  60s);
      EXPECT_EQ(Resize(job, spec.workers, regrow), 0) << *regrow;
    }
    auto st = launch->WaitFor(200s);
    *out = ReadFile(dir_ + "/" + job + ".out");
    return st;
  }

  // Growing (docs/elastic.md#growing): `first` workers resized through `sizes` while they train
  // (elastic 1..4). A grow brings in the lowest slots outside the world -- those a shrink left
  // (trellis-launch starts their agents again) and, beyond the job's first size, slots never used
  // (their agents start for the first time); each joiner takes the model from a live worker and
  // joins at the step the members agree on. The job reaches its target, the workers of each world
  // end their epochs together (the MLP sums its statistics over the world at each epoch's end: a
  // joiner that counted its epoch otherwise would hang it), and the last world (1 worker) trains
  // on to the job's end. `kill_slot` >= 0: that worker's program is SIGKILLed once the first grow
  // that has it trained a while; its agent restarts it (OnFailure) and it rejoins the world it
  // was in with its rank (docs/elastic.md#what-survives-what).
  void ResizesWhileTrainingAndReachesTheTarget(const char* server_mode, int first, const std::vector<int>& sizes,
                                               int kill_slot = -1) {
    const std::string job = NewJob(std::string("el-grow-") + server_mode);
    MlpJob spec = Spec(job, server_mode);
    spec.workers = first;
    spec.elastic = "{minWorkers: 1, maxWorkers: 4}";
    spec.train_samples = 16384;  // 128 steps per epoch with 4 workers
    spec.rank0_step_sleep_ms = 12;
    if (kill_slot >= 0) spec.worker_restart = "OnFailure";
    auto launch = StartAndWaitForStep(job, spec, 32);
    ASSERT_NE(launch, nullptr);
    std::string out;
    std::vector<int> from_steps;
    bool killed = false;
    for (const int to : sizes) {
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
      if (kill_slot >= 0 && !killed && to > kill_slot) {
        const pid_t program = WorkerProgram(job, kill_slot);
        ASSERT_GT(program, 0);
        ASSERT_EQ(::kill(program, SIGKILL), 0);
        killed = true;
        const std::string wl = dir_ + "/logs-" + job + "/worker-" + std::to_string(kill_slot) + ".log";
        const auto rejoined = [&] {
          const std::string l = ReadFile(wl);
          size_t n = 0;
          for (size_t at = l.find("rejoined the running job"); at != std::string::npos;
               at = l.find("rejoined the running job", at + 1)) {
            ++n;
          }
          return n;
        };
        const auto by = std::chrono::steady_clock::now() + 90s;
        while (std::chrono::steady_clock::now() < by && rejoined() < 2) std::this_thread::sleep_for(20ms);
        ASSERT_GE(rejoined(), 2u) << "worker " << kill_slot << " restarted but did not rejoin\n" << ReadFile(wl)
                                  << ReadFile(dir_ + "/" + job + ".out");
        std::printf("worker %d killed in world %zu and rejoined\n", kill_slot, from_steps.size());
      }
    }
    EXPECT_EQ(killed, kill_slot >= 0);
    auto st = launch->WaitFor(240s);
    const std::string log = ReadFile(dir_ + "/" + job + ".out");
    ASSERT_TRUE(st.has_value()) << log;
    EXPECT_EQ(st->exit_code, 0) << log;
    EXPECT_NE(log.find("RESULT: test accuracy"), std::string::npos) << log;
    EXPECT_NE(log.find("-- reached"), std::string::npos) << log;
    EXPECT_NE(log.find(", 1 worker(s), 3 epochs"), std::string::npos) << log;
    auto newest = CheckpointDir(spec.checkpoint, "model", 2).LoadNewest();
    ASSERT_TRUE(newest.ok()) << newest.status().ToString();
    EXPECT_GT(newest->checkpoint.step, from_steps.back());
    int world = first;
    std::vector<bool> ran(4, false);
    std::vector<int> program_starts(4, 0);
    for (int w = 0; w < first; ++w) {
      ran[w] = true;
      program_starts[w] = 1;
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int to = sizes[i];
      EXPECT_NE(log.find("trellis-mlp: resized to " + std::to_string(to) + " worker(s) from step " +
                         std::to_string(from_steps[i])),
                std::string::npos)
          << to << "\n" << log;
      // The joiners (ranks world..to-1) took the members' commit of the step before the new
      // world's first; a slot never used before starts for the first time.
      for (int w = world; w < to; ++w) {
        const std::string starts = std::string("trellis-launch: worker-") + std::to_string(w) +
                                   (ran[w] ? " starts again" : " starts") + ": the job grows to " +
                                   std::to_string(to) + " workers";
        EXPECT_NE(log.find(starts), std::string::npos) << starts << "\n" << log;
        ran[w] = true;
        const std::string wl = ReadFile(dir_ + "/logs-" + job + "/worker-" + std::to_string(w) + ".log");
        EXPECT_NE(wl.find("joins world " + std::to_string(i + 1) + " from step " + std::to_string(from_steps[i])),
                  std::string::npos)
            << w << ":\n" << wl;
        EXPECT_NE(wl.find("rejoined the running job after step " + std::to_string(from_steps[i] - 1)), std::string::npos)
            << w << ":\n" << wl;
        ++program_starts[w];
      }
      world = to;
    }
    // Each joiner's program joined at its first start (none failed and was restarted into the
    // job instead): one start per world that had it, and one for the kill.
    if (kill_slot >= 0) ++program_starts[kill_slot];
    for (int w = 0; w < 4; ++w) {
      const std::string wl = ReadFile(dir_ + "/logs-" + job + "/worker-" + std::to_string(w) + ".log");
      size_t n = 0;
      for (size_t at = wl.find(": starting "); at != std::string::npos; at = wl.find(": starting ", at + 1)) ++n;
      EXPECT_EQ(n, static_cast<size_t>(program_starts[w])) << "program starts of worker " << w << "\n" << wl;
    }
    for (int w = 0; w < 4; ++w) {
      EXPECT_EQ(log.find("trellis-launch: worker-" + std::to_string(w) + " starts") != std::string::npos ||
                    w < first,
                ran[w])
          << "worker " << w << " ran only if a world had it\n" << log;
    }
  }
};

TEST_F(ElasticTest, AggregateModeShrinksTwoToOneMidTrainingAndReachesTheTarget) {
  ShrinksMidTrainingAndReachesTheTarget("aggregate");
}

TEST_F(ElasticTest, UpdateModeShrinksTwoToOneMidTrainingAndReachesTheTarget) {
  ShrinksMidTrainingAndReachesTheTarget("update");
}

// Grown back to 3 of the 4 it started with: the joiner's world is smaller than the job's first,
// and it still declares the keys the others did (the MLP's per-rank statistics keys).
TEST_F(ElasticTest, AggregateModeFourShrunkToTwoGrownToThreeThenShrunkToOneReachesTheTarget) {
  ResizesWhileTrainingAndReachesTheTarget("aggregate", 4, {2, 3, 1});
}

// The schedule: beyond the job's first size into slots never used (2 -> 4), then to 1.
// Worker 3, a rank the job never used before the grow, is killed in the world of 4: it rejoins.
TEST_F(ElasticTest, UpdateModeTwoGrownToFourThenShrunkToOneReachesTheTarget) {
  ResizesWhileTrainingAndReachesTheTarget("update", 2, {4, 1}, /*kill_slot=*/3);
}

// The shipped example (examples/mlp-elastic.yaml) as docs/elastic.md runs it: 2 workers grown to
// 4 while they train, then shrunk to 1; the job succeeds with its target reached.
TEST_F(ElasticTest, TheShippedExampleGrowsToFourAndShrinksToOneAsTheDocsSay) {
  std::string yaml = ReadFile(std::string(TRELLIS_SOURCE_DIR) + "/examples/mlp-elastic.yaml");
  const std::string job = NewJob("mlp-elastic");
  const std::string shipped_name = "name: mlp-elastic\n";
  ASSERT_NE(yaml.find(shipped_name), std::string::npos) << yaml;
  yaml.replace(yaml.find(shipped_name), shipped_name.size(), "name: " + job + "\n");
  auto launch = StartLaunch(TRELLIS_BIN_DIR, dir_, job, yaml);
  ASSERT_TRUE(launch.ok()) << launch.status().ToString();
  const std::string log = dir_ + "/" + job + ".out";
  WaitForText(log, "epoch 1/", 120s);
  ASSERT_NE(ReadFile(log).find("elastic (1 to 4 workers): resize with trellis-launch resize"), std::string::npos)
      << ReadFile(log);
  std::string out;
  ASSERT_EQ(Resize(job, 4, &out), 0) << out << ReadFile(log);
  EXPECT_NE(out.find("2 -> 4 workers asked for"), std::string::npos) << out;
  ASSERT_EQ(Resize(job, 1, &out), 0) << out << ReadFile(log);
  auto st = (*launch)->WaitFor(240s);
  const std::string text = ReadFile(log);
  ASSERT_TRUE(st.has_value()) << text;
  EXPECT_EQ(st->exit_code, 0) << text;
  EXPECT_NE(text.find("trellis-launch: worker-3 starts: the job grows to 4 workers"), std::string::npos) << text;
  EXPECT_NE(text.find("trellis-mlp: resized to 4 worker(s)"), std::string::npos) << text;
  EXPECT_NE(text.find("-- reached"), std::string::npos) << text;
  EXPECT_NE(text.find(", 1 worker(s), "), std::string::npos) << text;
}

// Losing a worker for good (docs/elastic.md#losing-a-worker): under restartPolicy Never nothing
// restarts a worker killed mid-training. With spec.elastic the job goes on without it: the
// servers stop waiting for its pushes, the other two resize to 2 at a boundary they agree on.
// A grow back to 3 then starts the lost rank again (its replacement) and it joins; the job
// reaches its target. With minWorkers 2 of 2 the loss fails the job, saying why.
TEST_F(ElasticTest, AWorkerKilledForGoodUnderNeverIsLostTheJobGoesOnAndAGrowReplacesIt) {
  const std::string job = NewJob("el-lost");
  const MlpJob spec = ThreeOfMinTwo(job);
  std::string out, regrow;
  const auto st = KillWorkerOneForGood(job, spec, 32, &out, &regrow);
  ASSERT_TRUE(st.has_value()) << out;
  EXPECT_EQ(st->exit_code, 0) << out;
  EXPECT_NE(out.find("trellis-launch: worker-1 lost ("), std::string::npos) << out;
  EXPECT_NE(out.find("): the job goes on without it (spec.elastic"), std::string::npos) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("trellis-mlp: resized to 2 worker\\(s\\) from step ([0-9]+)"))) << out;
  std::printf("worker 1 of 3 lost: the other two from step %s\n", m[1].str().c_str());
  ASSERT_TRUE(std::regex_search(regrow, m, std::regex("3 workers from step ([0-9]+)"))) << regrow;
  const std::string back_from = m[1];
  EXPECT_NE(out.find("trellis-launch: worker-1 starts again: the job grows to 3 workers"), std::string::npos) << out;
  EXPECT_NE(out.find("trellis-mlp: resized to 3 worker(s) from step " + back_from), std::string::npos) << out;
  const std::string replacement = ReadFile(dir_ + "/logs-" + job + "/worker-1.log");
  EXPECT_NE(replacement.find("joins world 2 from step " + back_from), std::string::npos) << replacement;
  EXPECT_NE(out.find("RESULT: test accuracy"), std::string::npos) << out;
  EXPECT_NE(out.find("-- reached"), std::string::npos) << out;
  EXPECT_NE(out.find(", 3 worker(s), "), std::string::npos) << "the result names the world at the end\n" << out;
  const std::string sched = ReadFile(dir_ + "/logs-" + job + "/scheduler.log");
  EXPECT_NE(sched.find("worker 1 (pod " + job + "-worker-1) failed: exit code 137"), std::string::npos) << sched;
  EXPECT_NE(sched.find("the job goes on without it (spec.elastic)"), std::string::npos) << sched;
  bool server_told = false;
  for (int s = 0; s < 2; ++s) {
    server_told = server_told || ReadFile(dir_ + "/logs-" + job + "/server-" + std::to_string(s) + ".log")
                                         .find("worker 1 lost for good") != std::string::npos;
  }
  EXPECT_TRUE(server_told) << "the servers stop waiting for its pushes";
}

TEST_F(ElasticTest, AWorkerKilledForGoodBelowMinWorkersFailsTheJobNamingMinWorkers) {
  const std::string job = NewJob("el-lost-min");
  MlpJob spec = Spec(job, "aggregate");
  spec.elastic = "{minWorkers: 2, maxWorkers: 3}";
  std::string out;
  const auto st = KillWorkerOneForGood(job, spec, 16, &out);
  ASSERT_TRUE(st.has_value()) << out;
  EXPECT_NE(st->exit_code, 0) << out;
  EXPECT_NE(out.find("fewer than spec.elastic.minWorkers (2)"), std::string::npos) << out;
}

// A worker that falls silent (its node gone, its processes frozen: here its agent and program
// SIGSTOPped) neither exits nor heartbeats: nothing reports it. With spec.elastic the scheduler
// marks it dead after heartbeatTimeoutSeconds, the others wait for it as for one restarting, and
// past registrationTimeoutSeconds it is lost: the others go on without it, and trellis-launch
// stops the frozen processes (docs/elastic.md#losing-a-worker).
TEST_F(ElasticTest, AWorkerSilentPastTheRegistrationTimeoutIsLostAndTheJobGoesOn) {
  const std::string job = NewJob("el-silent");
  MlpJob spec = ThreeOfMinTwo(job);
  spec.scheduler = "    heartbeatIntervalSeconds: 0.5\n    heartbeatTimeoutSeconds: 3\n    registrationTimeoutSeconds: 5\n";
  auto launch = StartAndWaitForStep(job, spec, 32);
  ASSERT_NE(launch, nullptr);
  const pid_t program = WorkerProgram(job, 1);
  ASSERT_GT(program, 0);
  const pid_t agent = ParentOf(program);  // its agent
  ASSERT_GT(agent, 1);
  const auto t_stop = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(agent, SIGSTOP), 0);
  ASSERT_EQ(::kill(program, SIGSTOP), 0);
  const std::string log = dir_ + "/" + job + ".out";
  WaitForText(log, "trellis-mlp: resized to 2 worker(s)", 60s);
  const double to_world =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_stop).count();
  auto st = launch->WaitFor(200s);
  const std::string out = ReadFile(log);
  if (!st) {  // do not leave frozen processes behind
    ::kill(program, SIGKILL);
    ::kill(agent, SIGKILL);
  }
  ASSERT_TRUE(st.has_value()) << out;
  EXPECT_EQ(st->exit_code, 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("trellis-mlp: resized to 2 worker\\(s\\) from step ([0-9]+)"))) << out;
  std::printf("worker 1 of 3 frozen (SIGSTOP): the other two from step %s, %.1f s after the stop "
              "(heartbeat timeout 3 s, registration timeout 5 s)\n",
              m[1].str().c_str(), to_world);
  EXPECT_NE(out.find("trellis-launch: worker-1 lost (worker 1 (pod " + job + "-worker-1) was silent for"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("): stopped it; the job goes on without it (spec.elastic"), std::string::npos) << out;
  EXPECT_NE(out.find("-- reached"), std::string::npos) << out;
  EXPECT_NE(out.find(", 2 worker(s), "), std::string::npos) << "the result names the world at the end\n" << out;
  const std::string sched = ReadFile(dir_ + "/logs-" + job + "/scheduler.log");
  EXPECT_NE(sched.find("did not come back within registrationTimeoutSeconds (5.0 s)"), std::string::npos) << sched;
  EXPECT_NE(sched.find("the job goes on without it (spec.elastic)"), std::string::npos) << sched;
  EXPECT_TRUE(WaitNoProcessesOfJob(job).empty()) << "the frozen agent and program were stopped";
}

// A late replacement (docs/elastic.md#losing-a-worker): worker 1's program is killed under
// OnFailure and its restart takes longer than registrationTimeoutSeconds (its wrapper sleeps 7 s
// first, as a slow image pull or data load would), so the scheduler loses it and the other two
// train on. When the program comes up it asks to join, and the world grows back to 3 without
// anyone resizing it; the job reaches its target with 3.
TEST_F(ElasticTest, ALostWorkerWhoseRestartComesLateGrowsTheWorldBack) {
  const std::string job = NewJob("el-late");
  MlpJob spec = ThreeOfMinTwo(job);
  spec.worker_restart = "OnFailure";
  spec.scheduler = "    registrationTimeoutSeconds: 3\n";
  const std::string slow = dir_ + "/" + job + ".slow";
  spec.command = "[sh, -c, \"if [ -e " + slow + " ]; then sleep 7; fi; exec trellis-mlp \\\"$@\\\"\", trellis-mlp]";
  auto launch = StartAndWaitForStep(job, spec, 32);
  ASSERT_NE(launch, nullptr);
  const pid_t program = WorkerProgram(job, 1);
  ASSERT_GT(program, 0);
  { FILE* f = std::fopen(slow.c_str(), "w"); ASSERT_NE(f, nullptr); std::fclose(f); }
  const auto t_kill = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(program, SIGKILL), 0);
  const std::string log = dir_ + "/" + job + ".out";
  ASSERT_TRUE(WaitForText(log, "trellis-mlp: resized to 2 worker(s)", 60s)) << ReadFile(log);
  const double lost_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_kill).count();
  ASSERT_TRUE(WaitForText(log, "trellis-mlp: resized to 3 worker(s)", 90s)) << ReadFile(log);
  const double back_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_kill).count();
  auto st = launch->WaitFor(200s);
  const std::string out = ReadFile(log);
  ASSERT_TRUE(st.has_value()) << out;
  EXPECT_EQ(st->exit_code, 0) << out;
  std::printf("worker 1 of 3 killed, its restart 7 s late (registration timeout 3 s): world of 2 %.1f s after "
              "the kill, grown back to 3 %.1f s after it\n",
              lost_after, back_after);
  EXPECT_NE(out.find("-- reached"), std::string::npos) << out;
  EXPECT_NE(out.find(", 3 worker(s), "), std::string::npos) << "the result names the world at the end\n" << out;
  const std::string sched = ReadFile(dir_ + "/logs-" + job + "/scheduler.log");
  EXPECT_NE(sched.find("was restarted and its program did not come back within 3 s"), std::string::npos) << sched;
  EXPECT_NE(sched.find("worker 1 came back after it was lost: growing the world back to 3 workers"), std::string::npos)
      << sched;
  const std::string w1 = ReadFile(dir_ + "/logs-" + job + "/worker-1.log");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("trellis-mlp: resized to 3 worker\\(s\\) from step ([0-9]+)"))) << out;
  EXPECT_NE(w1.find("rejoined the running job after step " + std::to_string(std::stoi(m[1]) - 1)), std::string::npos)
      << w1;
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
  // The job has ended: its run directory is still there, its scheduler is not.
  EXPECT_EQ(Resize(job, 1, &out), 1) << out;
  EXPECT_NE(out.find("the job's scheduler does not answer: has the job ended?"), std::string::npos) << out;
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
  WaitForText(dir_ + "/" + job + ".out", left, 60s);
  ASSERT_NE(ReadFile(dir_ + "/" + job + ".out").find(left), std::string::npos) << ReadFile(dir_ + "/" + job + ".out");

  const pid_t scheduler = SchedulerOf(job);
  ASSERT_GT(scheduler, 0);
  ASSERT_EQ(::kill(scheduler, SIGKILL), 0);
  const std::string log = dir_ + "/logs-" + job + "/scheduler.log";
  WaitForText(log, "recovered the running job after a scheduler restart", 60s);
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

// A scheduler restarted after a loss (docs/elastic.md#what-survives-what): worker 1 of 3 lost
// for good under Never, the world of 2 trained, then the scheduler SIGKILLed. The new one takes
// the world back from the workers ({0, 2}) and does not wait for the lost worker to register:
// the job recovers with 2 and reaches its target.
TEST_F(ElasticTest, TheSchedulerKilledAfterALossRecoversTheWorldWithoutTheLostWorker) {
  const std::string job = NewJob("el-sched-loss");
  MlpJob spec = ThreeOfMinTwo(job);
  spec.epochs = 6;
  std::string out;
  spec.worker_restart = "Never";
  auto launch = StartAndWaitForStep(job, spec, 32);
  ASSERT_NE(launch, nullptr);
  const pid_t program = WorkerProgram(job, 1);
  ASSERT_GT(program, 0);
  ASSERT_EQ(::kill(program, SIGKILL), 0);
  const std::string job_log = dir_ + "/" + job + ".out";
  ASSERT_TRUE(WaitForText(job_log, "trellis-mlp: resized to 2 worker(s)", 60s)) << ReadFile(job_log);
  const pid_t scheduler = SchedulerOf(job);
  ASSERT_GT(scheduler, 0);
  ASSERT_EQ(::kill(scheduler, SIGKILL), 0);
  const std::string log = dir_ + "/logs-" + job + "/scheduler.log";
  ASSERT_TRUE(WaitForText(log, "recovered the running job after a scheduler restart", 60s))
      << ReadFile(log).substr(ReadFile(log).size() > 6000 ? ReadFile(log).size() - 6000 : 0);
  auto st = launch->WaitFor(200s);
  out = ReadFile(job_log);
  ASSERT_TRUE(st.has_value()) << out;
  EXPECT_EQ(st->exit_code, 0) << out << ReadFile(log);
  EXPECT_NE(out.find("-- reached"), std::string::npos) << out;
  EXPECT_NE(out.find(", 2 worker(s), "), std::string::npos) << out;
  EXPECT_NE(ReadFile(log).find("recovered the running job after a scheduler restart: all 2 servers and 2 workers"),
            std::string::npos)
      << ReadFile(log);
}

// A parameter server killed as a worker is lost (docs/elastic.md#what-survives-what): worker 1 of
// 3 SIGKILLed for good (Never) and server 1 SIGKILLed with it (OnFailure: its agent restarts
// it). The server rebuilds from its checkpoint and the others' replayed pushes without waiting
// for the lost worker's, and the job reaches its target with 2.
TEST_F(ElasticTest, AServerKilledAsAWorkerIsLostRebuildsWithoutTheLostWorker) {
  const std::string job = NewJob("el-srv-loss");
  MlpJob spec = ThreeOfMinTwo(job);
  spec.worker_restart = "Never";
  spec.server_restart = "OnFailure";
  auto launch = StartAndWaitForStep(job, spec, 48);
  ASSERT_NE(launch, nullptr);
  const pid_t worker = WorkerProgram(job, 1);
  const pid_t server = ProgramOf(job, "server", 1);
  ASSERT_GT(worker, 0);
  ASSERT_GT(server, 0);
  ASSERT_EQ(::kill(worker, SIGKILL), 0);
  ASSERT_EQ(::kill(server, SIGKILL), 0);
  auto st = launch->WaitFor(200s);
  const std::string out = ReadFile(dir_ + "/" + job + ".out");
  ASSERT_TRUE(st.has_value()) << out;
  EXPECT_EQ(st->exit_code, 0) << out << ReadFile(dir_ + "/logs-" + job + "/server-1.log");
  EXPECT_NE(out.find("-- reached"), std::string::npos) << out;
  EXPECT_NE(out.find(", 2 worker(s), "), std::string::npos) << out;
  EXPECT_NE(out.find("trellis-launch: worker-1 lost"), std::string::npos) << out;
}

}  // namespace
}  // namespace trellis
