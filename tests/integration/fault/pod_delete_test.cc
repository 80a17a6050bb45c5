// A pod deleted or evicted mid-training (docs/kubernetes.md "What survives a pod deletion"),
// locally: the scheduler and one agent per pod as trellis-launch plans them, but started by the
// test so it can do what Kubernetes does to a deleted pod. SIGTERM to the pod's agent (the
// container's main process), which stops its program and exits; then a new agent under the same
// pod name (the replacement pod the operator creates). The job must end as an undisturbed run of
// the same job does: the replacement rejoins under the rank, nothing fails.
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <regex>

#include <gtest/gtest.h>

#include "common/checkpoint/checkpoint_dir.h"
#include "launcher/plan.h"
#include "tests/integration/fault/mlp_outcome.h"
#include "tests/integration/job_processes.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

// mlp-tiny (as the worker kill test): 128 steps per epoch, 3 epochs, a checkpoint every 32.
constexpr int kSteps = 3 * 128;
constexpr int kDeleteAfter = 160;  // mid-epoch 2: the first checkpoint at or after this step

std::string JobYaml(const std::string& name, const std::string& ckpt_dir) {
  // Rank 0 sleeps 15 ms a step: a deleted pod's agent waits up to 2 s for the rest of the job
  // to follow (docs/scheduler.md), and the job must still be training when it stops.
  return MlpJobYaml(name, {.rank0_step_sleep_ms = 15,
                           .checkpoint = ckpt_dir,
                           .run_policy = "    restartPolicy: OnFailure\n    backoffLimit: 2\n"});
}

// One job as Kubernetes would run it: a scheduler, an agent per pod, pods replaced by name.
class LocalPods {
 public:
  LocalPods(const std::string& dir, const std::string& job) : dir_(dir), job_(job) {}
  ~LocalPods() { StopAll(); }

  Status Start() {
    paths_.bin_dir = TRELLIS_BIN_DIR;
    paths_.run_dir = dir_ + "/logs-" + job_;
    std::filesystem::create_directories(paths_.run_dir);
    paths_.job_file = dir_ + "/" + job_ + ".yaml";
    paths_.token_file = paths_.run_dir + "/token";
    std::ofstream(paths_.job_file) << JobYaml(job_, ckpt());
    std::ofstream(paths_.token_file) << "token-" << job_ << "\n";
    TRELLIS_ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpecFile(paths_.job_file));
    auto env = CurrentEnvironment();
    env["TRELLIS_JOB"] = job_;  // so the test's leftover check finds the scheduler too
    ProcessPlan sched = PlanScheduler(paths_, env, job_);
    TRELLIS_ASSIGN_OR_RETURN(scheduler_, Subprocess::Start(sched.spawn));
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    int port = 0;
    while (!(std::ifstream(paths_.run_dir + "/scheduler.port") >> port) || port <= 0) {
      if (std::chrono::steady_clock::now() > deadline || scheduler_->Poll()) {
        return UnavailableError("the scheduler did not start; see " + paths_.run_dir);
      }
      std::this_thread::sleep_for(20ms);
    }
    paths_.scheduler_address = "127.0.0.1:" + std::to_string(port);
    for (ProcessPlan& p : PlanAgents(spec, paths_, env, 3000ms)) {
      // Every output to a file (the launcher would relay workers' stdout from a pipe).
      p.spawn.stdout_mode = SpawnOptions::Output::kFile;
      p.spawn.stdout_path = paths_.run_dir + "/" + p.name + ".log";
      p.spawn.stderr_mode = SpawnOptions::Output::kStdout;
      plans_[p.name] = p;
      TRELLIS_RETURN_IF_ERROR(StartPod(p.name));
    }
    return Status::Ok();
  }

  // What a pod deletion does: SIGTERM to the agent, which must stop its program and exit
  // (bounded); then the replacement pod, a new agent under the same pod name.
  StatusOr<ExitStatus> DeleteAndReplace(const std::string& name) {
    Subprocess& old = *pods_.at(name);
    TRELLIS_RETURN_IF_ERROR(old.Signal(SIGTERM));
    auto st = old.WaitFor(30s);
    if (!st) return DeadlineExceededError("the agent of " + name + " did not exit within 30 s of SIGTERM");
    old_logs_[name] = ReadFile(plans_.at(name).spawn.stdout_path);
    TRELLIS_RETURN_IF_ERROR(StartPod(name));
    return *st;
  }

  // Waits (bounded) for every worker's agent; true when all exited 0.
  bool WorkersSucceed(std::chrono::seconds limit, std::string* why) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (auto& [name, p] : pods_) {
      if (name.rfind("worker-", 0) != 0) continue;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      auto st = p->WaitFor(std::max(left, 0ms));
      if (!st || st->exit_code != 0) {
        *why += name + (st ? " " + st->Describe() : " still running") + "\n" + Logs(name);
        return false;
      }
    }
    return true;
  }

  void StopAll() {
    for (auto& [name, p] : pods_) (void)p->Stop(5000ms);
    pods_.clear();
    if (scheduler_) (void)scheduler_->Stop(5000ms);
    scheduler_.reset();
  }

  // The pod's log: the deleted agent's, then its replacement's.
  std::string Logs(const std::string& name) const {
    auto it = old_logs_.find(name);
    return (it == old_logs_.end() ? "" : it->second + "---- replacement ----\n") +
           ReadFile(plans_.at(name).spawn.stdout_path);
  }
  std::string SchedulerLog() const { return ReadFile(paths_.run_dir + "/scheduler.log"); }
  std::string ckpt() const { return dir_ + "/ckpt-" + job_; }

 private:
  Status StartPod(const std::string& name) {
    TRELLIS_ASSIGN_OR_RETURN(pods_[name], Subprocess::Start(plans_.at(name).spawn));
    return Status::Ok();
  }

  const std::string dir_, job_;
  LaunchPaths paths_;
  std::unique_ptr<Subprocess> scheduler_;
  std::map<std::string, ProcessPlan> plans_;
  std::map<std::string, std::unique_ptr<Subprocess>> pods_;
  std::map<std::string, std::string> old_logs_;
};

