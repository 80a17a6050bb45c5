// What the fault tests compare between an undisturbed trellis-mlp run and a disturbed one: the
// accuracy rank 0 reports and the final model checkpoint, bit for bit.
#pragma once

#include <cstring>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "common/checkpoint_dir.h"

namespace trellis {

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
