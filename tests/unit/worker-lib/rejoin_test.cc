// Crash recovery through trellis::Checkpointer (docs/checkpoints.md#crash-recovery-workers): in-process
// servers (both transports) and an in-process scheduler for the rejoin calls. Worker 1 trains,
// pushes one step more than it commits and "dies" (its objects go away); a replacement with
// incarnation 2 rejoins from worker 0's commit and both end with the values of an undisturbed run
// (aggregate and update mode; with 2-bit compression, the same values on both workers).
#include <functional>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "tests/unit/worker-lib/local_cluster.h"
#include "tests/unit/worker-lib/rejoin_scheduler.h"
#include "trellis/checkpoint.h"
#include "worker-lib/src/worker_impl.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kN = 6;     // elements of key 1, in 3 slices over 2 servers
constexpr int kSteps = 8;

// Worker r's gradient at `step`, from the weights every worker holds.
void Gradient(const std::vector<float>& w, int r, int64_t step, std::vector<float>* g) {
  g->resize(kN);
  for (int64_t i = 0; i < kN; ++i) {
    (*g)[i] = 0.5f * w[i] + static_cast<float>(r + 1) + 0.01f * static_cast<float>(step + i);
  }
}
// The update every worker applies to the sum: weights and a momentum-like state.
void Apply(const std::vector<float>& sum, std::vector<float>* w, std::vector<float>* v) {
  for (int64_t i = 0; i < kN; ++i) {
    (*v)[i] = 0.9f * (*v)[i] + sum[i];
    (*w)[i] -= 0.01f * (*v)[i];
  }
}

struct Trainer {
  std::unique_ptr<Checkpointer> ckpt;
  std::vector<float> w = std::vector<float>(kN), v = std::vector<float>(kN);
};

struct Variant {
  std::string transport;
  ServerMode mode;
  bool twobit;
};
// How ctest names the variant ("tcp update 2bit"), instead of its bytes.
void PrintTo(const Variant& v, std::ostream* os) {
  *os << v.transport << (v.mode == ServerMode::kUpdate ? " update" : " aggregate")
      << (v.twobit ? " 2bit" : "");
}

class RejoinTest : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(rejoins_.Start("rj", 2).ok());
    testing::ClusterOptions o = Options();
    o.customize = [this](int rank, WorkerSetup* s) { rejoins_.Hook(rank, s); };
    ASSERT_TRUE(cluster_.Start(o).ok());
  }
  static testing::ClusterOptions Options() {
    testing::ClusterOptions o;
    o.servers = 2;
    o.workers = 2;
    o.slice_bytes = 8;  // 2 floats per slice
    o.timeout_ms = 10000;
    o.transport = GetParam().transport;
    o.mode = GetParam().mode;
    if (GetParam().twobit) {
      o.compression.type = CompressionType::kTwoBit;
      o.compression.warmupSteps = 2;
    }
    return o;
  }
  void TearDown() override {
    for (auto& t : trainers_) t.ckpt.reset();  // before the workers they use
  }
  // Declares, creates the checkpointer (rank r starts from its own values).
  void Prepare(Worker& worker, int r, Trainer* t) {
    for (int64_t i = 0; i < kN; ++i) {
      t->w[i] = static_cast<float>(r + 1) * 0.1f * static_cast<float>(i + 1);
      t->v[i] = 0;
    }
    ASSERT_TRUE(worker.DeclareKey({.id = 1, .name = "w", .num_elements = kN}).ok());
    auto ck = Checkpointer::Create(worker, {{"w", t->w.data(), kN, 1}}, {{"v", t->v.data(), kN}},
                                   CheckpointOptions{});
    ASSERT_TRUE(ck.ok()) << ck.status().ToString();
    t->ckpt = std::move(*ck);
    ASSERT_TRUE(worker.FinishDeclarations().ok());
  }
  // Steps first..last; EndStep after each unless `last_uncommitted` (the dying worker pushes
  // its last step but never commits it).
  static Status Train(Worker& worker, int r, Trainer* t, int64_t first, int64_t last,
                      bool last_uncommitted = false) {
    std::vector<float> g;
    for (int64_t step = first; step <= last; ++step) {
      Gradient(t->w, r, step, &g);
      TRELLIS_RETURN_IF_ERROR(worker.PushPull(1, g.data(), g.data()).Wait());
      if (GetParam().mode == ServerMode::kAggregate) {
        Apply(g, &t->w, &t->v);
      } else {  // the servers' optimizer answered the new weights; the state counts steps
        t->w = g;
        for (auto& x : t->v) x += 1.0f;
      }
      if (!(last_uncommitted && step == last)) TRELLIS_RETURN_IF_ERROR(t->ckpt->EndStep(step));
    }
    return Status::Ok();
  }
  // The same job on a cluster of its own, nobody killed: what every worker ends with.
  void Undisturbed(std::vector<float>* w, std::vector<float>* v) {
    testing::LocalCluster c;
    ASSERT_TRUE(c.Start(Options()).ok());
    Trainer t[2];
    for (int r = 0; r < 2; ++r) Prepare(*c.workers[r], r, &t[r]);
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(t[r].ckpt->Restore().ok());
    Status st0;
    std::thread rank0([&] { st0 = Train(*c.workers[0], 0, &t[0], 1, kSteps); });
    EXPECT_TRUE(Train(*c.workers[1], 1, &t[1], 1, kSteps).ok());
    rank0.join();
    ASSERT_TRUE(st0.ok()) << st0.ToString();
    *w = t[0].w;
    *v = t[0].v;
    for (auto& x : t) x.ckpt.reset();
  }
  std::string Metrics(Worker& w) { return dynamic_cast<WorkerImpl&>(w).registry().Serialize(); }

  testing::RejoinScheduler rejoins_;
  testing::LocalCluster cluster_;
  Trainer trainers_[2];
};

