// The trellis-mlp job the fault and soak tests run, and what they compare between an undisturbed
// run and a disturbed one: the accuracy rank 0 reports and the final model checkpoint, bit for bit.
#pragma once

#include <cstring>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "common/checkpoint/checkpoint_dir.h"

namespace trellis {

// mlp-tiny (16,128,64,10 on a synthetic teacher) as a TrainingJob; what the tests vary.
struct MlpJob {
  int servers = 2;
  int workers = 2;
  int gpus_per_worker = 0;   // > 1: multi-GPU pods (local groups; over shared memory without GPUs)
  const char* server_restart = nullptr;  // the role's restartPolicy; nullptr: the job's
  const char* worker_restart = nullptr;
  int epochs = 3;
  int batch = 32;
  int train_samples = 8192;
  int test_samples = 1000;
  std::string worker_env;    // YAML lines under the workers' `env:`, "" for none
  int rank0_step_sleep_ms = 0;  // rank 0 sleeps this long each step (the results do not change)
  std::string checkpoint;    // the checkpoint path, "" for none
  int interval_steps = 32;
  const char* server_mode = nullptr;
  std::string scheduler;     // YAML lines under `scheduler:`, "" for none
  std::string run_policy = "    backoffLimit: 2\n    activeDeadlineSeconds: 200\n";  // under `runPolicy:`
  std::string elastic;       // the flow map of `elastic:` ("{minWorkers: 1, maxWorkers: 2}"), "" for none
  std::string command = "[trellis-mlp]";  // the workers' command (flow sequence); args follow
};

inline std::string MlpJobYaml(const std::string& name, const MlpJob& j) {
  auto role = [](const char* what, int replicas, const char* restart) {
    std::string y = "  " + std::string(what) + ":\n    replicas: " + std::to_string(replicas) + "\n";
    if (restart != nullptr) y += "    restartPolicy: " + std::string(restart) + "\n";
    return y;
  };
  std::string y = "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: " + name + "\nspec:\n" +
                  role("servers", j.servers, j.server_restart) + role("workers", j.workers, j.worker_restart) +
                  (j.gpus_per_worker > 1 ? "    gpusPerWorker: " + std::to_string(j.gpus_per_worker) + "\n"
                                         : std::string()) +
                  "    command: " + j.command + "\n"
                  "    args: [--layers, \"16,128,64,10\", --latent-dim, \"8\", --teacher-hidden, \"16\",\n"
                  "           --epochs, \"" + std::to_string(j.epochs) + "\", --batch, \"" + std::to_string(j.batch) +
                  "\", --lr, \"0.02\", --train-samples, \"" + std::to_string(j.train_samples) + "\",\n"
                  "           --test-samples, \"" + std::to_string(j.test_samples) +
                  "\", --target-accuracy, \"0.85\"" +
                  (j.rank0_step_sleep_ms > 0
                       ? ", --slow-rank, \"0\", --step-sleep-ms, \"" + std::to_string(j.rank0_step_sleep_ms) + "\""
                       : std::string()) +
                  "]\n";
  if (!j.worker_env.empty()) y += "    env:\n" + j.worker_env;
  y += "  sliceBytes: 16384\n";
  if (!j.checkpoint.empty()) {
    y += "  checkpoint:\n    path: " + j.checkpoint + "\n    intervalSteps: " + std::to_string(j.interval_steps) +
         "\n    keep: 2\n";
  }
  if (j.server_mode != nullptr) y += "  serverMode: " + std::string(j.server_mode) + "\n";
  if (!j.scheduler.empty()) y += "  scheduler:\n" + j.scheduler;
  if (!j.elastic.empty()) y += "  elastic: " + j.elastic + "\n";
  return y + "  runPolicy:\n" + j.run_policy;
}

// The test accuracy rank 0 reports in `out`, in percent; -1 when it reported none.
inline double MlpAccuracy(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("RESULT: test accuracy ([0-9.]+)%"))) return -1;
  return std::stod(m[1]);
}

// The bytes all workers pushed as rank 0 reports them in `out`; -1 when it reported none.
inline double MlpBytesPushed(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("RESULT: pushed ([0-9]+) B"))) return -1;
  return std::stod(m[1]);
}

// The bytes all workers pulled, as above.
inline double MlpBytesPulled(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("RESULT: pushed [0-9]+ B, pulled ([0-9]+) B"))) return -1;
  return std::stod(m[1]);
}

// The newest "model" checkpoints under both folders are at `steps` and equal bit for bit (weights
// and momentum); `what` names the disturbance in the failure message.
inline void ExpectSameFinalModel(const std::string& undisturbed_dir, const std::string& disturbed_dir,
                                 int steps, const std::string& what) {
  auto x = CheckpointDir(undisturbed_dir, "model", 2).LoadNewest();
  auto y = CheckpointDir(disturbed_dir, "model", 2).LoadNewest();
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  ASSERT_EQ(x->checkpoint.step, steps);
  ASSERT_EQ(y->checkpoint.step, steps);
  ASSERT_EQ(x->checkpoint.entries.size(), y->checkpoint.entries.size());
  for (size_t i = 0; i < x->checkpoint.entries.size(); ++i) {
    const auto& u = x->checkpoint.entries[i];
    const auto& v = y->checkpoint.entries[i];
    ASSERT_EQ(u.values.size(), v.values.size());
    EXPECT_EQ(std::memcmp(u.values.data(), v.values.data(), u.values.size() * sizeof(float)), 0)
        << u.name << " differs between the undisturbed run and the one with " << what;
  }
}

}  // namespace trellis
