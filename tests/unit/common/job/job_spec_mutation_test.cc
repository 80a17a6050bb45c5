// Seeded mutations of valid jobs (YAML and JSON): whatever the bytes, ParseJobSpec returns a
// Status with a message (never throws, crashes or runs away), and what it accepts round-trips.
// A fixed seed keeps it deterministic; the longer random runs found yaml-cpp#1040 (see
// common/job/yaml_load.h).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include "common/job/job_spec.h"

namespace trellis {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// 0 when every mutant behaves; otherwise prints the first bad input and returns 1.
int MutateAndCheck(const std::string& base, uint32_t seed, int count) {
#if !defined(__SANITIZE_ADDRESS__)
  rlimit cap{1L << 30, 1L << 30};  // a runaway parser fails the test, not the machine
  setrlimit(RLIMIT_AS, &cap);
#endif
  const std::string alphabet = "{}[]:,-#&*!|>'\"\n \t0123456789.aZ~%@`?";
  std::mt19937 rng(seed);
  for (int i = 0; i < count; ++i) {
    std::string s = base;
    for (int k = 1 + static_cast<int>(rng() % 4); k > 0 && !s.empty(); --k) {
      const size_t pos = rng() % s.size();
      switch (rng() % 3) {
        case 0: s[pos] = alphabet[rng() % alphabet.size()]; break;
        case 1: s.erase(pos, 1 + rng() % 8); break;
        default: s.insert(pos, 1, alphabet[rng() % alphabet.size()]); break;
      }
    }
    StatusOr<JobSpec> job = ParseJobSpec(s);
    bool good = job.ok() || (!job.status().message().empty() &&
                             job.status().code() == StatusCode::kInvalidArgument);
    if (job.ok()) {
      StatusOr<JobSpec> again = ParseJobSpec(JobSpecToYaml(*job));
      good = again.ok() && *again == *job;
    }
    if (!good) {
      std::fprintf(stderr, "mutant %d misbehaved:\n%s\n", i, s.c_str());
      return 1;
    }
  }
  return 0;
}

TEST(JobSpecMutationTest, FullYaml) {
  const std::string base = ReadFile(std::string(TRELLIS_SOURCE_DIR) + "/examples/jobs/full.yaml");
  ASSERT_FALSE(base.empty());
  EXPECT_EXIT(std::_Exit(MutateAndCheck(base, 1, 2000)), ::testing::ExitedWithCode(0), "");
}

TEST(JobSpecMutationTest, ApiServerJson) {
  const std::string base =
      ReadFile(std::string(TRELLIS_SOURCE_DIR) + "/tests/unit/common/job/testdata/apiserver.json");
  ASSERT_FALSE(base.empty());
  EXPECT_EXIT(std::_Exit(MutateAndCheck(base, 7, 2000)), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace trellis
