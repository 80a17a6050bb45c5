// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of checkpoint sections.
// Uses the SSE4.2 crc32 instruction when the CPU has it, else a slicing-by-8 table; both give
// the same value (tests pin the standard vectors, e.g. Crc32c("123456789") == 0xE3069283).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace trellis {

// Extends `crc` (the value of the bytes before; 0 to start) over `n` bytes at `data`.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }
inline uint32_t Crc32c(std::string_view s) { return Crc32cExtend(0, s.data(), s.size()); }

// The portable table path alone (tests compare it with the dispatched one).
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);

}  // namespace trellis
