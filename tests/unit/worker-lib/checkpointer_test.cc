// trellis::Checkpointer on an in-process cluster (aggregate mode): initial broadcast, save,
// restore into a fresh job, fall back past a bad file, a failed restore reaching every worker,
// and the metrics it keeps.
#include "trellis/checkpoint.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>

#include <gtest/gtest.h>

#include "common/checkpoint/checkpoint_dir.h"
#include "tests/unit/worker-lib/local_cluster.h"
#include "worker-lib/src/worker_impl.h"

namespace trellis {
namespace {

namespace fs = std::filesystem;

class CheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("trellis-ckpter-" + std::to_string(::getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A 2-worker job: `w` and `v` per worker (rank r starts with r+1 everywhere). Restore on each
  // worker in rank order; returns each worker's result.
  std::vector<StatusOr<int64_t>> Job(std::vector<std::vector<float>>* w,
                                     std::vector<std::vector<float>>* v, int64_t w_size = 6) {
    checkpointers_.clear();  // they refer to the old cluster's workers
    cluster_ = std::make_unique<testing::LocalCluster>();
    testing::ClusterOptions o;
    o.workers = 2;
    o.timeout_ms = timeout_ms_;
    o.customize = customize_;
    EXPECT_TRUE(cluster_->Start(o).ok());
    w->assign(2, {});
    v->assign(2, {});
    std::vector<StatusOr<int64_t>> out;
    for (int r = 0; r < 2; ++r) {
      Worker& worker = *cluster_->workers[r];
      (*w)[r].assign(w_size, r + 1.0f);
      (*v)[r].assign(3, r + 1.0f);
      EXPECT_TRUE(worker.DeclareKey({.id = 1, .name = "w", .num_elements = w_size}).ok());
      CheckpointOptions co;
      co.path = dir_;
      co.interval_steps = 5;
      co.keep = 2;
      auto ck = Checkpointer::Create(worker, {{"w", (*w)[r].data(), w_size, 1}},
                                     {{"v", (*v)[r].data(), 3}}, co);
      EXPECT_TRUE(ck.ok()) << ck.status().ToString();
      checkpointers_.push_back(std::move(*ck));
      EXPECT_TRUE(worker.FinishDeclarations().ok());
    }
    for (int r = 0; r < 2; ++r) out.push_back(checkpointers_[r]->Restore());
    return out;
  }
  std::string Metrics(int rank) {
    return dynamic_cast<WorkerImpl&>(*cluster_->workers[rank]).registry().Serialize();
  }

  std::string dir_;
  int64_t timeout_ms_ = 5000;
  std::function<void(int, WorkerSetup*)> customize_;
  std::unique_ptr<testing::LocalCluster> cluster_;
  std::vector<std::unique_ptr<Checkpointer>> checkpointers_;
};

TEST_F(CheckpointerTest, FreshStartBroadcastsThenSaveRestoreAndFallBack) {
  std::vector<std::vector<float>> w, v;
  auto r = Job(&w, &v);
  ASSERT_TRUE(r[0].ok() && r[1].ok()) << r[1].status().ToString();
  EXPECT_EQ(*r[0], 0);
  EXPECT_EQ(*r[1], 0);
  EXPECT_EQ(w[1], w[0]);  // rank 0's values everywhere
  EXPECT_EQ(v[1], v[0]);
  EXPECT_FALSE(checkpointers_[0]->Due(4));
  EXPECT_TRUE(checkpointers_[0]->Due(5));
  EXPECT_FALSE(checkpointers_[1]->Due(5));  // only rank 0 saves
  for (int step : {5, 10}) {
    for (auto& x : w[0]) x += 1;
    v[0][2] = static_cast<float>(step);
    ASSERT_TRUE(checkpointers_[0]->Save(step).ok());
    ASSERT_TRUE(checkpointers_[1]->Save(step).ok());  // a no-op
  }
  EXPECT_EQ(checkpointers_[0]->saves(), 2u);
  EXPECT_EQ(checkpointers_[1]->saves(), 0u);
  EXPECT_NE(Metrics(0).find("trellis_worker_checkpoint_saves_total{"), std::string::npos);
  EXPECT_NE(Metrics(0).find("} 2"), std::string::npos) << Metrics(0);

  // A new job on the directory: step 10's values on both workers.
  r = Job(&w, &v);
  ASSERT_TRUE(r[0].ok() && r[1].ok());
  EXPECT_EQ(*r[0], 10);
  EXPECT_EQ(*r[1], 10);
  EXPECT_EQ(w[0], std::vector<float>(6, 3.0f));
  EXPECT_EQ(w[1], w[0]);
  EXPECT_EQ(v[1], (std::vector<float>{1, 1, 10}));

  // The newest file damaged: step 5 is used, the bad file named in the log and counted.
  const std::string newest = dir_ + "/model-000000000010.ckpt";
  std::ofstream(newest, std::ios::binary | std::ios::trunc) << "TRLSCKPT";
  r = Job(&w, &v);
  ASSERT_TRUE(r[0].ok() && r[1].ok());
  EXPECT_EQ(*r[1], 5);
  EXPECT_EQ(v[1], (std::vector<float>{1, 1, 5}));
  EXPECT_EQ(checkpointers_[0]->last_file(), dir_ + "/model-000000000005.ckpt");
  const std::string m = Metrics(0);
  EXPECT_NE(m.find("trellis_worker_checkpoint_rejected_files_total"), std::string::npos) << m;
  EXPECT_NE(m.find("trellis_worker_checkpoint_restores_total"), std::string::npos) << m;
}

// A checkpoint that does not fit the program: rank 0 fails naming the file and the tensor, and
// the other worker learns at once that rank 0 could not restore (no wait for a broadcast).
TEST_F(CheckpointerTest, ACheckpointThatDoesNotFitFailsEveryWorkerClearly) {
  std::vector<std::vector<float>> w, v;
  auto r = Job(&w, &v);
  ASSERT_TRUE(r[0].ok());
  ASSERT_TRUE(checkpointers_[0]->Save(5).ok());
  r = Job(&w, &v, /*w_size=*/7);
  ASSERT_FALSE(r[0].ok());
  EXPECT_EQ(r[0].status().code(), StatusCode::kNotFound);
  EXPECT_NE(r[0].status().message().find(dir_ + "/model-000000000005.ckpt: tensor 'w' has 6 "
                                         "elements, the program has 7"),
            std::string::npos)
      << r[0].status().ToString();
  ASSERT_FALSE(r[1].ok());
  EXPECT_EQ(r[1].status().code(), StatusCode::kAborted);
  EXPECT_NE(r[1].status().message().find("rank 0 could not restore the checkpoint from " + dir_),
            std::string::npos)
      << r[1].status().ToString();
}

// The whole job stopped from outside (docs/checkpoints.md#stopping-a-job-the-exit-checkpoint):
// every checkpoint rank 0 writes is reported to the scheduler; once the job is stopping, rank 0's
// next step boundary writes the exit checkpoint of the step it completed and waits there to be
// stopped (here: until the job's operation timeout, then ABORTED); the other ranks go on.
TEST_F(CheckpointerTest, AStoppingJobGetsAnExitCheckpointAtRankZerosNextStepBoundary) {
  std::atomic<bool> stopping{false};
  std::vector<v1::ReportCheckpointRequest> told;
  std::mutex told_mu;
  // What rank 0 had logged when it told the scheduler of its exit checkpoint: once told, the
  // agents may stop the process at once, so the log says it before (k8s.pod_delete read it).
  bool capturing = false;
  std::string logged_before_told;
  timeout_ms_ = 1000;
  customize_ = [&](int, WorkerSetup* s) {
    s->job_stopping = [&] { return stopping.load(); };
    s->report_checkpoint = [&](const v1::ReportCheckpointRequest& r) {
      std::lock_guard<std::mutex> lock(told_mu);
      told.push_back(r);
      if (r.on_exit() && capturing) {
        logged_before_told = ::testing::internal::GetCapturedStderr();
        capturing = false;
      }
      return Status::Ok();
    };
  };
  std::vector<std::vector<float>> w, v;
  auto r = Job(&w, &v);
  ASSERT_TRUE(r[0].ok() && r[1].ok());
  // Rank 0's checkpointer says at once that it writes exit checkpoints (who stops the job
  // waits for one only then); nothing to resume from in a fresh directory.
  ASSERT_EQ(told.size(), 1u);
  EXPECT_TRUE(told[0].exit_ready());
  EXPECT_EQ(told[0].step(), 0);
  EXPECT_EQ(told[0].path(), "");
  told.clear();
  ASSERT_TRUE(checkpointers_[0]->EndStep(5).ok());  // periodic
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].step(), 5);
  EXPECT_EQ(told[0].path(), dir_ + "/model-000000000005.ckpt");
  EXPECT_FALSE(told[0].on_exit());
  ASSERT_TRUE(checkpointers_[0]->Commit(6).ok());  // not stopping: nothing written
  EXPECT_EQ(told.size(), 1u);