// Worker 0 holds after committing step 5 (as if slow), worker 1 pushes step 6 and dies: the
// rejoiner resumes after 5 and its push of 6 is one the servers already counted.
TEST_P(RejoinTest, KilledWorkerRejoinsFromTheDonorsCommitAndTrainingEndsAsUndisturbed) {
  Worker& w0 = *cluster_.workers[0];
  Prepare(w0, 0, &trainers_[0]);
  Prepare(*cluster_.workers[1], 1, &trainers_[1]);
  ASSERT_EQ(trainers_[0].ckpt->Restore().value(), 0);
  ASSERT_EQ(trainers_[1].ckpt->Restore().value(), 0);

  std::promise<void> go_on;
  std::promise<void> at_five;  // rank 0 has committed step 5 (or failed before)
  std::future<void> rank0_at_five = at_five.get_future();
  Status st0;
  std::thread rank0([&, go = go_on.get_future()] {
    st0 = Train(w0, 0, &trainers_[0], 1, 5);
    at_five.set_value();
    go.wait();
    if (st0.ok()) st0 = Train(w0, 0, &trainers_[0], 6, kSteps);
  });
  // Whatever fails below, rank 0 is let go and joined (no hang, no abandoned thread).
  bool released = false;
  auto release = [&] {
    if (!released) go_on.set_value();
    released = true;
  };
  struct Joiner {
    std::function<void()> release;
    std::thread& t;
    ~Joiner() {
      release();
      if (t.joinable()) t.join();
    }
  } joiner{release, rank0};
  ASSERT_TRUE(Train(*cluster_.workers[1], 1, &trainers_[1], 1, 5).ok());
  {
    std::vector<float> g;
    Gradient(trainers_[1].w, 1, 6, &g);
    ASSERT_TRUE(cluster_.workers[1]->Push(1, g.data()).Wait().ok());  // counted, then it dies
  }
  trainers_[1].ckpt.reset();
  cluster_.workers[1].reset();
  // Worker 1's pull of step 5 needed rank 0's push, not rank 0's commit: on a loaded machine
  // rank 0 may still be applying step 5 here, and would then serve its commit of step 4.
  rank0_at_five.wait();

  // Its agent restarts it: incarnation 2, a new process with its own initial values.
  ASSERT_EQ(rejoins_.Register(1), 2);
  auto made = CreateWorker(cluster_.SetupFor(1));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  cluster_.workers[1] = std::move(*made);
  Worker& w1 = *cluster_.workers[1];
  Trainer& t1 = trainers_[1];
  Prepare(w1, 1, &t1);
  auto resumed = t1.ckpt->Restore();
  // Rank 0 holds after committing 5 until released: its values are the commit's.
  if (resumed.ok()) {
    EXPECT_EQ(t1.w, trainers_[0].w);
    EXPECT_EQ(t1.v, trainers_[0].v);
  }
  release();
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(*resumed, 5);  // worker 0's commit
  ASSERT_TRUE(Train(w1, 1, &t1, *resumed + 1, kSteps).ok());
  rank0.join();
  ASSERT_TRUE(st0.ok()) << st0.ToString();

  EXPECT_EQ(t1.w, trainers_[0].w);  // every worker holds the same values
  EXPECT_EQ(t1.v, trainers_[0].v);
  std::vector<float> w, v;
  Undisturbed(&w, &v);
  // 2-bit: the rejoiner's residuals restarted at zero, so only a close run (docs).
  if (!GetParam().twobit) {
    EXPECT_EQ(trainers_[0].w, w);
    EXPECT_EQ(trainers_[0].v, v);
  }
  EXPECT_NE(Metrics(w1).find("trellis_worker_rejoins_total{job=\"local\",rank=\"1\",role=\"worker\"} 1"),
            std::string::npos)
      << Metrics(w1);
  EXPECT_NE(Metrics(w0).find("trellis_worker_rejoins_served_total{job=\"local\",rank=\"0\",role=\"worker\"} 1"),
            std::string::npos)
      << Metrics(w0);
}

