#include "worker-lib/src/retained_bytes.h"

#include <sys/mman.h>

namespace trellis {

std::shared_ptr<RetainedBytes> RetainedBytes::Make(size_t size) {
  if (size >= kMapAtLeast) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      return std::shared_ptr<RetainedBytes>(
          new RetainedBytes(static_cast<uint8_t*>(p), size, /*mapped=*/true));
    }
    // Out of mappings (vm.max_map_count): malloc's memory still works, only slower.
  }
  return std::shared_ptr<RetainedBytes>(new RetainedBytes(new uint8_t[size], size, false));
}

RetainedBytes::~RetainedBytes() {
  if (mapped_) {
    munmap(data_, size_);
  } else {
    delete[] data_;
  }
}

}  // namespace trellis
