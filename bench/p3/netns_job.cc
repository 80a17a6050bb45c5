#include "bench/p3/netns_job.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "common/config/env.h"
#include "common/job/job_spec.h"
#include "common/process/subprocess.h"
#include "launcher/plan.h"

namespace trellis::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Runs the command on test host `host`: in its network namespace, and in its CPU cgroup when
// testhosts.sh made one (--cpu), entered first because ip netns exec mounts its own /sys.
void InHost(SpawnOptions& spawn, const std::string& prefix, int host) {
  const std::string name = prefix + "-h" + std::to_string(host);
  spawn.argv.insert(spawn.argv.begin(), {"ip", "netns", "exec", name});
  const std::string cgroup = "/sys/fs/cgroup/cpu/" + name;
  struct stat st;
  if (::stat(cgroup.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    spawn.argv.insert(spawn.argv.begin(),
                      {"sh", "-c", "echo $$ > " + cgroup + "/tasks && exec \"$@\"", "sh"});
  }
}

struct Running {
  std::string name;
  std::string log;
  bool worker = false;
  std::unique_ptr<Subprocess> process;
};

// Ends every process: workers and servers (their agents forward the signal), then the scheduler.
void StopAll(std::vector<Running>& procs) {
  for (auto it = procs.rbegin(); it != procs.rend(); ++it) {
    if (it->process) it->process->Stop(std::chrono::seconds(3));
  }
}

}  // namespace

std::string TestHostAddress(int host) { return "198.18.0." + std::to_string(host + 1); }

Status RunNetnsJob(const NetnsJobOptions& o) {
  TRELLIS_ASSIGN_OR_RETURN(JobSpec job, LoadJobSpecFile(o.job_file));
  ::mkdir(o.run_dir.c_str(), 0755);
  LaunchPaths paths;
  paths.bin_dir = o.bin_dir;
  paths.run_dir = o.run_dir;
  paths.job_file = o.job_file;
  paths.token_file = o.run_dir + "/token";
  {
    std::ofstream token(paths.token_file, std::ios::trunc);
    token << "p3-bench-" << getpid() << "\n";
    if (!token) return UnavailableError("cannot write " + paths.token_file);
  }
  const auto env = CurrentEnvironment();
  std::vector<Running> procs;
  const auto deadline = Clock::now() + o.deadline;

  ProcessPlan sched = PlanScheduler(paths, env);
  for (auto& a : sched.spawn.argv) {
    if (a == "127.0.0.1") a = TestHostAddress(0);
  }
  InHost(sched.spawn, o.prefix, 0);
  const std::string port_file = o.run_dir + "/scheduler.port";
  std::remove(port_file.c_str());
  auto started = Subprocess::Start(sched.spawn);
  if (!started.ok()) return started.status();
  procs.push_back({"scheduler", sched.spawn.stdout_path, false, std::move(*started)});
  int port = 0;
  // The scheduler writes its port file once it serves; a short bounded poll (another process).
  while (port == 0) {
    std::ifstream in(port_file);
    if (!(in >> port)) port = 0;
    if (port > 0) break;
    if (auto exit = procs[0].process->Poll(); exit || Clock::now() > deadline) {
      StopAll(procs);
      return UnavailableError("trellis-scheduler did not start (see " + procs[0].log + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  paths.scheduler_address = TestHostAddress(0) + ":" + std::to_string(port);

  for (ProcessPlan& p : PlanAgents(job, paths, env, std::chrono::milliseconds(2000))) {
    const bool worker = p.kind == ProcessPlan::Kind::kWorker;
    const int host = worker ? job.servers.replicas + p.index : p.index;
    p.spawn.env["TRELLIS_HOST"] = TestHostAddress(host);
    // The launcher's plans listen on 127.0.0.1; here the peers are on other test hosts.
    p.spawn.env[kListenHostEnv] = TestHostAddress(host);
    const std::string log = o.run_dir + "/" + p.name + ".log";
    p.spawn.stdout_mode = SpawnOptions::Output::kFile;
    p.spawn.stdout_path = log;
    p.spawn.stderr_mode = SpawnOptions::Output::kStdout;
    InHost(p.spawn, o.prefix, host);
    auto s = Subprocess::Start(p.spawn);
    if (!s.ok()) {
      StopAll(procs);
      return s.status().Annotate(p.name);
    }
    procs.push_back({p.name, log, worker, std::move(*s)});
  }

  // Until every worker is done; any process failing fails the run.
  Status result;
  while (true) {
    bool workers_left = false;
    for (auto& r : procs) {
      if (!r.process) continue;
      auto exit = r.process->WaitFor(std::chrono::milliseconds(r.worker ? 50 : 0));
      if (!exit) {
        workers_left |= r.worker;
        continue;
      }
      if (!exit->ok()) {
        result = AbortedError(r.name + " " + exit->Describe() + " (see " + r.log + ")");
      }
      r.process.reset();
      if (!result.ok()) break;
    }
    if (!result.ok() || !workers_left) break;
    if (Clock::now() > deadline) {
      result = DeadlineExceededError("the job did not end within " +
                                     std::to_string(o.deadline.count()) + " s (logs in " +
                                     o.run_dir + ")");
      break;
    }
  }
  StopAll(procs);
  return result;
}

}  // namespace trellis::bench
