// Elastic servers (docs/elastic.md#servers): trellis-mlp under trellis-launch, its parameter
// servers resized by `trellis-launch resize RUN_DIR --servers N` while it trains, as a user does.
// 2 -> 3 -> 1 servers with 2 workers: the added server's agent starts, every slice the new maps
// give another server moves there between two steps, the removed servers exit 0, and the job
// ends with the very model of the same job left alone (aggregate mode: weights and momentum;
// update mode: the servers' weights, their Adam moments moved with them).
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/checkpoint/checkpoint_dir.h"
#include "common/process/subprocess.h"
#include "tests/integration/fault/mlp_outcome.h"
#include "tests/integration/job_processes.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

class ElasticServersTest : public LaunchedJobsTest {
 protected:
  // `trellis-launch resize <run dir of job> --servers <servers>`: its exit code; its output in *out.
  int ResizeServers(const std::string& job, int servers, std::string* out) {
    return RunLauncherResize(TRELLIS_BIN_DIR, dir_ + "/logs-" + job, {"--servers", std::to_string(servers)},
                             dir_ + "/" + job + ".resize.out", out);
  }

  // Waits (at most a minute) until the job's newest checkpoint is at `step` or later.
  static bool WaitForCheckpoint(const std::string& dir, int64_t step, Subprocess* launch) {
    CheckpointDir d(dir, "model", 2);
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < deadline && !launch->Poll().has_value()) {
      auto steps = d.Steps();
      if (steps.ok() && !steps->empty() && steps->front() >= step) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  // 2 servers x 2 workers, the servers elastic 1..3; rank 0 sleeps each step so the resizes land
  // mid-training (the results do not change). 384 steps, a checkpoint every 16.
  MlpJob Spec(const std::string& job, const char* server_mode) {
    MlpJob j;
    j.elastic = "{minWorkers: 2, maxWorkers: 2, minServers: 1, maxServers: 3}";
    j.rank0_step_sleep_ms = 20;
    j.checkpoint = dir_ + "/ckpt-" + job;
    j.interval_steps = 16;
    j.server_mode = server_mode;
    return j;
  }

  // The same job run undisturbed to the end (the model the other is compared with: its spec in
  // *still), then started again as "<prefix>-<mode>" and trained to step 48: its name in *job,
  // its spec in *spec, its trellis-launch in *launch. Both give the servers `server_restart`.
  void StartBesideTheUndisturbed(const std::string& prefix, const char* server_mode, const char* server_restart,
                                 MlpJob* still, std::string* job, MlpJob* spec,
                                 std::unique_ptr<Subprocess>* launch) {
    const std::string still_name = NewJob(prefix + "-still-" + server_mode);
    *still = Spec(still_name, server_mode);
    still->server_restart = server_restart;
    {
      auto run = StartLaunch(TRELLIS_BIN_DIR, dir_, still_name, MlpJobYaml(still_name, *still));
      ASSERT_TRUE(run.ok()) << run.status().ToString();
      auto st = (*run)->WaitFor(200s);
      ASSERT_TRUE(st.has_value() && st->exit_code == 0) << ReadFile(dir_ + "/" + still_name + ".out");
    }
    *job = NewJob(prefix + "-" + server_mode);
    *spec = Spec(*job, server_mode);
    spec->server_restart = server_restart;
    auto run = StartLaunch(TRELLIS_BIN_DIR, dir_, *job, MlpJobYaml(*job, *spec));
    ASSERT_TRUE(run.ok()) << run.status().ToString();
    *launch = std::move(*run);
    ASSERT_TRUE(WaitForCheckpoint(spec->checkpoint, 48, launch->get())) << ReadFile(dir_ + "/" + *job + ".out");
  }

  // A server a grow added killed after the resize (the tests below).
  void KillAnAddedServer(const char* server_mode);
  // Server 1 killed for good under restartPolicy Never: taken over by server 0's pod.
  void LoseAServerForGood(const char* server_mode);

  // The same job undisturbed and resized to each count of `schedule` in turn (each new world
  // trains 32 steps before the next resize), both run to the end and ending with the same model,
  // bit for bit. The resized job's name in *job_name, its output in *job_text and the step each
  // world started at in *world_steps.
  void ResizedEndsWithTheUndisturbedModel(const char* server_mode, const std::vector<int>& schedule,
                                          std::string* job_name, std::string* job_text,
                                          std::vector<int>* world_steps) {
    // The undisturbed run first: the same job, never resized.
    const std::string still = NewJob(std::string("srv-still-") + server_mode);
    const MlpJob still_spec = Spec(still, server_mode);
    {
      auto launch = StartLaunch(TRELLIS_BIN_DIR, dir_, still, MlpJobYaml(still, still_spec));
      ASSERT_TRUE(launch.ok()) << launch.status().ToString();
      auto st = (*launch)->WaitFor(200s);
      ASSERT_TRUE(st.has_value() && st->exit_code == 0) << ReadFile(dir_ + "/" + still + ".out");
    }

    const std::string job = NewJob(std::string("srv-") + server_mode);
    const MlpJob spec = Spec(job, server_mode);
    auto launch = StartLaunch(TRELLIS_BIN_DIR, dir_, job, MlpJobYaml(job, spec));
    ASSERT_TRUE(launch.ok()) << launch.status().ToString();
    const std::string log = dir_ + "/" + job + ".out";
    ASSERT_TRUE(WaitForCheckpoint(spec.checkpoint, 48, launch->get())) << ReadFile(log);
    *job_name = job;
    std::vector<int>& from_steps = *world_steps;
    for (const int to : schedule) {
      std::string out;
      ASSERT_EQ(ResizeServers(job, to, &out), 0) << out << ReadFile(log);
      std::smatch m;
      ASSERT_TRUE(std::regex_search(out, m, std::regex("trellis-launch resize: " + std::to_string(to) +
                                                       " servers from step ([0-9]+) \\(decided ([0-9.]+) s after")))
          << out;
      from_steps.push_back(std::stoi(m[1]));
      std::printf("%s mode, servers to %d: decided %s s after the request, from step %s\n", server_mode, to,
                  m[2].str().c_str(), m[1].str().c_str());
      // The new servers serve a while before the next resize.
      ASSERT_TRUE(WaitForCheckpoint(spec.checkpoint, from_steps.back() + 32, launch->get())) << ReadFile(log);
    }
    auto st = (*launch)->WaitFor(200s);
    const std::string text = ReadFile(log);
    *job_text = text;
    ASSERT_TRUE(st.has_value()) << text;
    EXPECT_EQ(st->exit_code, 0) << text;
    EXPECT_NE(text.find("-- reached"), std::string::npos) << text;
    // Every step's sum is the undisturbed one: the same model at the end, bit for bit.
    ExpectSameFinalModel(still_spec.checkpoint, spec.checkpoint, 384, "servers resized");
  }

  void TwoToThreeToOneEndsWithTheUndisturbedModel(const char* server_mode) {
    std::string job, text;
    std::vector<int> from_steps;
    ASSERT_NO_FATAL_FAILURE(ResizedEndsWithTheUndisturbedModel(server_mode, {3, 1}, &job, &text, &from_steps));
    EXPECT_NE(text.find("trellis-launch: server-2 starts: the job grows to 3 servers"), std::string::npos) << text;
    EXPECT_NE(text.find("trellis-launch: server-1 left the job: resized away"), std::string::npos) << text;
    EXPECT_NE(text.find("trellis-launch: server-2 left the job: resized away"), std::string::npos) << text;
    const std::string w0 = ReadFile(dir_ + "/logs-" + job + "/worker-0.log");
    EXPECT_NE(w0.find("world 1 from step " + std::to_string(from_steps[0]) + ": rank 0 of 2, 3 servers"),
              std::string::npos)
        << w0;
    EXPECT_NE(w0.find("world 2 from step " + std::to_string(from_steps[1]) + ": rank 0 of 2, 1 servers"),
              std::string::npos)
        << w0;
    const std::string s2 = ReadFile(dir_ + "/logs-" + job + "/server-2.log");
    EXPECT_NE(s2.find("server 2 resized away in world 2"), std::string::npos) << s2;
  }
};

TEST_F(ElasticServersTest, AggregateModeTwoToThreeToOneServersEndsWithTheUndisturbedModelBitForBit) {
  TwoToThreeToOneEndsWithTheUndisturbedModel("aggregate");
}

TEST_F(ElasticServersTest, UpdateModeTwoToThreeToOneServersEndsWithTheUndisturbedModelBitForBit) {
  TwoToThreeToOneEndsWithTheUndisturbedModel("update");
}

// Growing back into a rank a shrink removed (docs/elastic.md#servers): 2 -> 1 -> 3 servers in
// update mode. Server 1 exits after 2 -> 1; the grow starts its agent again as a fresh server,
// and the weights and Adam moments handed to it are the undisturbed ones, bit for bit.
TEST_F(ElasticServersTest, UpdateModeServersShrunkAndGrownBackIntoTheRemovedRankEndWithTheUndisturbedModel) {
  std::string job, text;
  std::vector<int> from_steps;
  ASSERT_NO_FATAL_FAILURE(ResizedEndsWithTheUndisturbedModel("update", {1, 3}, &job, &text, &from_steps));
  EXPECT_NE(text.find("trellis-launch: server-1 left the job: resized away"), std::string::npos) << text;
  EXPECT_NE(text.find("trellis-launch: server-1 starts again: the job grows to 3 servers"), std::string::npos)
      << text;
  EXPECT_NE(text.find("trellis-launch: server-2 starts: the job grows to 3 servers"), std::string::npos) << text;
}

// A server a grow adds whose program fails before it is ready (restartPolicy Never; here its
// command exits 3 for rank 2, as a node without room might): the scheduler gives the grow up at
// once, naming it, `trellis-launch resize` exits 1 saying so, and the job goes on with its 2
// servers to its end, its model the undisturbed one.
TEST_F(ElasticServersTest, AServerAGrowAddsThatFailsGivesTheGrowUpNotTheJob) {
  const std::string job = NewJob("srv-fail");
  MlpJob spec = Spec(job, "aggregate");
  std::string yaml = MlpJobYaml(job, spec);
  const std::string servers = "  servers:\n    replicas: 2\n";
  ASSERT_NE(yaml.find(servers), std::string::npos) << yaml;
  yaml.replace(yaml.find(servers), servers.size(),
               servers + "    command: [sh, -c, 'if [ \"$TRELLIS_RANK\" = 2 ]; then echo \"server 2: no room\" >&2; "
                         "exit 3; fi; exec trellis-pserver', sh]\n");
  auto launch = StartLaunch(TRELLIS_BIN_DIR, dir_, job, yaml);
  ASSERT_TRUE(launch.ok()) << launch.status().ToString();
  const std::string log = dir_ + "/" + job + ".out";
  ASSERT_TRUE(WaitForCheckpoint(spec.checkpoint, 48, launch->get())) << ReadFile(log);
  std::string out;
  EXPECT_EQ(ResizeServers(job, 3, &out), 1) << out << ReadFile(log);
  EXPECT_NE(out.find("gave the resize up"), std::string::npos) << out;
  auto st = (*launch)->WaitFor(200s);
  const std::string text = ReadFile(log);
  ASSERT_TRUE(st.has_value()) << text;
  EXPECT_EQ(st->exit_code, 0) << text;
  EXPECT_NE(text.find("-- reached"), std::string::npos) << text;
  EXPECT_NE(text.find("trellis-launch: server-2 ended outside the job's world (exited with code 3"), std::string::npos)
      << text;
  const std::string sched = ReadFile(dir_ + "/logs-" + job + "/scheduler.log");
  EXPECT_NE(sched.find("resize to 3 servers given up: server 2 exited (exit code 3) before it was ready"),
            std::string::npos)
      << sched;
}

// restartPolicy Always (docs/operations.md#restart-policies): a program that ended well is started
// again, but not one a resize took out of the world, nor a worker that finished its training.
// The servers shrunk 2 -> 1 and then the workers 2 -> 1: server 1 and worker 1 exit 0 and their
// agents end with them (before, server 1 was started again and idled outside the world), and the
// job succeeds (before, worker 0, started again after its last step, asked to rejoin a job with
// no live worker and failed it).
TEST_F(ElasticServersTest, UnderRestartPolicyAlwaysWhatAResizeTookOutIsNotStartedAgain) {
  const std::string job = NewJob("srv-always");
  MlpJob spec = Spec(job, "aggregate");
  spec.elastic = "{minWorkers: 1, maxWorkers: 2, minServers: 1, maxServers: 2}";
  spec.server_restart = "Always";
  spec.worker_restart = "Always";
  auto launch = StartLaunch(TRELLIS_BIN_DIR, dir_, job, MlpJobYaml(job, spec));
  ASSERT_TRUE(launch.ok()) << launch.status().ToString();
  const std::string log = dir_ + "/" + job + ".out";
  ASSERT_TRUE(WaitForCheckpoint(spec.checkpoint, 48, launch->get())) << ReadFile(log);
  std::string out;
  ASSERT_EQ(ResizeServers(job, 1, &out), 0) << out << ReadFile(log);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("1 servers from step ([0-9]+)"))) << out;
  ASSERT_TRUE(WaitForCheckpoint(spec.checkpoint, std::stoi(m[1]) + 32, launch->get())) << ReadFile(log);
  ASSERT_EQ(RunLauncherResize(TRELLIS_BIN_DIR, dir_ + "/logs-" + job, {"1"}, dir_ + "/" + job + ".resize-w.out", &out),
            0)
      << out << ReadFile(log);
  auto st = (*launch)->WaitFor(200s);
  const std::string text = ReadFile(log);
  ASSERT_TRUE(st.has_value()) << text;
  EXPECT_EQ(st->exit_code, 0) << text;
  EXPECT_NE(text.find("-- reached"), std::string::npos) << text;
  EXPECT_NE(text.find("trellis-launch: server-1 left the job: resized away"), std::string::npos) << text;
  EXPECT_NE(text.find("trellis-launch: worker-1 left the job: resized away"), std::string::npos) << text;
  const std::string s1 = ReadFile(dir_ + "/logs-" + job + "/server-1.log");
  EXPECT_NE(s1.find("not restarting the program: server 1 was resized away (the job's world has 1 servers)"),
            std::string::npos)
      << s1;
  EXPECT_EQ(s1.find("; restart 1/"), std::string::npos) << s1;
  const std::string w1 = ReadFile(dir_ + "/logs-" + job + "/worker-1.log");
  EXPECT_NE(w1.find("not restarting the program: worker 1 is outside the job's world"), std::string::npos) << w1;
  const std::string w0 = ReadFile(dir_ + "/logs-" + job + "/worker-0.log");
  EXPECT_NE(w0.find("not restarting the program: worker 0 exited 0, its training finished"), std::string::npos) << w0;
  EXPECT_EQ(w0.find("; restart 1/"), std::string::npos) << w0;
}

