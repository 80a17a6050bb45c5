#include "pserver/slice.h"

#include "datapath/codec/packed_sum.h"

namespace trellis {

Packed KeptResults::PackedFor(int64_t step) {
  const int i = static_cast<int>(step % 2);
  if (step_[i] != step || packable_[i] == 0) return nullptr;
  if (!packed_[i]) {
    const int bits = PackedSumBits(pushers_[i]);
    const std::vector<float>& sum = *results_[i];
    auto bytes =
        std::make_shared<std::vector<uint8_t>>(bits == 0 ? 0 : PackedSumBytes(sum.size(), bits));
    if (bits == 0 || !PackSum(sum.data(), sum.size(), packable_[i], bits, bytes->data(),
                              bytes->size()).ok()) {
      // Too many workers for 8 bits, or (should not happen) a sum that is not one of 2-bit
      // pushes: float32 answers for this step, and no second try.
      packable_[i] = 0;
      return nullptr;
    }
    packed_[i] = std::move(bytes);
  }
  return packed_[i];
}

}  // namespace trellis
