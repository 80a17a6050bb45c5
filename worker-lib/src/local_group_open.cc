// Picks the local group's implementation at run time: NCCL when it was built (CUDA present at
// build time) and this process sees a device, else shared memory.
#include "worker-lib/src/local_group.h"

#ifdef TRELLIS_HAVE_NCCL
#include "worker-lib/cuda/nccl_local_group.h"
#include "worker-lib/cuda/twobit_cuda.h"
#endif

namespace trellis {

StatusOr<std::unique_ptr<LocalGroup>> OpenLocalGroup(const LocalGroupOptions& options,
                                                     bool force_cpu) {
#ifdef TRELLIS_HAVE_NCCL
  if (!force_cpu && CudaDeviceCount() > 0) {
    LocalGroupOptions boot = options;
    boot.channel += "-id";
    boot.chunk_bytes = 4096;
    TRELLIS_ASSIGN_OR_RETURN(auto bootstrap, OpenShmLocalGroup(boot));
    return OpenNcclLocalGroup(options, *bootstrap);
  }
#else
  (void)force_cpu;
#endif
  return OpenShmLocalGroup(options);
}

}  // namespace trellis
