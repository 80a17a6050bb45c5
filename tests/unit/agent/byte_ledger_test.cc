// The agent's byte ledger (common/process/byte_ledger.h): a descriptor handed to a child as fd 3 (and no
// other), and byte counts a SIGKILLed program added that its successor starts from.
#include "common/process/byte_ledger.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "common/config/env.h"
#include "common/process/subprocess.h"

namespace trellis {
namespace {

TEST(SpawnPassFd, TheChildGetsTheDescriptorAsThreeAndNoOtherLeak) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  int leak = ::open("/dev/null", O_RDONLY);  // not close-on-exec: must still not reach the child
  ASSERT_GE(leak, 0);
  SpawnOptions o;
  o.env = CurrentEnvironment();
  o.argv = {"/bin/sh", "-c", "printf three >&3; test -e /proc/self/fd/" + std::to_string(leak) +
                                 " && printf ' leaked' >&3; exit 0"};
  o.pass_fd = p[1];
  auto child = Subprocess::Start(o);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  auto st = (*child)->WaitFor(std::chrono::seconds(30));
  ::close(p[1]);
  ::close(leak);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->exit_code, 0);
  char buf[64] = {};
  const ssize_t n = ::read(p[0], buf, sizeof(buf) - 1);
  ::close(p[0]);
  EXPECT_EQ(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0), "three");
}

// A forked "program" that finds the ledger as its agent hands it (TRELLIS_LEDGER_FD), adds, and
// is killed (SIGKILL) or exits; returns what it saw as its predecessors' bytes.
pid_t RunProgram(const ByteLedger& ledger, uint64_t pushed, uint64_t pulled, bool killed) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  if (::dup2(ledger.fd(), kLedgerChildFd) < 0) _exit(2);
  ::setenv(kLedgerFdEnv, "3", 1);
  ByteLedger* mine = ByteLedger::ForThisProgram();
  if (mine == nullptr) _exit(3);
  mine->AddPushed(pushed);
  mine->AddPulled(pulled);
  if (killed) ::raise(SIGKILL);
  _exit(0);
}

TEST(ByteLedger, AKilledProgramsBytesOutliveItAndAddUp) {
  auto ledger = ByteLedger::Create();
  ASSERT_TRUE(ledger.ok()) << ledger.status().ToString();
  ByteLedger& l = **ledger;
  int ws = 0;
  ASSERT_EQ(::waitpid(RunProgram(l, 1000, 3000, /*killed=*/true), &ws, 0) > 0, true);
  EXPECT_TRUE(WIFSIGNALED(ws));
  EXPECT_EQ(l.live_pushed(), 1000u);
  l.FoldEnded();
  EXPECT_EQ(l.ended_pushed(), 1000u);
  EXPECT_EQ(l.ended_pulled(), 3000u);
  EXPECT_EQ(l.live_pushed(), 0u);
  ASSERT_EQ(::waitpid(RunProgram(l, 7, 9, /*killed=*/false), &ws, 0) > 0, true);
  EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << ws;
  l.FoldEnded();
  EXPECT_EQ(l.ended_pushed(), 1007u);
  EXPECT_EQ(l.ended_pulled(), 3009u);
  EXPECT_EQ(l.ended_programs(), 2u);
}

TEST(ByteLedger, AnythingElseOnTheDescriptorIsNoLedger) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open("/dev/null", O_RDONLY);
    ::setenv(kLedgerFdEnv, std::to_string(fd).c_str(), 1);
    _exit(ByteLedger::ForThisProgram() == nullptr ? 0 : 1);
  }
  int ws = 0;
  ASSERT_GT(::waitpid(pid, &ws, 0), 0);
  EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << ws;
}

}  // namespace
}  // namespace trellis