  stopping = true;
  EXPECT_TRUE(checkpointers_[1]->Commit(7).ok()) << "only rank 0 stops at the boundary";
  w[0].assign(w[0].size(), 7.0f);
  const auto start = std::chrono::steady_clock::now();
  ::testing::internal::CaptureStderr();
  capturing = true;
  Status st = checkpointers_[0]->Commit(7);
  if (capturing) {
    capturing = false;
    ::testing::internal::GetCapturedStderr();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(900)) << "it waited";
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
  EXPECT_NE(st.message().find("rank 0 stopped after step 7"), std::string::npos) << st.ToString();
  ASSERT_EQ(told.size(), 2u);
  EXPECT_EQ(told[1].step(), 7);
  EXPECT_TRUE(told[1].on_exit());
  EXPECT_NE(logged_before_told.find("stopped after step 7 (exit checkpoint " + dir_ + "/model-000000000007.ckpt)"),
            std::string::npos)
      << "told the scheduler before saying so in the log:\n" << logged_before_told;
  auto saved = CheckpointDir(dir_, "model", 2).Load(7);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->entries[0].values, w[0]) << "the exit checkpoint holds the values after step 7";

  // Stopped at a step it saved already (a due Save): no second file, the same one reported.
  st = checkpointers_[0]->Save(10);
  EXPECT_EQ(st.code(), StatusCode::kAborted);
  EXPECT_EQ(CheckpointDir(dir_, "model", 2).Steps().value(), (std::vector<int64_t>{10, 7}));
  ASSERT_EQ(told.size(), 4u);  // the save, then the same file as the exit checkpoint
  EXPECT_FALSE(told[2].on_exit());
  EXPECT_EQ(told[3].step(), 10);
  EXPECT_TRUE(told[3].on_exit());

