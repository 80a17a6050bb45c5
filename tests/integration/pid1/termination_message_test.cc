// The agent's last words (common/process/termination_report.h): where the kubelet reads the container's
// termination message, the agent says why it ended -- a command that does not exist by name, the
// restarts inside the pod, a job the scheduler had failed already, the error the program left in
// $TRELLIS_ERROR_FILE (its last start's only) -- and never creates the file where there is none
// (outside a container).
#include "tests/integration/pid1/pid1_fixture.h"

#include "common/process/termination_report.h"

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

TEST_F(TerminationMessageTest, TheProgramsOwnErrorIsCarried) {
  const std::string log = dir_ + "/termination-log";
  std::ofstream(log) << "";
  // The file is the agent's own, not in the program's directory; the program leaves one line.
  const std::string script =
      "case \"$TRELLIS_ERROR_FILE\" in /*/program-error) ;; *) exit 9;; esac; "
      "printf 'ValueError: boom\\nsecond line\\033[0m\\n' > \"$TRELLIS_ERROR_FILE\"; "
      "echo \"$TRELLIS_ERROR_FILE\" > " + dir_ + "/error-file; exit 3";
  EXPECT_EQ(RunAgent({"/bin/sh", "-c", script}, log), 3) << ReadFile(dir_ + "/agent.log");
  const std::string text = ReadFile(log);
  const TerminationReport r = ParseTerminationReport(text);
  EXPECT_EQ(r.exit, "program exited with code 3") << text;
  EXPECT_EQ(r.program_error, "ValueError: boom second line?[0m") << text;
  EXPECT_EQ(r.restarts, 2) << text;
  // Read and removed, with the agent's directory.
  std::string path = ReadFile(dir_ + "/error-file");
  while (!path.empty() && path.back() == '\n') path.pop_back();
  ASSERT_FALSE(path.empty());
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(path).parent_path()));
}

TEST_F(TerminationMessageTest, AnEarlierStartsErrorIsNotReported) {
  const std::string log = dir_ + "/termination-log";
  const std::string marker = dir_ + "/first-ran";
  // The first start leaves an error and fails; the restarts fail without one.
  const std::string failing =
      "if [ ! -e " + marker + " ]; then touch " + marker +
      "; echo 'RuntimeError: the first start' > \"$TRELLIS_ERROR_FILE\"; fi; exit 3";
  std::ofstream(log) << "";
  EXPECT_EQ(RunAgent({"/bin/sh", "-c", failing}, log), 3) << ReadFile(dir_ + "/agent.log");
  std::string text = ReadFile(log);
  TerminationReport r = ParseTerminationReport(text);
  EXPECT_EQ(r.exit, "program exited with code 3") << text;
  EXPECT_EQ(r.restarts, 2) << text;
  EXPECT_EQ(r.program_error, "") << text;
  EXPECT_EQ(text.find("first start"), std::string::npos) << text;
}

TEST_F(TerminationMessageTest, ASucceedingRestartReportsNoError) {
  const std::string log = dir_ + "/termination-log";
  const std::string marker = dir_ + "/first-ran";
  // The first start leaves an error and fails; the restart succeeds.
  const std::string script =
      "if [ ! -e " + marker + " ]; then touch " + marker +
      "; echo 'RuntimeError: the first start' > \"$TRELLIS_ERROR_FILE\"; exit 3; fi; exit 0";
  std::ofstream(log) << "";
  EXPECT_EQ(RunAgent({"/bin/sh", "-c", script}, log), 0) << ReadFile(dir_ + "/agent.log");
  const std::string text = ReadFile(log);
  const TerminationReport r = ParseTerminationReport(text);
  EXPECT_EQ(r.exit, "program exited with code 0") << text;
  EXPECT_EQ(r.restarts, 1) << text;
  EXPECT_EQ(text.find("first start"), std::string::npos) << text;
}

TEST_F(TerminationMessageTest, NoFileIsCreatedOutsideAContainer) {
  const std::string log = dir_ + "/no-such-termination-log";
  EXPECT_EQ(RunAgent({"/bin/sh", "-c", "exit 0"}, log), 0) << ReadFile(dir_ + "/agent.log");
  EXPECT_FALSE(std::filesystem::exists(log));
}

}  // namespace
}  // namespace trellis::pid1