// A scheduler SIGKILLed after a server resize (docs/elastic.md#what-survives-what): the workers
// hand the world of 3 servers and its map back to the new scheduler, which takes the running job
// back with its 3 servers and resizes them again (3 -> 1). The job reaches its target.
TEST_F(ElasticServersTest, TheSchedulerKilledAfterAServerResizeRecoversTheServersAndResizesAgain) {
  const std::string job = NewJob("srv-sched");
  MlpJob spec = Spec(job, "aggregate");
  spec.worker_restart = "OnFailure";
  auto launch = StartLaunch(TRELLIS_BIN_DIR, dir_, job, MlpJobYaml(job, spec));
  ASSERT_TRUE(launch.ok()) << launch.status().ToString();
  const std::string log = dir_ + "/" + job + ".out";
  ASSERT_TRUE(WaitForCheckpoint(spec.checkpoint, 48, launch->get())) << ReadFile(log);
  std::string out;
  ASSERT_EQ(ResizeServers(job, 3, &out), 0) << out << ReadFile(log);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("3 servers from step ([0-9]+)"))) << out;
  ASSERT_TRUE(WaitForCheckpoint(spec.checkpoint, std::stoi(m[1]) + 16, launch->get())) << ReadFile(log);

  const pid_t scheduler = SchedulerOf(job);
  ASSERT_GT(scheduler, 0);
  ASSERT_EQ(::kill(scheduler, SIGKILL), 0);
  const std::string sched_log = dir_ + "/logs-" + job + "/scheduler.log";
  // The new scheduler learns the world of 3 servers from the first worker that hands its state
  // back (its agents re-register first; the servers beyond the job file's 2 are outside the
  // world until then).
  const auto by = std::chrono::steady_clock::now() + 60s;
  while (ReadFile(sched_log).find("2 workers and 3 servers from step") == std::string::npos &&
         std::chrono::steady_clock::now() < by) {
    std::this_thread::sleep_for(20ms);
  }
  const std::string recovered = ReadFile(sched_log);
  ASSERT_TRUE(std::regex_search(recovered, std::regex("world 1 handed back by worker [01]: 2 workers and 3 servers")))
      << recovered.substr(recovered.size() > 6000 ? recovered.size() - 6000 : 0);

  ASSERT_EQ(ResizeServers(job, 1, &out), 0) << out << ReadFile(sched_log);
  EXPECT_NE(out.find("3 -> 1 servers asked for"), std::string::npos) << out;
  auto st = (*launch)->WaitFor(200s);
  const std::string text = ReadFile(log);
  ASSERT_TRUE(st.has_value()) << text;
  EXPECT_EQ(st->exit_code, 0) << text;
  EXPECT_NE(text.find("-- reached"), std::string::npos) << text;
  EXPECT_NE(text.find("trellis-launch: server-2 left the job: resized away"), std::string::npos) << text;
}

