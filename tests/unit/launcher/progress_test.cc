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

// An elastic job's worker slots beyond its world that never ran (growing beyond the first size
// brings them in) are not listed nor counted as missing; once they registered they are.
TEST(FormatProgressTest, SlotsOutsideTheWorldThatNeverRanAreNotListed) {
  auto v = View();
  v.set_num_workers(5);
  v.add_workers()->set_role(v1::ROLE_WORKER);
  v.add_workers()->set_role(v1::ROLE_WORKER);
  for (int m : {0, 1, 2}) v.mutable_world()->add_members(m);
  EXPECT_EQ(FormatProgress(&v),
            "registered 4/5 | servers 1/2 ready | workers: 0 running, 1 running (1 restart), 2 exited 0");
  v.mutable_workers(4)->set_pod_name("mlp-worker-4");
  v.mutable_world()->add_members(4);
  EXPECT_EQ(FormatProgress(&v), "registered 5/6 | servers 1/2 ready | workers: 0 running, 1 running (1 restart), "
                                "2 exited 0, 4 running");
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

v1::JobProgress Training(int32_t straggler) {
  v1::JobProgress p;
  p.set_reported(true);
  p.set_step(120);
  p.set_total_steps(1000);
  p.set_samples_per_second(2456.7);
  p.set_has_loss(true);
  p.set_loss(0.25123);
  p.set_eta_seconds(88);
  p.set_skew(7.54);
  p.set_straggler_rank(straggler);
  if (straggler >= 0) p.set_straggler_pod("mlp-worker-" + std::to_string(straggler));
  return p;
}

TEST(FormatTrainingTest, StepRateLossEtaAndStraggler) {
  EXPECT_EQ(FormatTraining(v1::JobProgress{}), "");
  EXPECT_EQ(FormatTraining(Training(-1)), "step 120/1000 | 2.46k samples/s | loss 0.251 | ETA 1m28s");
  EXPECT_EQ(FormatTraining(Training(1)),
            "step 120/1000 | 2.46k samples/s | loss 0.251 | ETA 1m28s | straggler: worker 1 (mlp-worker-1) 7.5x");
  v1::JobProgress open = Training(-1);
  open.set_total_steps(0);
  open.set_has_loss(false);
  open.set_eta_seconds(-1);
  EXPECT_EQ(FormatTraining(open), "step 120 | 2.46k samples/s");
}

TEST(ConsoleTest, TerminalLineLeadsWithTraining) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_NONBLOCK), 0);
  Console c(p[1], /*tty=*/true, /*quiet=*/false);
  c.Progress("mlp", "registered 5/5", std::chrono::milliseconds(1500), "step 3/10 | 100 samples/s");
  EXPECT_EQ(ReadAll(p[0]), "\r\033[K[mlp 1.5s] step 3/10 | 100 samples/s | registered 5/5");
  ::close(p[0]);
  ::close(p[1]);
}

TEST(ConsoleTest, PlainModePrintsTrainingEveryTenSecondsAndStragglersAtOnce) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_NONBLOCK), 0);
  Console c(p[1], /*tty=*/false, /*quiet=*/false);
  using std::chrono::milliseconds;
  c.Progress("mlp", "s", milliseconds(1000), "step 1");
  c.Progress("mlp", "s", milliseconds(2000), "step 2");    // 1 s later: not printed
  c.Progress("mlp", "s", milliseconds(3000), "step 3 | straggler: worker 1 (p) 3.0x");  // new straggler
  c.Progress("mlp", "s", milliseconds(13500), "step 9 | straggler: worker 1 (p) 3.1x");  // 10 s later
  EXPECT_EQ(ReadAll(p[0]),
            "[launch] s\n[launch] step 1\n[launch] step 3 | straggler: worker 1 (p) 3.0x\n"
            "[launch] step 9 | straggler: worker 1 (p) 3.1x\n");
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
