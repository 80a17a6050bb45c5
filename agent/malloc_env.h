// glibc malloc settings the agent gives a worker program (docs/performance.md#malloc-settings).
//
// glibc moves its mmap and trim thresholds with what a process frees (up to 32 MiB and 64 MiB):
// a framework that frees tens of MiB of tensors every step then has its heap trimmed and grown
// again each step, and every regrown page is faulted in and zeroed on the training thread. How
// often depends on the first frees of a run, so the same job ran 10-20% apart from run to run
// (bench_models' transformer). Fixed thresholds keep freed memory for the next step.
#pragma once

#include <map>
#include <string>

namespace trellis {

// Adds MALLOC_MMAP_THRESHOLD_=33554432 (allocations of 32 MiB and more come from mmap: glibc's
// largest dynamic threshold) and MALLOC_TRIM_THRESHOLD_=1073741824 (up to 1 GiB of freed memory
// at the heap's top is kept for reuse) to a worker program's environment `env`, unless its job
// tuned malloc itself (any MALLOC_*_ threshold, top pad or mmap maximum, or glibc.malloc
// tunables in GLIBC_TUNABLES) or set TRELLIS_MALLOC_DEFAULTS=0 (kEnvMallocDefaults).
void AddMallocDefaults(std::map<std::string, std::string>& env);

}  // namespace trellis