// A server a grow added, killed after the resize (docs/elastic.md#what-survives-what): its agent
// restarts it under OnFailure, the new program takes the job's map of 3 servers, rebuilds its
// slices from the workers' retained pushes, and the job ends with the model of the same job
// left alone, bit for bit (aggregate mode: the rebuilt sums are the sums of the same pushes).
TEST_F(ElasticServersTest, AServerAddedByAGrowKilledIsRebuiltAndTheModelIsTheUndisturbedOne) {
  KillAnAddedServer("aggregate");
}

TEST_F(ElasticServersTest, UpdateModeAServerAddedByAGrowKilledIsRebuiltAndTheModelIsTheUndisturbedOne) {
  KillAnAddedServer("update");
}

void ElasticServersTest::KillAnAddedServer(const char* server_mode) {
  MlpJob still_spec, spec;
  std::string job;
  std::unique_ptr<Subprocess> launch;
  ASSERT_NO_FATAL_FAILURE(
      StartBesideTheUndisturbed("srv-kill", server_mode, "OnFailure", &still_spec, &job, &spec, &launch));
  const std::string log = dir_ + "/" + job + ".out";
  std::string out;
  ASSERT_EQ(ResizeServers(job, 3, &out), 0) << out << ReadFile(log);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("3 servers from step ([0-9]+)"))) << out;
  ASSERT_TRUE(WaitForCheckpoint(spec.checkpoint, std::stoi(m[1]) + 16, launch.get())) << ReadFile(log);
  const pid_t server = ProgramOf(job, "server", 2);
  ASSERT_GT(server, 0);
  ASSERT_EQ(::kill(server, SIGKILL), 0);

  auto st = launch->WaitFor(200s);
  const std::string text = ReadFile(log);
  ASSERT_TRUE(st.has_value()) << text;
  EXPECT_EQ(st->exit_code, 0) << text;
  EXPECT_NE(text.find("-- reached"), std::string::npos) << text;
  const std::string s2 = ReadFile(dir_ + "/logs-" + job + "/server-2.log");
  EXPECT_NE(s2.find("program killed by SIGKILL (code 137); restart 1/"), std::string::npos) << s2;
  EXPECT_NE(s2.find("rebuilt "), std::string::npos) << s2;
  ExpectSameFinalModel(still_spec.checkpoint, spec.checkpoint, 384, "servers 2 -> 3, server 2 killed");
}

