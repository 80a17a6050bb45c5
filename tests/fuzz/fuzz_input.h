// Pieces every fuzz harness here uses: a check that stops the fuzzer (libFuzzer reports the
// input) and a reader that takes fields from the input in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace trellis_fuzz {

inline void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// Reads little pieces of the input in order; zeros once it runs out.
struct Reader {
  const uint8_t* data;
  size_t size;
  uint32_t U32() {
    uint32_t v = 0;
    const size_t take = size < 4 ? size : 4;
    std::memcpy(&v, data, take);
    data += take;
    size -= take;
    return v;
  }
  uint8_t U8() {
    if (size == 0) return 0;
    --size;
    return *data++;
  }
};

}  // namespace trellis_fuzz
