// The CPU local group over POSIX shared memory.
//
// Layout: a 64-byte header (a sense-reversing barrier on two futex words) and two staging
// buffers, each G x G pieces of `piece` floats: piece [src][part]. A collective walks its
// tensor in steps of one piece per part; step k uses buffer k % 2, so one barrier per step is
// enough (a buffer is rewritten only after everyone passed the barrier that followed its last
// read). All-zero is a valid header, so no rank has to initialise the segment first.
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/process/local_group_name.h"
#include "worker-lib/src/local_group.h"

namespace trellis {

namespace {

struct alignas(64) Header {
  std::atomic<uint32_t> arrived;     // ranks at the current barrier
  std::atomic<uint32_t> generation;  // futex word: bumped when the last rank arrives
  std::atomic<uint32_t> attached;    // ranks that mapped the segment
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

long Futex(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* timeout) {
  // Not FUTEX_PRIVATE: the waiters are other processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, timeout, nullptr, 0);
}

class ShmLocalGroup final : public LocalGroup {
 public:
  ShmLocalGroup(const LocalGroupOptions& o, void* base, size_t bytes, int64_t piece)
      : o_(o), base_(base), bytes_(bytes), piece_(piece) {
    header_ = static_cast<Header*>(base);
    data_ = reinterpret_cast<float*>(static_cast<char*>(base) + sizeof(Header));
  }
  ~ShmLocalGroup() override { munmap(base_, bytes_); }

  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }
  const char* kind() const override { return "shm"; }

  // Waits until all ranks attached; rank 0 then unlinks the name.
  Status Attach() {
    header_->attached.fetch_add(1);
    TRELLIS_RETURN_IF_ERROR(Barrier());
    if (o_.rank == 0) shm_unlink(LocalGroupShmName(o_.name, o_.channel).c_str());
    return Status::Ok();
  }

  Status ReduceScatter(const float* in, int64_t n, float* part) override {
    const int g = o_.size, r = o_.rank;
    const PartRange mine = LocalPart(n, g, r);
    const int64_t steps = Steps(n);
    for (int64_t k = 0; k < steps; ++k) {
      float* buf = Buffer();
      for (int p = 0; p < g; ++p) {
        const PartRange pr = LocalPart(n, g, p);
        const int64_t len = PieceLen(pr, k);
        if (len > 0) std::memcpy(Piece(buf, r, p), in + pr.begin + k * piece_, len * 4);
      }
      TRELLIS_RETURN_IF_ERROR(Barrier());
      const int64_t len = PieceLen(mine, k);
      float* dst = part + k * piece_;
      if (len > 0) {
        std::memcpy(dst, Piece(buf, 0, r), len * 4);
        for (int s = 1; s < g; ++s) {
          const float* src = Piece(buf, s, r);
          for (int64_t i = 0; i < len; ++i) dst[i] += src[i];
        }
      }
    }
    return Status::Ok();
  }

  Status AllGather(const float* part, int64_t n, float* out) override {
    const int g = o_.size, r = o_.rank;
    const PartRange mine = LocalPart(n, g, r);
    const int64_t steps = Steps(n);
    for (int64_t k = 0; k < steps; ++k) {
      float* buf = Buffer();
      int64_t len = PieceLen(mine, k);
      if (len > 0) std::memcpy(Piece(buf, r, 0), part + k * piece_, len * 4);
      TRELLIS_RETURN_IF_ERROR(Barrier());
      for (int p = 0; p < g; ++p) {
        const PartRange pr = LocalPart(n, g, p);
        len = PieceLen(pr, k);
        float* dst = out + pr.begin + k * piece_;
        // Own piece: already in place when `part` aliases `out`.
        if (len > 0 && !(p == r && dst == part + k * piece_)) {
          std::memcpy(dst, Piece(buf, p, 0), len * 4);
        }
      }
    }
    return Status::Ok();
  }