TEST_P(RejoinTest, RestartBeforeAnyCommitStartsFreshFromRankZero) {
  // Worker 1 died before its Restore; its replacement asks before worker 0 committed anything.
  rejoins_.Register(1);
  auto made = CreateWorker(cluster_.SetupFor(1));
  ASSERT_TRUE(made.ok());
  cluster_.workers[1] = std::move(*made);
  Prepare(*cluster_.workers[0], 0, &trainers_[0]);
  Prepare(*cluster_.workers[1], 1, &trainers_[1]);
  StatusOr<int64_t> r1 = InternalError("not run");
  std::thread rank1([&] { r1 = trainers_[1].ckpt->Restore(); });
  // Rank 1 got "start fresh" and waits for rank 0's broadcast (bounded wait for the answer).
  for (int i = 0; i < 1000 && rejoins_.server().state().stats().fresh_rejoins == 0; ++i) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(rejoins_.server().state().stats().fresh_rejoins, 1);
  EXPECT_EQ(trainers_[0].ckpt->Restore().value(), 0);  // EXPECT: rank1 is joined below
  rank1.join();
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  EXPECT_EQ(*r1, 0);
  EXPECT_EQ(trainers_[1].w, trainers_[0].w);
  Status st0;
  std::thread rank0([&] { st0 = Train(*cluster_.workers[0], 0, &trainers_[0], 1, kSteps); });
  EXPECT_TRUE(Train(*cluster_.workers[1], 1, &trainers_[1], 1, kSteps).ok());
  rank0.join();
  ASSERT_TRUE(st0.ok()) << st0.ToString();
  EXPECT_EQ(trainers_[1].w, trainers_[0].w);
  std::vector<float> w, v;
  Undisturbed(&w, &v);
  if (!GetParam().twobit) {
    EXPECT_EQ(trainers_[0].w, w);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, RejoinTest,
    ::testing::Values(Variant{"grpc", ServerMode::kAggregate, false},
                      Variant{"tcp", ServerMode::kAggregate, false},
                      Variant{"tcp", ServerMode::kUpdate, false},
                      Variant{"grpc", ServerMode::kAggregate, true},
                      Variant{"tcp", ServerMode::kUpdate, true}),
    [](const ::testing::TestParamInfo<Variant>& i) {
      return i.param.transport + (i.param.mode == ServerMode::kUpdate ? "_update" : "_aggregate") +
             (i.param.twobit ? "_2bit" : "");
    });

}  // namespace
}  // namespace trellis
