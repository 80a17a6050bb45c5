// A container's PID 1 inherits every orphan in it and must reap them (docs/kubernetes.md#pods).
// trellis-agent runs a program that leaves descendants behind at each start -- one in its process
// group (killed with the group when the program ends), one in a session of its own that outlives
// it -- and restarts it three times; trellis-scheduler starts as PID 1 with a child it did not
// start. As PID 1 of a new PID namespace (`unshare --pid --fork`, as root) or, for the agent, as
// the subreaper it makes itself otherwise, neither may leave a zombie behind, and the agent still
// reports its program's own exit code.
#include "tests/integration/pid1/pid1_fixture.h"

namespace trellis::pid1 {
namespace {

using namespace std::chrono_literals;

class ZombieTest : public Pid1Test {
 protected:
  void AgentLeavesNoZombie(bool pid_ns);
};

void ZombieTest::AgentLeavesNoZombie(bool pid_ns) {
  const int port = StartScheduler();
  ASSERT_GT(port, 0) << ReadFile(dir_ + "/scheduler.log");

  // Starts 1-3 fail; start 4 runs until told to stop, then fails too: the back-off limit (3) is
  // reached and the agent exits with that program's code, 4.
  const std::string prog = dir_ + "/prog.sh";
  std::ofstream(prog) << "n=$(($(cat \"$0.count\" 2>/dev/null || echo 0) + 1))\n"
                         "echo $n > \"$0.count\"\n"
                         "sleep 30 &\n"                           // the program's group: killed with it
                         "setsid sh -c 'sleep 0.2' &\n"           // its own session: outlives the program
                         "if [ $n -eq 1 ]; then setsid sleep 31 & fi\n"  // outlives even the test's checks
                         "if [ $n -le 3 ]; then exit 1; fi\n"
                         "while [ ! -e \"$0.stop\" ]; do sleep 0.05; done\n"
                         "exit 4\n";
  SpawnOptions o = Agent(port, {"--restart-policy", "OnFailure", "--backoff-limit", "3", "--backoff-initial-ms", "50",
                                 "--backoff-max-ms", "100"},
                          {"/bin/sh", prog}, pid_ns);
  auto agent_proc = Subprocess::Start(o);
  ASSERT_TRUE(agent_proc.ok()) << agent_proc.status().ToString();
  const pid_t agent = pid_ns ? NamespaceInit((*agent_proc)->pid()) : (*agent_proc)->pid();
  ASSERT_GT(agent, 0);

  // The fourth start runs; every earlier start's descendants have ended by now (0.2 s).
  ASSERT_TRUE(WaitUntil([&] { return ReadFile(prog + ".count") == "4\n"; }, 30s))
      << "the program was not started a fourth time\n" << ReadFile(dir_ + "/agent.log");
  std::this_thread::sleep_for(300ms);
  // The long orphan of the first start is the agent's now: it is the reaper of the program's tree.
  auto orphan = Marked("REAP_MARK", mark_, "sleep 31");
  ASSERT_EQ(orphan.size(), 1u);
  EXPECT_EQ(orphan[0].ppid, agent) << "the orphan of the first start was not adopted by the agent";
  // Three killed group members and three (or four) ended sessions: all reaped, none a zombie.
  std::vector<pid_t> zombies;
  const bool none = WaitUntil([&] { return (zombies = ZombiesOf(agent)).empty(); }, 5s);
  EXPECT_TRUE(none) << zombies.size() << " zombies with the agent (pid " << agent << ") as parent\n"
                    << ReadFile(dir_ + "/agent.log");

  std::ofstream(prog + ".stop") << "";
  auto st = (*agent_proc)->WaitFor(30s);
  ASSERT_TRUE(st.has_value()) << ReadFile(dir_ + "/agent.log");
  EXPECT_EQ(st->exit_code, 4) << "the agent must exit with its program's own code\n" << ReadFile(dir_ + "/agent.log");
  EXPECT_NE(ReadFile(dir_ + "/agent.log").find("after 3 restarts"), std::string::npos) << ReadFile(dir_ + "/agent.log");
}

TEST_F(ZombieTest, AgentAsPidOneReapsTheOrphansOfItsProgram) {
  if (!CanUnsharePid()) GTEST_SKIP() << "needs root and unshare --pid";
  AgentLeavesNoZombie(/*pid_ns=*/true);
}

TEST_F(ZombieTest, AgentAsSubreaperAdoptsAndReapsTheOrphansOfItsProgram) {
  AgentLeavesNoZombie(/*pid_ns=*/false);
}

TEST_F(ZombieTest, SchedulerAsPidOneReapsAChildItDidNotStart) {
  if (!CanUnsharePid()) GTEST_SKIP() << "needs root and unshare --pid";
  const std::string bin = TRELLIS_BIN_DIR;
  // The shell, PID 1, starts a child and becomes the scheduler: a child the scheduler inherits.
  const std::string cmd = "sleep 0.2 & exec '" + bin +
                          "/trellis-scheduler' --num-servers 1 --num-workers 1 --host 127.0.0.1 --port 0 "
                          "--port-file '" + dir_ + "/port' --token-file '" + dir_ + "/token' --job-name reap";
  auto proc = Subprocess::Start(Options(Wrapped({"/bin/sh", "-c", cmd}, true), "scheduler.log"));
  ASSERT_TRUE(proc.ok()) << proc.status().ToString();
  const pid_t scheduler = NamespaceInit((*proc)->pid());
  ASSERT_GT(scheduler, 0);
  ASSERT_GT(SchedulerPort(dir_ + "/port"), 0) << ReadFile(dir_ + "/scheduler.log");
  std::this_thread::sleep_for(300ms);  // the child has ended
  std::vector<pid_t> zombies;
  const bool none = WaitUntil([&] { return (zombies = ZombiesOf(scheduler)).empty(); }, 5s);
  EXPECT_TRUE(none) << zombies.size() << " zombies with the scheduler (pid " << scheduler << ") as parent";
  // SIGTERM reaches PID 1 and ends it well.
  ASSERT_EQ(::kill(scheduler, SIGTERM), 0);
  auto st = (*proc)->WaitFor(20s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->exit_code, 0) << ReadFile(dir_ + "/scheduler.log");
}

}  // namespace
}  // namespace trellis::pid1
