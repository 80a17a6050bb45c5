// The malloc settings a worker program gets from its agent (agent/malloc_env.h).
#include "agent/malloc_env.h"

#include <gtest/gtest.h>

namespace trellis {
namespace {

using Env = std::map<std::string, std::string>;

TEST(MallocEnvTest, AWorkerGetsFixedThresholds) {
  Env env{{"PATH", "/usr/bin"}, {"MALLOC_ARENA_MAX", "4"}};
  AddMallocDefaults(env);
  EXPECT_EQ(env["MALLOC_MMAP_THRESHOLD_"], "33554432");
  EXPECT_EQ(env["MALLOC_TRIM_THRESHOLD_"], "1073741824");
  EXPECT_EQ(env["MALLOC_ARENA_MAX"], "4") << "other settings are the job's";
  EXPECT_EQ(env.size(), 4u);
}

TEST(MallocEnvTest, AJobsOwnMallocTuningWinsWhole) {
  for (const char* own : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"}) {
    Env env{{own, "4096"}};
    AddMallocDefaults(env);
    EXPECT_EQ(env, (Env{{own, "4096"}})) << own;
  }
  Env tunables{{"GLIBC_TUNABLES", "glibc.malloc.trim_threshold=4096"}};
  AddMallocDefaults(tunables);
  EXPECT_EQ(tunables.size(), 1u);
  // Tunables of something else leave malloc to us.
  Env other{{"GLIBC_TUNABLES", "glibc.rtld.nns=2"}};
  AddMallocDefaults(other);
  EXPECT_EQ(other.size(), 3u);
}

TEST(MallocEnvTest, OffWithTrellisMallocDefaultsZero) {
  Env off{{"TRELLIS_MALLOC_DEFAULTS", "0"}};
  AddMallocDefaults(off);
  EXPECT_EQ(off.size(), 1u);
  Env on{{"TRELLIS_MALLOC_DEFAULTS", "1"}};
  AddMallocDefaults(on);
  EXPECT_EQ(on.size(), 3u);
}

}  // namespace
}  // namespace trellis