// A server lost for good (docs/elastic.md#losing-a-server): under restartPolicy Never nothing
// restarts server 1 once its program is killed, yet with the servers' bounds set the job goes on:
// server 0's pod takes rank 1 over (its agent starts another agent that runs server 1's program
// there), the workers rebuild its slices on it from their retained pushes (in update mode on top
// of its newest checkpoint) and the job ends with the model of the same job left alone, bit for bit.
TEST_F(ElasticServersTest, AServerLostForGoodIsTakenOverByAnotherAndTheModelIsTheUndisturbedOne) {
  LoseAServerForGood("aggregate");
}

TEST_F(ElasticServersTest, UpdateModeAServerLostForGoodIsTakenOverByAnotherAndTheModelIsTheUndisturbedOne) {
  LoseAServerForGood("update");
}

void ElasticServersTest::LoseAServerForGood(const char* server_mode) {
  MlpJob still_spec, spec;
  std::string job;
  std::unique_ptr<Subprocess> launch;
  ASSERT_NO_FATAL_FAILURE(
      StartBesideTheUndisturbed("srv-lost", server_mode, "Never", &still_spec, &job, &spec, &launch));
  const std::string log = dir_ + "/" + job + ".out";
  const pid_t server = ProgramOf(job, "server", 1);
  ASSERT_GT(server, 0);
  ASSERT_EQ(::kill(server, SIGKILL), 0);

  auto st = launch->WaitFor(200s);
  const std::string text = ReadFile(log);
  ASSERT_TRUE(st.has_value()) << text;
  EXPECT_EQ(st->exit_code, 0) << text;
  EXPECT_NE(text.find("-- reached"), std::string::npos) << text;
  EXPECT_NE(text.find("trellis-launch: server-1 lost (exited with code 137): server-0 takes its shards over"),
            std::string::npos)
      << text;
  const std::string s0 = ReadFile(dir_ + "/logs-" + job + "/server-0.log");
  EXPECT_NE(s0.find("taking over server 1 (lost for good"), std::string::npos) << s0;
  EXPECT_NE(s0.find("server 1: rebuilt "), std::string::npos) << s0;
  const std::string sched = ReadFile(dir_ + "/logs-" + job + "/scheduler.log");
  EXPECT_NE(sched.find("server 1 (pod " + job + "-server-1) exited for good: exit code 137 (killed by SIGKILL): "
                       "server 0's pod " + job + "-server-0 takes its shards over"),
            std::string::npos)
      << sched;
  ExpectSameFinalModel(still_spec.checkpoint, spec.checkpoint, 384, "server 1 lost for good, taken over");
}