  // The job started again: rank 0 resumes from the exit checkpoint and says so.
  stopping = false;
  told.clear();
  r = Job(&w, &v);
  ASSERT_TRUE(r[0].ok() && r[1].ok());
  EXPECT_EQ(*r[0], 10);
  ASSERT_EQ(told.size(), 2u);
  EXPECT_TRUE(told[0].exit_ready());
  EXPECT_EQ(told[1].step(), 10);
  EXPECT_EQ(told[1].path(), dir_ + "/model-000000000010.ckpt");
  EXPECT_TRUE(told[1].restored());
  EXPECT_FALSE(told[1].on_exit());
}

TEST_F(CheckpointerTest, BadTensorsAreRefusedAtCreate) {
  testing::LocalCluster c;
  ASSERT_TRUE(c.Start({}).ok());
  std::vector<float> a(2);
  auto dup = Checkpointer::Create(*c.workers[0], {{"a", a.data(), 2, 1}}, {{"a", a.data(), 2}});
  EXPECT_EQ(dup.status().message(), "tensor name 'a' tracked twice");
  auto null = Checkpointer::Create(*c.workers[0], {{"a", nullptr, 2, 1}});
  EXPECT_EQ(null.status().code(), StatusCode::kInvalidArgument);
  auto clash = Checkpointer::Create(*c.workers[0], {{"a", a.data(), 2, CheckpointOptions{}.state_key}});
  EXPECT_NE(clash.status().message().find("uses the checkpoint state key"), std::string::npos);
}

}  // namespace
}  // namespace trellis
