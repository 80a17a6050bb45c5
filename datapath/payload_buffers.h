// The payload buffers a server-side TCP link keeps between frames (tcp/server_link.cc).
//
// std::vector<float>::resize zero-fills every element it adds, and fresh memory also costs page
// faults, so a buffer that changes size between frames costs a memset of the difference each
// time it grows back. A connection reads mostly slices of one size (sliceBytes) with small bulk
// frames in between: taking a kept buffer at least as large as the frame, and never shrinking
// it, keeps the large ones large (bulks use their front; Request::Chunks() knows the real
// length). On the MLP benchmark this was ~6% of the server's CPU (docs/performance.md).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace trellis {

class PayloadBuffers {
 public:
  explicit PayloadBuffers(size_t keep) : keep_(keep) {}

  // A buffer of at least `floats` elements: the smallest kept one that is large enough (no
  // zero-fill), else the largest kept one, else an empty one. Grow() it outside any lock.
  std::vector<float> Take(size_t floats) {
    if (kept_.empty()) return {};
    // Is a buffer of `s` elements a better pick than one of `b`?
    auto better = [floats](size_t s, size_t b) {
      if ((s >= floats) != (b >= floats)) return s >= floats;  // fitting beats not fitting
      return s >= floats ? s < b : s > b;  // both fit: the smaller; neither: the larger
    };
    size_t best = 0;
    for (size_t i = 1; i < kept_.size(); ++i) {
      if (better(kept_[i].size(), kept_[best].size())) best = i;
    }
    std::vector<float> out = std::move(kept_[best]);
    kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(best));
    return out;
  }

  // Makes `b` hold at least `floats` elements; only what it lacked is zero-filled.
  static void Grow(std::vector<float>* b, size_t floats) {
    if (b->size() < floats) b->resize(floats);
  }

  // Keeps `b` for reuse: while fewer than `keep` are kept, else in place of the smallest kept
  // one if `b` is larger (memory stays bounded by `keep` buffers of the largest frame).
  void Give(std::vector<float> b) {
    if (b.empty()) return;
    if (kept_.size() < keep_) {
      kept_.push_back(std::move(b));
      return;
    }
    size_t smallest = 0;
    for (size_t i = 1; i < kept_.size(); ++i) {
      if (kept_[i].size() < kept_[smallest].size()) smallest = i;
    }
    if (!kept_.empty() && kept_[smallest].size() < b.size()) kept_[smallest] = std::move(b);
  }

  size_t kept() const { return kept_.size(); }

 private:
  const size_t keep_;
  std::vector<std::vector<float>> kept_;
};

}  // namespace trellis
