// The agent's last words (common/termination_report.h): where the kubelet reads the container's
// termination message, the agent says why it ended -- a command that does not exist by name, the
// restarts inside the pod, a job the scheduler had failed already -- and never creates the file
// where there is none (outside a container).
#include "tests/integration/pid1/pid1_fixture.h"

#include "common/termination_report.h"

namespace trellis::pid1 {
namespace {

using namespace std::chrono_literals;

class TerminationMessageTest : public Pid1Test {
 protected:
  // Runs the agent to its end with `program`; returns its exit code (-1: it did not end).
  int RunAgent(const std::vector<std::string>& program, const std::string& log_path) {
    const int port = StartScheduler();
    EXPECT_GT(port, 0) << ReadFile(dir_ + "/scheduler.log");
    if (port <= 0) return -1;
    SpawnOptions o = Agent(port, {"--restart-policy", "OnFailure", "--backoff-limit", "2", "--backoff-initial-ms",
                                  "20", "--backoff-max-ms", "40"},
                           program);
    o.env[kTerminationLogEnv] = log_path;
    auto agent = Subprocess::Start(o);
    EXPECT_TRUE(agent.ok()) << agent.status().ToString();
    if (!agent.ok()) return -1;
    auto st = (*agent)->WaitFor(60s);
    return st ? st->exit_code : -1;
  }
};

TEST_F(TerminationMessageTest, ACommandThatDoesNotExistIsNamed) {
  const std::string log = dir_ + "/termination-log";
  std::ofstream(log) << "";  // the kubelet's file
  EXPECT_EQ(RunAgent({"/no/such/train", "--epochs", "3"}, log), 127) << ReadFile(dir_ + "/agent.log");
  const std::string text = ReadFile(log);
  const TerminationReport r = ParseTerminationReport(text);
  EXPECT_EQ(r.command_not_found, "/no/such/train") << text;
  EXPECT_NE(r.error.find("/no/such/train"), std::string::npos) << text;
  EXPECT_EQ(r.exit, "program exited with code 127") << text;
  EXPECT_EQ(r.restarts, 2) << text;
}

TEST_F(TerminationMessageTest, AFailedWorkerSaysTheSchedulerFailedTheJob) {
  const std::string log = dir_ + "/termination-log";
  std::ofstream(log) << "stale words of an earlier container\n";
  EXPECT_EQ(RunAgent({"/bin/sh", "-c", "exit 3"}, log), 3) << ReadFile(dir_ + "/agent.log");
  const std::string text = ReadFile(log);
  const TerminationReport r = ParseTerminationReport(text);
  EXPECT_EQ(r.exit, "program exited with code 3") << text;
  EXPECT_TRUE(r.command_not_found.empty()) << text;
  // A worker failing for good fails the job at the scheduler; a replacement pod could not join.
  EXPECT_NE(r.job_failed.find("worker 0 (pod reap-worker-0) failed"), std::string::npos) << text;
  EXPECT_EQ(text.find("stale"), std::string::npos) << text;
}

TEST_F(TerminationMessageTest, NoFileIsCreatedOutsideAContainer) {
  const std::string log = dir_ + "/no-such-termination-log";
  EXPECT_EQ(RunAgent({"/bin/sh", "-c", "exit 0"}, log), 0) << ReadFile(dir_ + "/agent.log");
  EXPECT_FALSE(std::filesystem::exists(log));
}

}  // namespace
}  // namespace trellis::pid1
