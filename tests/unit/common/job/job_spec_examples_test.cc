// Every sample job shipped in examples/ must parse: the files users copy first.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/job/job_spec.h"

namespace trellis {
namespace {

namespace fs = std::filesystem;

const fs::path kExamples = fs::path(TRELLIS_SOURCE_DIR) / "examples";

TEST(JobSpecExamplesTest, EveryExampleJobParses) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kExamples / "jobs")) {
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  }
  // The demo jobs beside the example programs are TrainingJobs too.
  for (const char* name : {"mlp.yaml", "sample-job.yaml"}) {
    if (fs::exists(kExamples / name)) files.push_back(kExamples / name);
  }
  ASSERT_GE(files.size(), 2u);
  for (const fs::path& f : files) {
    auto job = LoadJobSpecFile(f.string());
    EXPECT_TRUE(job.ok()) << job.status().ToString();
  }
}

TEST(JobSpecExamplesTest, MinimalIsMinimal) {
  auto job = LoadJobSpecFile((kExamples / "jobs" / "minimal.yaml").string());
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  JobSpec want;
  want.name = "minimal";
  want.workers.command = {"trellis-mlp"};
  EXPECT_EQ(*job, want);
}

TEST(JobSpecExamplesTest, FullSetsNonDefaults) {
  auto job = LoadJobSpecFile((kExamples / "jobs" / "full.yaml").string());
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->ns, "research");
  EXPECT_EQ(job->labels.at("experiment"), "42");
  EXPECT_EQ(job->workers.replicas, 4);
  EXPECT_EQ(job->sliceBytes, 2 << 20);
  EXPECT_EQ(job->keyDispatch, KeyDispatch::kBalanced);
  EXPECT_EQ(job->compression.type, CompressionType::kTwoBit);
  EXPECT_EQ(job->serverMode, ServerMode::kUpdate);
  EXPECT_EQ(job->optimizer.type, OptimizerType::kAdam);
  EXPECT_EQ(job->RestartPolicyFor(job->servers), RestartPolicy::kAlways);
  EXPECT_EQ(job->RestartPolicyFor(job->workers), RestartPolicy::kExitCode);
  EXPECT_EQ(job->runPolicy.activeDeadlineSeconds, 7200);
  EXPECT_NE(job->workers.templateYaml.find("nodeSelector"), std::string::npos);
  EXPECT_NE(job->checkpoint.volumeYaml.find("claimName: mlp-full-checkpoints"), std::string::npos);
  EXPECT_EQ(job->runPolicy.schedulingPolicy.gangScheduler, GangScheduler::kVolcano);
  EXPECT_EQ(job->runPolicy.schedulingPolicy.queue, "research");
  EXPECT_EQ(job->runPolicy.schedulingPolicy.priorityClass, "high");
}

}  // namespace
}  // namespace trellis
