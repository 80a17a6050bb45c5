#include "agent/malloc_env.h"

#include "common/config/env_names.h"

namespace trellis {
namespace {

// glibc's own names (mallopt(3)), not Trellis's.
constexpr char kMmapThreshold[] = "MALLOC_MMAP_THRESHOLD_";
constexpr char kTrimThreshold[] = "MALLOC_TRIM_THRESHOLD_";

}  // namespace

void AddMallocDefaults(std::map<std::string, std::string>& env) {
  if (auto it = env.find(kEnvMallocDefaults); it != env.end() && it->second == "0") return;
  // Any one of these turns glibc's dynamic thresholds off: the job's own tuning wins whole.
  for (const char* own : {kMmapThreshold, kTrimThreshold, "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"}) {
    if (env.count(own)) return;
  }
  if (auto it = env.find("GLIBC_TUNABLES"); it != env.end() && it->second.find("glibc.malloc.") != std::string::npos) {
    return;
  }
  env[kMmapThreshold] = "33554432";
  env[kTrimThreshold] = "1073741824";
}

}  // namespace trellis
