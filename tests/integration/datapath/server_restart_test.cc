// A trellis-pserver process SIGKILLed between steps and started again (as its agent would) in
// update mode: it reloads its newest checkpoint, the workers' replays bring the steps after it
// back, and the job ends bit for bit where an undisturbed run ends. Without a checkpoint path
// the weights cannot come back and every worker's next operation says so.
#include "tests/integration/datapath/datapath_fixture.h"

namespace trellis {
namespace {

using datapath_testing::DatapathTest;

constexpr int kIn = 40;  // 16 floats per slice: slices 0 and 2 on server 0, slice 1 on server 1

class ServerRestartTest : public DatapathTest {
 protected:
  std::vector<float> Train(int kill_after, const std::string& ckpt, std::vector<Status>* results);
};
INSTANTIATE_TEST_SUITE_P(Transports, ServerRestartTest, ::testing::Values("grpc", "tcp"),
                         [](const auto& info) { return info.param; });

// Steps 1..8 of Adam in update mode, checkpoints every 2 steps; with `kill_after` > 0 server 1
// is killed and restarted once every worker finished that step. Returns rank 0's weights.
std::vector<float> ServerRestartTest::Train(int kill_after, const std::string& ckpt,
                                            std::vector<Status>* results) {
  std::vector<std::vector<float>> final_w(2);
  *results = RunWorkers([&](Worker& worker) -> Status {
    const int rank = worker.rank();
    std::vector<float> w(kIn);
    for (int i = 0; i < kIn; ++i) w[i] = 0.01f * i;
    Status st = worker.DeclareKey({.id = 3, .name = "w", .num_elements = kIn});
    std::unique_ptr<Checkpointer> ck;
    if (st.ok() && !ckpt.empty()) {
      auto made = Checkpointer::Create(worker, {{"w", w.data(), kIn, 3}});
      if (made.ok()) ck = std::move(*made);
      st = made.status();
    }
    if (st.ok()) st = worker.FinishDeclarations();
    if (st.ok() && ck) st = ck->Restore().status();
    if (st.ok() && !ck) st = worker.Broadcast(3, w.data(), 0).Wait();
    for (int step = 1; st.ok() && step <= 8; ++step) {
      std::vector<float> g(kIn);
      for (int i = 0; i < kIn; ++i) g[i] = w[i] - std::sin(0.1f * i + step + rank);
      st = worker.PushPull(3, g.data(), w.data()).Wait();
      if (st.ok() && ck && ck->Due(step)) st = ck->Save(step);
      if (st.ok() && step == kill_after) {
        st = worker.Barrier("before-kill");
        if (st.ok() && rank == 0) st = KillAndRestartServer(1);
        if (st.ok()) st = worker.Barrier("after-kill");
      }
    }
    final_w[rank] = w;
    return st;
  });
  return final_w[0];
}

TEST_P(ServerRestartTest, UpdateModeKilledServerReloadsItsCheckpointAndEndsBitExact) {
  const std::string extra = "  serverMode: update\n  optimizer: {type: adam, learningRate: 0.05}\n"
                            "  checkpoint: {path: ";
  const std::string tail = ", intervalSteps: 2, keep: 2}\n";
  std::vector<Status> results;
  StartJob(2, 2, 64, extra + (JobDir() / "calm").string() + tail);
  const std::vector<float> calm = Train(0, "calm", &results);
  StopJob();
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << r.ToString();

  // Killed after step 5: its newest checkpoint is step 4. The workers' last two pushes when they
  // replay are 4 and 5, or 5 and 6 when their step 6 was already on its way: either way every
  // step after the checkpoint comes back, so nothing is lost. (A checkpoint older than the
  // replayed steps would lose the steps in between: docs/checkpoints.md.)
  StartJob(2, 2, 64, extra + (JobDir() / "killed").string() + tail);
  const std::vector<float> killed = Train(5, "killed", &results);
  StopJob();
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << r.ToString();
  ASSERT_EQ(killed.size(), calm.size());
  EXPECT_EQ(std::memcmp(killed.data(), calm.data(), calm.size() * sizeof(float)), 0);
}

TEST_P(ServerRestartTest, UpdateModeKilledServerWithoutCheckpointFailsClearly) {
  StartJob(2, 2, 64, "  serverMode: update\n  optimizer: {type: sgd, learningRate: 0.05}\n");
  std::vector<Status> results;
  Train(2, "", &results);
  for (const auto& r : results) {
    EXPECT_EQ(r.code(), StatusCode::kFailedPrecondition) << r.ToString();
    EXPECT_NE(r.message().find("PushPull key 3 (w) step 3: slice 1 on server 1"),
              std::string::npos)
        << r.message();
    EXPECT_NE(r.message().find("restarted in update mode but the job has no checkpoint.path"),
              std::string::npos)
        << r.message();
  }
}

}  // namespace
}  // namespace trellis