// The rank taken over, then shrunk away (3 -> 1 would not; 2 -> 1 removes rank 1) and grown
// back: the takeover hands its slices over and ends, server 1's own agent starts again as
// itself, the slices move to it, and the model is still the undisturbed one, bit for bit.
TEST_F(ElasticServersTest, ARankTakenOverThenShrunkAwayAndGrownBackEndsWithTheUndisturbedModel) {
  MlpJob still_spec, spec;
  std::string job;
  std::unique_ptr<Subprocess> launch;
  ASSERT_NO_FATAL_FAILURE(
      StartBesideTheUndisturbed("srv-lost-back", "aggregate", "Never", &still_spec, &job, &spec, &launch));
  const std::string log = dir_ + "/" + job + ".out";
  const pid_t server = ProgramOf(job, "server", 1);
  ASSERT_GT(server, 0);
  ASSERT_EQ(::kill(server, SIGKILL), 0);
  const auto by = std::chrono::steady_clock::now() + 60s;
  while (ReadFile(log).find("server-0 takes its shards over") == std::string::npos &&
         std::chrono::steady_clock::now() < by) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_NE(ReadFile(log).find("server-0 takes its shards over"), std::string::npos) << ReadFile(log);
  // The servers are resized once the takeover serves (rebuilt: every worker replayed to it).
  const std::string s0 = dir_ + "/logs-" + job + "/server-0.log";
  while (ReadFile(s0).find("server 1: rebuilt ") == std::string::npos && std::chrono::steady_clock::now() < by) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_NE(ReadFile(s0).find("server 1: rebuilt "), std::string::npos) << ReadFile(s0);
  for (const int to : {1, 2}) {
    std::string out;
    ASSERT_EQ(ResizeServers(job, to, &out), 0) << out << ReadFile(log);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(out, m, std::regex(std::to_string(to) + " servers from step ([0-9]+)"))) << out;
    ASSERT_TRUE(WaitForCheckpoint(spec.checkpoint, std::stoi(m[1]) + 16, launch.get())) << ReadFile(log);
  }
  auto st = launch->WaitFor(200s);
  const std::string text = ReadFile(log);
  ASSERT_TRUE(st.has_value()) << text;
  EXPECT_EQ(st->exit_code, 0) << text;
  EXPECT_NE(text.find("trellis-launch: server-1 starts again: the job grows to 2 servers"), std::string::npos) << text;
  const std::string s1 = ReadFile(dir_ + "/logs-" + job + "/server-1.log");
  EXPECT_NE(s1.find("server rank 1 incarnation 3: starting"), std::string::npos) << s1;
  ExpectSameFinalModel(still_spec.checkpoint, spec.checkpoint, 384, "server 1 taken over, shrunk away, grown back");
}

