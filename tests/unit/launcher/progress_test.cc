#include "launcher/progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace trellis {
namespace {

v1::ClusterView View() {
  v1::ClusterView v;
  v.set_num_servers(2);
  v.set_num_workers(3);
  for (int i = 0; i < 2; ++i) {
    auto* s = v.add_servers();
    s->set_role(v1::ROLE_SERVER);
    s->set_pod_name(i == 0 ? "mlp-server-0" : "");
    s->set_ready(i == 0);
  }
  auto* w0 = v.add_workers();
  w0->set_role(v1::ROLE_WORKER);
  w0->set_pod_name("mlp-worker-2");
  auto* w1 = v.add_workers();
  w1->set_role(v1::ROLE_WORKER);
  w1->set_pod_name("mlp-worker-0");
  w1->set_restarts(1);
  auto* w2 = v.add_workers();
  w2->set_role(v1::ROLE_WORKER);
  w2->set_pod_name("mlp-worker-1");
  w2->set_exited(true);
  w2->set_last_exit_code(0);
  return v;
}

TEST(FormatProgressTest, SummarisesRegistrationReadinessAndWorkers) {
  auto v = View();
  EXPECT_EQ(FormatProgress(&v),
            "registered 4/5 | servers 1/2 ready | workers: 0 running, 1 running (1 restart), 2 exited 0");
  v.set_failed(true);
  v.set_failure_message("keys differ");
  EXPECT_NE(FormatProgress(&v).find("FAILED: keys differ"), std::string::npos);
  EXPECT_EQ(FormatProgress(nullptr), "waiting for the scheduler");
  // A pod stopped from outside whose replacement has not registered yet.
  v = View();
  v.mutable_workers(0)->set_preempted(true);
  EXPECT_EQ(FormatProgress(&v), "registered 4/5 | servers 1/2 ready | workers: 0 awaiting its replacement "
                                "pod, 1 running (1 restart), 2 exited 0");
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

TEST(ConsoleTest, PlainModePrintsProgressOnlyOnChange) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_NONBLOCK), 0);
  Console c(p[1], /*tty=*/false, /*quiet=*/false);
  c.Progress("mlp", "registered 1/5", std::chrono::milliseconds(100));
  c.Progress("mlp", "registered 1/5", std::chrono::milliseconds(300));
  c.Line("[worker-0] step 1");
  c.Progress("mlp", "registered 5/5", std::chrono::milliseconds(500));
  EXPECT_EQ(ReadAll(p[0]), "[launch] registered 1/5\n[worker-0] step 1\n[launch] registered 5/5\n");
  ::close(p[0]);
  ::close(p[1]);
}

TEST(ConsoleTest, TerminalModeRedrawsTheStatusLineBelowOutput) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_NONBLOCK), 0);
  Console c(p[1], /*tty=*/true, /*quiet=*/false);
  c.Progress("mlp", "registered 5/5", std::chrono::milliseconds(1500));
  c.Line("[worker-0] step 1");
  c.ClearStatus();
  EXPECT_EQ(ReadAll(p[0]),
            "\r\033[K[mlp 1.5s] registered 5/5"
            "\r\033[K[worker-0] step 1\n[mlp 1.5s] registered 5/5"
            "\r\033[K");
  ::close(p[0]);
  ::close(p[1]);
}

TEST(ConsoleTest, TerminalModeRedrawsAboutFiveTimesASecond) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_NONBLOCK), 0);
  Console c(p[1], /*tty=*/true, /*quiet=*/false);
  c.Progress("j", "a", std::chrono::milliseconds(1000));
  c.Progress("j", "a", std::chrono::milliseconds(1100));  // too soon, same summary: skipped
  c.Progress("j", "b", std::chrono::milliseconds(1150));  // changed: drawn
  c.Progress("j", "b", std::chrono::milliseconds(1400));  // 250 ms later: drawn
  EXPECT_EQ(ReadAll(p[0]), "\r\033[K[j 1.0s] a\r\033[K[j 1.1s] b\r\033[K[j 1.4s] b");
  ::close(p[0]);
  ::close(p[1]);
}

TEST(ConsoleTest, QuietShowsOutputButNoProgress) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_NONBLOCK), 0);
  Console c(p[1], /*tty=*/false, /*quiet=*/true);
  c.Progress("mlp", "registered 1/5", std::chrono::milliseconds(100));
  c.Line("[worker-0] hello");
  EXPECT_EQ(ReadAll(p[0]), "[worker-0] hello\n");
  ::close(p[0]);
  ::close(p[1]);
}

}  // namespace
}  // namespace trellis
