// The agent's termination report (common/process/termination_report.h): lines the operator reads back,
// within the kubelet's 4096 bytes, written only where the kubelet made the file; the program's
// own error (its $TRELLIS_ERROR_FILE) read bounded, on one line, without control bytes.
#include "common/process/termination_report.h"

#include <sys/stat.h>
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

TEST(TerminationReportTest, ALostWorkersReportRoundTrips) {
  TerminationReport r;
  r.exit = "program was killed by signal 9 (SIGKILL)";
  r.lost = "worker 1 (pod j-worker-1) failed: exit code 137 (killed by SIGKILL)";
  const std::string text = FormatTerminationReport(r);
  EXPECT_EQ(text,
            "exit: program was killed by signal 9 (SIGKILL)\n"
            "lost: worker 1 (pod j-worker-1) failed: exit code 137 (killed by SIGKILL)\n");
  EXPECT_EQ(ParseTerminationReport(text).lost, r.lost);
  EXPECT_TRUE(ParseTerminationReport("exit: program exited with code 1\n").lost.empty());
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

TEST(TerminationReportTest, TheProgramsErrorRoundTripsBeforeTheJobsFailure) {
  TerminationReport r;
  r.exit = "program exited with code 78";
  r.program_error = "ConfigurationError: trellis.torch: this worker rejoined\nthe running job after step 738";
  r.job_failed = "worker 1 (pod j-worker-1) failed: exited with code 78";
  const std::string text = FormatTerminationReport(r);
  EXPECT_EQ(text,
            "exit: program exited with code 78\n"
            "program-error: ConfigurationError: trellis.torch: this worker rejoined the running job after step 738\n"
            "job-failed: worker 1 (pod j-worker-1) failed: exited with code 78\n");
  const TerminationReport back = ParseTerminationReport(text);
  EXPECT_EQ(back.program_error,
            "ConfigurationError: trellis.torch: this worker rejoined the running job after step 738");
  EXPECT_EQ(back.job_failed, r.job_failed);
  EXPECT_EQ(back.exit, r.exit);
}

TEST(TerminationReportTest, AHugeProgramErrorStillLeavesTheWholeWithinTheLimit) {
  TerminationReport r;
  r.error = std::string(2000, 'e');
  r.exit = "program exited with code 1";
  r.program_error = std::string(100000, 'p');
  r.job_failed = std::string(2000, 'j');
  const std::string text = FormatTerminationReport(r);
  EXPECT_LE(text.size(), kMaxTerminationMessage);
  const TerminationReport back = ParseTerminationReport(text);
  EXPECT_EQ(back.program_error.size(), kMaxProgramError);
  EXPECT_EQ(back.program_error.substr(kMaxProgramError - 3), "...");
  EXPECT_EQ(back.exit, r.exit);
}

TEST(CleanProgramErrorTest, HostileBytesBecomeOneSafeLine) {
  EXPECT_EQ(CleanProgramError("ValueError: boom\n"), "ValueError: boom");
  EXPECT_EQ(CleanProgramError("  a\r\nb\tc  \n\n"), "a  b c");
  EXPECT_EQ(CleanProgramError(std::string("x\0y\x1b[31mz\x7f", 10)), "x?y?[31mz?");
  EXPECT_EQ(CleanProgramError("caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x94\xa5"), "caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x94\xa5");
  // Not UTF-8: a stray continuation byte, a cut character, an overlong '/', a surrogate, a C1 control.
  EXPECT_EQ(CleanProgramError("a\x80" "b\xe2\x9c"), "a?b??");
  EXPECT_EQ(CleanProgramError("\xc0\xaf|\xed\xa0\x80|\xc2\x85|\xff"), "??|???|?|?");
  EXPECT_EQ(CleanProgramError(" \n\t "), "");
  EXPECT_EQ(CleanProgramError(""), "");
}

TEST(CleanProgramErrorTest, BoundedWithoutCuttingACharacter) {
  EXPECT_EQ(CleanProgramError(std::string(kMaxProgramError, 'x')), std::string(kMaxProgramError, 'x'));
  const std::string cut = CleanProgramError(std::string(kMaxProgramError + 1, 'x'));
  EXPECT_EQ(cut, std::string(kMaxProgramError - 3, 'x') + "...");
  std::string wide;
  while (wide.size() < 3 * kMaxProgramError) wide += "\xe2\x9c\x93";  // 3 bytes each
  const std::string w = CleanProgramError(wide);
  EXPECT_LE(w.size(), kMaxProgramError);
  EXPECT_EQ(w.substr(w.size() - 3), "...");
  EXPECT_EQ((w.size() - 3) % 3, 0u) << "a character was cut";
  // A megabyte is not scanned to the end, and says it was longer.
  const std::string big = CleanProgramError(std::string(1 << 20, '\n') + "tail");
  EXPECT_EQ(big, "");
  const std::string head = CleanProgramError("E: head" + std::string(1 << 20, ' ') + "tail");
  EXPECT_EQ(head, "E: head...");
}

class ReadProgramErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/trellis-progerr-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(ReadProgramErrorTest, ReadsAtMostTheBoundOfAFile) {
  EXPECT_EQ(ReadProgramError(dir_ + "/none"), "");
  std::ofstream(dir_ + "/e") << "Traceback line\nValueError: boom\n";
  EXPECT_EQ(ReadProgramError(dir_ + "/e"), "Traceback line ValueError: boom");
  std::ofstream(dir_ + "/empty") << "";
  EXPECT_EQ(ReadProgramError(dir_ + "/empty"), "");
  std::ofstream(dir_ + "/long") << std::string(5 * kMaxProgramError, 'z');
  EXPECT_EQ(ReadProgramError(dir_ + "/long"), std::string(kMaxProgramError - 3, 'z') + "...");
}

TEST_F(ReadProgramErrorTest, NoLinkIsFollowedAndNoFifoWaitedOn) {
  std::filesystem::create_symlink("/dev/zero", dir_ + "/zero");
  EXPECT_EQ(ReadProgramError(dir_ + "/zero"), "");
  std::ofstream(dir_ + "/real") << "secret\n";
  std::filesystem::create_symlink(dir_ + "/real", dir_ + "/link");
  EXPECT_EQ(ReadProgramError(dir_ + "/link"), "");
  ASSERT_EQ(::mkfifo((dir_ + "/fifo").c_str(), 0600), 0);
  EXPECT_EQ(ReadProgramError(dir_ + "/fifo"), "");  // returns at once, no writer needed
  std::filesystem::create_directory(dir_ + "/dir");
  EXPECT_EQ(ReadProgramError(dir_ + "/dir"), "");
}

TEST(TerminationReportTest, OtherWordsAreIgnored) {
  const TerminationReport r =
      ParseTerminationReport("failed to create containerd task: exec: no such file\nrestarts: lots\nexit: x\n");
  EXPECT_EQ(r.exit, "x");
  EXPECT_EQ(r.restarts, 0);
  EXPECT_TRUE(r.command_not_found.empty());
  EXPECT_TRUE(r.job_failed.empty());
  EXPECT_TRUE(r.program_error.empty());
  // A program that wrote the termination log itself gets its program-error cleaned as well.
  const TerminationReport p = ParseTerminationReport(
      "program-error: E\x1b]0;x\x07 " + std::string(3 * kMaxProgramError, 'y') + "\n");
  EXPECT_EQ(p.program_error.substr(0, 9), "E?]0;x? y");
  EXPECT_EQ(p.program_error.size(), kMaxProgramError);
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
