#include "agent/malloc_env.h"

namespace trellis {

void AddMallocDefaults(std::map<std::string, std::string>& env) {
  if (auto it = env.find(kEnvMallocDefaults); it != env.end() && it->second == "0") return;
  // Any one of these turns glibc's dynamic thresholds off: the job's own tuning wins whole.
  for (const char* own : {kEnvMallocMmapThreshold, kEnvMallocTrimThreshold, "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"}) {
    if (env.count(own)) return;
  }
  if (auto it = env.find("GLIBC_TUNABLES"); it != env.end() && it->second.find("glibc.malloc.") != std::string::npos) {
    return;
  }
  env[kEnvMallocMmapThreshold] = kMallocMmapThresholdBytes;
  env[kEnvMallocTrimThreshold] = kMallocTrimThresholdBytes;
}

}  // namespace trellis
