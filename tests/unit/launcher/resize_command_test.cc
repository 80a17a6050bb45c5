// `trellis-launch resize` (launcher/resize_command.h) refuses bad arguments before it reaches
// for a scheduler: exit 2, the usage or the argument named; so is a run directory no launcher
// keeps (no scheduler.client in it).
#include "launcher/resize_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

namespace trellis {
namespace {

using ::testing::HasSubstr;

int Resize(const std::vector<std::string>& args, std::string* err) {
  std::ostringstream out, e;
  const int code = RunResizeCommand(args, out, e, std::chrono::milliseconds(100));
  *err = e.str();
  return code;
}

TEST(ResizeCommandTest, BadArgumentsAreUsageErrorsNamingWhatIsWrong) {
  std::string err;
  for (const auto& args : std::vector<std::vector<std::string>>{
           {}, {"/tmp/run"}, {"/tmp/run", "--servers"}, {"/tmp/run", "--nodes", "2"}, {"/tmp/run", "2", "3"}}) {
    EXPECT_EQ(Resize(args, &err), 2) << args.size();
    EXPECT_THAT(err, HasSubstr("usage: trellis-launch resize RUN_DIR WORKERS\n"));
    EXPECT_THAT(err, HasSubstr("trellis-launch resize RUN_DIR --servers SERVERS"));
  }
  EXPECT_EQ(Resize({"/tmp/run", "0"}, &err), 2);
  EXPECT_THAT(err, HasSubstr("WORKERS must be a number >= 1, got '0'"));
  EXPECT_EQ(Resize({"/tmp/run", "--servers", "two"}, &err), 2);
  EXPECT_THAT(err, HasSubstr("SERVERS must be a number >= 1, got 'two'"));
  EXPECT_EQ(Resize({"/tmp/run", "--servers", "3x"}, &err), 2);
  EXPECT_THAT(err, HasSubstr("SERVERS must be a number >= 1, got '3x'"));
  EXPECT_EQ(Resize({"/tmp/run", "--servers", std::string(40000, '9')}, &err), 2) << "a 40 KB number";
}

TEST(ResizeCommandTest, ARunDirectoryNoLauncherKeepsIsABadArgumentNamingIt) {
  std::string err;
  EXPECT_EQ(Resize({"/nonexistent/trellis-run", "--servers", "2"}, &err), 2);
  EXPECT_THAT(err, HasSubstr("/nonexistent/trellis-run"));
}

}  // namespace
}  // namespace trellis
