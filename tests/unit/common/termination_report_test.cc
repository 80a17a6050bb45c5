// The agent's termination report (common/termination_report.h): lines the operator reads back,
// within the kubelet's 4096 bytes, written only where the kubelet made the file.
#include "common/termination_report.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

namespace trellis {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(TerminationReportTest, RoundTrip) {
  TerminationReport r;
  r.command_not_found = "/app/train";
  r.error = "program /app/train: not an executable file";
  r.exit = "program exited with code 127";
  r.restarts = 2;
  r.job_failed = "worker 0 (pod mlp-worker-0) failed: exited with code 127";
  const std::string text = FormatTerminationReport(r);
  EXPECT_EQ(text,
            "error: program /app/train: not an executable file\n"
            "command-not-found: /app/train\n"
            "exit: program exited with code 127\n"
            "restarts: 2\n"
            "job-failed: worker 0 (pod mlp-worker-0) failed: exited with code 127\n");
  const TerminationReport back = ParseTerminationReport(text);
  EXPECT_EQ(back.command_not_found, r.command_not_found);
  EXPECT_EQ(back.error, r.error);
  EXPECT_EQ(back.exit, r.exit);
  EXPECT_EQ(back.restarts, 2);
  EXPECT_EQ(back.job_failed, r.job_failed);
  EXPECT_EQ(FormatTerminationReport(TerminationReport{}), "");
}

TEST(TerminationReportTest, ValuesStayOnOneLineAndTheWholeFitsTheKubeletsLimit) {
  TerminationReport r;
  r.exit = "program exited\nwith code 3";
  r.job_failed = std::string(10000, 'x');
  const std::string text = FormatTerminationReport(r);
  EXPECT_LE(text.size(), kMaxTerminationMessage);
  EXPECT_EQ(ParseTerminationReport(text).exit, "program exited with code 3");
  EXPECT_EQ(text.find("exit: "), 0u);
}

TEST(TerminationReportTest, OtherWordsAreIgnored) {
  const TerminationReport r =
      ParseTerminationReport("failed to create containerd task: exec: no such file\nrestarts: lots\nexit: x\n");
  EXPECT_EQ(r.exit, "x");
  EXPECT_EQ(r.restarts, 0);
  EXPECT_TRUE(r.command_not_found.empty());
  EXPECT_TRUE(r.job_failed.empty());
}

TEST(TerminationReportTest, WrittenOnlyWhereTheFileExists) {
  char tmpl[] = "/tmp/trellis-term-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  EXPECT_TRUE(WriteTerminationMessage(dir + "/none", "exit: x\n").ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/none"));
  std::ofstream(dir + "/log") << "an older, longer message\n";
  EXPECT_TRUE(WriteTerminationMessage(dir + "/log", "exit: x\n").ok());
  EXPECT_EQ(Slurp(dir + "/log"), "exit: x\n");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trellis
