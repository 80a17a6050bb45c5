// The bytes of one retained push (server_connection.h: a worker keeps its last two pushes of every
// slice for a restarted server), in pages of their own when large rather than from malloc.
//
// Why: retained pushes are two copies of the model's gradients, reused slice by slice for the
// whole job. Taken from malloc they land in its arenas beside the training program's tensors
// (a connection's writer thread may share an arena with the program's thread); bench_models'
// transformer then faulted in fresh pages for its per-step tensors (perf: clear_page 15% of a
// worker's CPU, against 3% without retained pushes) and ran 15-18% slower. Mapped on their own,
// they stay out of malloc's way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace trellis {

class RetainedBytes {
 public:
  // `size` bytes, not zeroed: from mmap at kMapAtLeast bytes or more, else from new[].
  static std::shared_ptr<RetainedBytes> Make(size_t size);
  ~RetainedBytes();
  RetainedBytes(const RetainedBytes&) = delete;
  RetainedBytes& operator=(const RetainedBytes&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

  static constexpr size_t kMapAtLeast = 64 << 10;

 private:
  RetainedBytes(uint8_t* data, size_t size, bool mapped)
      : data_(data), size_(size), mapped_(mapped) {}
  uint8_t* const data_;
  const size_t size_;
  const bool mapped_;  // munmap, else delete[]
};

}  // namespace trellis