class PodDeleteTest : public LaunchedJobsTest {
 protected:
  // Runs the job; with `victim` set, deletes and replaces that pod once a checkpoint at or
  // after kDeleteAfter exists. Returns worker 0's log (it prints the result).
  std::string Run(const std::string& job, const std::string& victim, std::string* scheduler_log,
                  std::string* victim_log) {
    LocalPods pods(dir_, job);
    Status st = pods.Start();
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) return "";
    if (!victim.empty()) {
      CheckpointDir dir(pods.ckpt(), "model", 2);
      const auto deadline = std::chrono::steady_clock::now() + 150s;
      int64_t newest = 0;
      while (newest < kDeleteAfter && std::chrono::steady_clock::now() < deadline) {
        auto steps = dir.Steps();
        newest = steps.ok() && !steps->empty() ? steps->front() : 0;
        std::this_thread::sleep_for(10ms);
      }
      EXPECT_GE(newest, kDeleteAfter) << "no progress to delete a pod at\n" << pods.Logs("worker-0");
      EXPECT_LT(newest, kSteps) << "the job ended before the deletion";
      auto code = pods.DeleteAndReplace(victim);
      EXPECT_TRUE(code.ok()) << code.status().ToString() << "\n" << pods.Logs(victim);
      deleted_after_ = static_cast<int>(newest);
    }
    std::string why;
    EXPECT_TRUE(pods.WorkersSucceed(200s, &why)) << why << "\nscheduler:\n" << pods.SchedulerLog();
    pods.StopAll();
    *scheduler_log = pods.SchedulerLog();
    if (!victim.empty()) *victim_log = pods.Logs(victim);
    return pods.Logs("worker-0");
  }

  // An undisturbed run, then one where `victim`'s pod is deleted and replaced; both must end
  // with the very same weights (aggregate mode loses nothing to either recovery).
  void DeleteAndCompare(const std::string& victim) {
    const std::string whole = NewJob("pdw"), deleted = NewJob("pdd");
    std::string sched_whole, sched_deleted, unused, victim_log;
    const std::string out_whole = Run(whole, "", &sched_whole, &unused);
    ASSERT_FALSE(HasFailure()) << out_whole;
    const std::string out_deleted = Run(deleted, victim, &sched_deleted, &victim_log);
    ASSERT_FALSE(HasFailure()) << out_deleted << "\n" << victim_log << "\nscheduler:\n" << sched_deleted;

    // The scheduler kept the rank for the replacement instead of failing the job.
    EXPECT_TRUE(std::regex_search(sched_deleted, std::regex("was stopped from outside .*keeping its rank")))
        << sched_deleted;
    EXPECT_TRUE(std::regex_search(sched_deleted, std::regex("replacement of the stopped pod \\S+-" + victim +
                                                            " registered")))
        << sched_deleted;
    EXPECT_EQ(sched_deleted.find("job failed"), std::string::npos) << sched_deleted;
    // The deleted agent said why it stopped; the replacement came back under the same rank.
    EXPECT_NE(victim_log.find("after the agent got SIGTERM"), std::string::npos) << victim_log;
    EXPECT_NE(victim_log.find("incarnation 2: starting"), std::string::npos) << victim_log;
    if (victim.rfind("worker-", 0) == 0) {
      std::smatch m;
      ASSERT_TRUE(std::regex_search(victim_log, m, std::regex("rejoined the running job after step ([0-9]+)")))
          << victim_log;
      EXPECT_GE(std::stoi(m[1]), deleted_after_ - 1) << victim_log;
    }

    const double a = MlpAccuracy(out_whole), b = MlpAccuracy(out_deleted);
    ASSERT_GT(a, 0) << out_whole;
    ASSERT_GT(b, 0) << out_deleted;
    EXPECT_NEAR(a, b, 1.0);
    ExpectSameFinalModel(dir_ + "/ckpt-" + whole, dir_ + "/ckpt-" + deleted, kSteps, "a deleted pod");
  }

  int deleted_after_ = -1;
};

TEST_F(PodDeleteTest, DeletedWorkerPodIsReplacedAndRejoins) { DeleteAndCompare("worker-1"); }

TEST_F(PodDeleteTest, DeletedServerPodIsReplacedAndRebuilt) { DeleteAndCompare("server-1"); }

}  // namespace
}  // namespace trellis