  Status Broadcast(float* data, int64_t n, int root) override {
    if (root < 0 || root >= o_.size) {
      return InvalidArgumentError("local broadcast root " + std::to_string(root) + " outside [0, " +
                                  std::to_string(o_.size) + ")");
    }
    const int64_t chunk = piece_ * o_.size * o_.size;  // a whole buffer per step
    for (int64_t off = 0; off < n; off += chunk) {
      float* buf = Buffer();
      const int64_t len = std::min(chunk, n - off);
      if (o_.rank == root) std::memcpy(buf, data + off, len * 4);
      TRELLIS_RETURN_IF_ERROR(Barrier());
      if (o_.rank != root) std::memcpy(data + off, buf, len * 4);
    }
    return Status::Ok();
  }

 private:
  int64_t Steps(int64_t n) const {
    const int64_t longest = LocalPart(n, o_.size, 0).count;
    return (longest + piece_ - 1) / piece_;
  }
  int64_t PieceLen(const PartRange& pr, int64_t k) const {
    return std::clamp<int64_t>(pr.count - k * piece_, 0, piece_);
  }
  // The staging buffer of the next step (alternating).
  float* Buffer() {
    float* b = data_ + (step_ % 2) * piece_ * o_.size * o_.size;
    ++step_;
    return b;
  }
  float* Piece(float* buf, int src, int part) const {
    return buf + (static_cast<int64_t>(src) * o_.size + part) * piece_;
  }

  Status Barrier() {
    const uint32_t gen = header_->generation.load(std::memory_order_acquire);
    if (header_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 ==
        static_cast<uint32_t>(o_.size)) {
      header_->arrived.store(0, std::memory_order_relaxed);
      header_->generation.fetch_add(1, std::memory_order_release);
      Futex(&header_->generation, FUTEX_WAKE, INT32_MAX, nullptr);
      return Status::Ok();
    }
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(o_.timeout_ms);
    while (header_->generation.load(std::memory_order_acquire) == gen) {
      auto left = deadline - std::chrono::steady_clock::now();
      if (left <= std::chrono::steady_clock::duration::zero()) {
        return DeadlineExceededError(
            "local group " + o_.name + " (channel " + o_.channel + "): local rank " +
            std::to_string(o_.rank) + " waited " + std::to_string(o_.timeout_ms) +
            " ms for the other " + std::to_string(o_.size - 1) +
            " local processes (did one exit?)");
      }
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      Futex(&header_->generation, FUTEX_WAIT, gen, &ts);  // EAGAIN/EINTR/ETIMEDOUT: re-check
    }
    return Status::Ok();
  }

  const LocalGroupOptions o_;
  void* const base_;
  const size_t bytes_;
  const int64_t piece_;  // floats per (src, part) piece
  Header* header_;
  float* data_;
  uint64_t step_ = 0;  // collective steps so far; the same on every rank
};

}  // namespace

StatusOr<std::unique_ptr<LocalGroup>> OpenShmLocalGroup(const LocalGroupOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    return InvalidArgumentError("local rank " + std::to_string(o.rank) + " outside [0, " +
                                std::to_string(o.size) + ")");
  }
  if (o.name.empty()) return InvalidArgumentError("local group without a name");
  if (o.timeout_ms <= 0) return InvalidArgumentError("local group timeout must be > 0");
  const int64_t g = o.size;
  const int64_t piece = std::max<int64_t>(16, o.chunk_bytes / 4 / (g * g)) & ~int64_t{15};
  const size_t bytes = sizeof(Header) + static_cast<size_t>(2 * g * g * piece) * sizeof(float);
  const std::string shm = LocalGroupShmName(o.name, o.channel);
  int fd = shm_open(shm.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) return UnavailableError("shm_open " + shm + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || (st.st_size != 0 && static_cast<size_t>(st.st_size) != bytes) ||
      (st.st_size == 0 && ftruncate(fd, static_cast<off_t>(bytes)) != 0)) {
    int e = errno;
    close(fd);
    return FailedPreconditionError("shm " + shm + ": size " + std::to_string(st.st_size) +
                                   ", want " + std::to_string(bytes) +
                                   " (another group of a different size under this name?) " +
                                   std::strerror(e));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return UnavailableError("mmap " + shm + ": " + std::strerror(errno));
  auto group = std::make_unique<ShmLocalGroup>(o, base, bytes, piece);
  if (Status s = group->Attach(); !s.ok()) {
    shm_unlink(shm.c_str());
    return s;
  }
  return std::unique_ptr<LocalGroup>(std::move(group));
}

}  // namespace trellis
