// Little-endian field access for the data-path frame headers (gRPC and TCP share the layout).
// The build targets little-endian hosts; memcpy keeps it alignment-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace trellis::wire {

template <typename T>
inline void PutLe(uint8_t* p, size_t off, T v) {
  std::memcpy(p + off, &v, sizeof(T));
}

template <typename T>
inline T GetLe(const uint8_t* p, size_t off) {
  T v;
  std::memcpy(&v, p + off, sizeof(T));
  return v;
}

}  // namespace trellis::wire
