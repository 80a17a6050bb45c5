// The command form: trellis-launch [job flags] -- COMMAND (launcher/command_job.h).
#include "launcher/command_job.h"

#include <gtest/gtest.h>

#include "launcher/plan.h"

namespace trellis {
namespace {

TEST(CommandJobTest, FlagsAndCommandBuildTheJob) {
  auto o = ParseLaunchArgs({"--quiet", "--workers", "2", "--servers=3", "--transport", "grpc",
                            "--compression", "2bit", "--restart-policy", "OnFailure",
                            "--backoff-limit", "5", "--", "python3", "dir/train_cnn.py", "--epochs",
                            "1", "--workers", "9"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_TRUE(o->quiet);
  EXPECT_TRUE(o->job_file.empty());
  // Everything after "--" is the program's, its own flags included.
  EXPECT_EQ(o->command, (std::vector<std::string>{"python3", "dir/train_cnn.py", "--epochs", "1",
                                                  "--workers", "9"}));
  auto job = JobFromCommand(o->job_flags, o->command);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->name, "train-cnn");
  EXPECT_EQ(job->workers.replicas, 2);
  EXPECT_EQ(job->servers.replicas, 3);
  EXPECT_EQ(job->workers.command, o->command);
  EXPECT_EQ(job->transport, Transport::kGrpc);
  EXPECT_EQ(job->compression.type, CompressionType::kTwoBit);
  EXPECT_EQ(job->RestartPolicyFor(job->workers), RestartPolicy::kOnFailure);
  EXPECT_EQ(job->runPolicy.backoffLimit, 5);
  // The YAML it prints runs the same job.
  auto again = ParseJobSpec(JobSpecToYaml(*job));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *job);
}

TEST(CommandJobTest, DefaultsAndNames) {
  auto o = ParseLaunchArgs({"--", "./My_Trainer"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  auto job = JobFromCommand(o->job_flags, o->command);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->name, "my-trainer");
  EXPECT_EQ(job->workers.replicas, 1);
  EXPECT_EQ(job->servers.replicas, 1);
  EXPECT_EQ(job->transport, Transport::kTcp);
  EXPECT_EQ(JobFromCommand(o->job_flags, {"python3", "9lives.py"})->name, "job-9lives");
  o = ParseLaunchArgs({"--name", "exp-1", "--", "python3", "t.py"});
  EXPECT_EQ(JobFromCommand(o->job_flags, o->command)->name, "exp-1");
}

TEST(CommandJobTest, FlagsOverrideAJobFile) {
  auto spec = ParseJobSpec(
      "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: f}\n"
      "spec:\n  workers: {replicas: 4, command: [x], restartPolicy: Never}\n");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto o = ParseLaunchArgs({"--workers", "2", "--restart-policy", "Always", "f.yaml"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  auto job = ApplyJobFlags(*spec, o->job_flags);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->workers.replicas, 2);
  EXPECT_EQ(job->RestartPolicyFor(job->workers), RestartPolicy::kAlways);
  EXPECT_EQ(job->workers.command, std::vector<std::string>{"x"});
}

TEST(CommandJobTest, BadFlagsSayWhatIsWrong) {
  auto msg = [](std::vector<std::string> a) { return ParseLaunchArgs(a).status().message(); };
  EXPECT_EQ(msg({"--workers", "two", "--", "p"}), "flag --workers: not an integer, got 'two'");
  EXPECT_EQ(msg({"--workers", "0", "--", "p"}), "flag --workers: must be in 1..10000, got 0");
  EXPECT_EQ(msg({"--servers", "--", "p"}), "flag --servers needs a value");
  EXPECT_EQ(msg({"--name=", "--", "p"}), "flag --name needs a value");
  EXPECT_EQ(msg({"--slice-bytes", "2", "--", "p"}), "flag --slice-bytes: must be in 4..1073741824, got 2");
  EXPECT_EQ(msg({"--server-mode", "sum", "--", "p"}), "flag --server-mode: 'sum' is not one of aggregate, update");
  EXPECT_EQ(msg({"--transport", "udp", "--", "p"}), "flag --transport: 'udp' is not one of tcp, grpc");
  EXPECT_EQ(msg({"--compression=4bit", "--", "p"}),
            "flag --compression: '4bit' is not one of none, 2bit");
  EXPECT_EQ(msg({"--restart-policy", "onfailure", "--", "p"}),
            "flag --restart-policy: 'onfailure' is not one of Never, OnFailure, Always, ExitCode");
  EXPECT_EQ(msg({"--workers", "2", "--"}), "no command after '--' (the workers' program)");
  EXPECT_EQ(msg({"--workers", "2"}), "no job file given (or a command after '--')");
  EXPECT_EQ(msg({"job.yaml", "--", "p"}),
            "give a job file or a command after '--', not both (got 'job.yaml' and 'p')");
  EXPECT_EQ(msg({"--wrokers", "2", "--", "p"}), "unknown flag --wrokers");
  // A bound the job parser enforces, reported with the field.
  auto o = ParseLaunchArgs({"--name", "Bad_Name", "--", "p"});
  ASSERT_TRUE(o.ok());
  auto job = JobFromCommand(o->job_flags, o->command);
  ASSERT_FALSE(job.ok());
  EXPECT_NE(job.status().message().find("metadata.name"), std::string::npos)
      << job.status().message();
}

}  // namespace
}  // namespace trellis