// With no other server live to take it over, a server lost for good fails the job, saying so.
TEST_F(ElasticServersTest, AServerLostForGoodWithNoOtherServerFailsTheJobSayingWhy) {
  const std::string job = NewJob("srv-lost-alone");
  MlpJob spec = Spec(job, "aggregate");
  spec.servers = 1;
  spec.elastic = "{minWorkers: 2, maxWorkers: 2, minServers: 1, maxServers: 2}";
  spec.server_restart = "Never";
  auto launch = StartLaunch(TRELLIS_BIN_DIR, dir_, job, MlpJobYaml(job, spec));
  ASSERT_TRUE(launch.ok()) << launch.status().ToString();
  const std::string log = dir_ + "/" + job + ".out";
  ASSERT_TRUE(WaitForCheckpoint(spec.checkpoint, 32, launch->get())) << ReadFile(log);
  const pid_t server = ProgramOf(job, "server", 0);
  ASSERT_GT(server, 0);
  ASSERT_EQ(::kill(server, SIGKILL), 0);
  auto st = (*launch)->WaitFor(120s);
  const std::string text = ReadFile(log);
  ASSERT_TRUE(st.has_value()) << text;
  EXPECT_NE(st->exit_code, 0) << text;
  const std::string sched = ReadFile(dir_ + "/logs-" + job + "/scheduler.log");
  EXPECT_NE(sched.find("no other server is live to take its shards over"), std::string::npos) << sched;
}

}  // namespace
}  // namespace trellis
