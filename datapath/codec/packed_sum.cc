// Packed pull answers (packed_sum.h). Everything read from a packed answer is checked against
// its length before use: answers arrive from the network.
#include "datapath/codec/packed_sum.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "datapath/codec/packed_sum_kernels.h"
#include "datapath/codec/twobit.h"

namespace trellis {
namespace {

Status PackedError(const std::string& what) { return InvalidArgumentError("packed answer: " + what); }

std::string FloatText(float v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
  return buf;
}

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// How far sum / t may be from an integer: a float32 sum of W values +-t is within a few ulps of
// k*t, far closer than this; anything farther is not such a sum and is not rounded.
constexpr float kTolerance = 1.0f / 64;

// The count in a nibble, sign-extended (0..7 -> 0..7, 8..15 -> -8..-1).
inline int32_t Nibble(uint8_t v) { return static_cast<int32_t>(v & 15) - ((v & 8) << 1); }

}  // namespace

int PackedSumBits(int64_t summands) {
  if (summands >= 1 && summands <= PackedSumMaxCount(4)) return 4;
  if (summands >= 1 && summands <= PackedSumMaxCount(8)) return 8;
  return 0;
}

Status PackSum(const float* sum, size_t n, float threshold, int bits, uint8_t* out,
               size_t out_bytes) {
  if (bits != 4 && bits != 8) return PackedError("bits must be 4 or 8, got " + std::to_string(bits));
  if (!ValidateTwoBitThreshold(threshold).ok()) {
    return PackedError("threshold must be finite and > 0, got " + FloatText(threshold));
  }
  if (n > UINT32_MAX) return PackedError(std::to_string(n) + " elements exceed the count field");
  if (out_bytes != PackedSumBytes(n, bits)) {
    return PackedError("output buffer has " + std::to_string(out_bytes) + " bytes, " +
                       std::to_string(PackedSumBytes(n, bits)) + " needed");
  }
  // k_i = round(sum_i / t), checked to be close to an integer and in range. The flags are ORed
  // without a branch per element (the check almost never fails); the caller falls back to float32
  // when it does, so a sum that is not one of 2-bit pushes is never rounded. sum_i * (1/t) rather
  // than a division (several times faster; an element it rounds otherwise is half-way between two
  // counts, far outside the tolerance, and fails either way), unless t or 1/t is subnormal or
  // 1/t overflows: then 1/t is not accurate enough and the division stays.
  const float max = static_cast<float>(PackedSumMaxCount(bits));
  const float inv_t = 1.0f / threshold;
  const bool by_inverse = std::isnormal(threshold) && std::isnormal(inv_t);
  uint8_t* data = out + kPackedSumHeaderBytes;
  bool bad = false;
  auto count_of = [&](float s) {
    const float q = by_inverse ? s * inv_t : s / threshold;
    // Adding and subtracting 1.5 * 2^23 rounds |q| < 2^22 to the nearest integer (ties to even,
    // like nearbyint, without a library call: 1.7x faster here); anything larger fails the range
    // check anyway, and NaN or Inf fail both checks.
    constexpr float kRound = 12582912.0f;
    const float k = (q + kRound) - kRound;
    bad |= !(std::fabs(q - k) <= kTolerance) | !(std::fabs(k) <= max);
    // Clamped before the conversion (which is undefined for NaN and out-of-range values); a bad
    // element fails the whole pack below.
    float c = k > max ? max : k;
    c = c < -max ? -max : c;
    return static_cast<int32_t>(c == c ? c : 0.0f);
  };
  if (by_inverse && packed_internal::UseAvx2()) {
    bad = !packed_internal::PackAvx2(sum, n, inv_t, max, bits, data);
  } else if (bits == 8) {
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<uint8_t>(count_of(sum[i]));
  } else {
    for (size_t j = 0; j < n / 2; ++j) {
      const int32_t lo = count_of(sum[2 * j]);
      const int32_t hi = count_of(sum[2 * j + 1]);
      data[j] = static_cast<uint8_t>((lo & 15) | ((hi & 15) << 4));
    }
    if (n % 2 != 0) data[n / 2] = static_cast<uint8_t>(count_of(sum[n - 1]) & 15);
  }
  if (bad) {
    // Find the element to name (rare: a step that was not all 2-bit pushes of this threshold).
    for (size_t i = 0; i < n; ++i) {
      const float q = by_inverse ? sum[i] * inv_t : sum[i] / threshold;
      const float k = std::nearbyint(q);
      if (!(std::fabs(q - k) <= kTolerance) || !(std::fabs(k) <= max)) {  // as count_of, slowly
        return PackedError("element " + std::to_string(i) + " (" + FloatText(sum[i]) +
                           ") is not a multiple k*" + FloatText(threshold) + " with |k| <= " +
                           std::to_string(PackedSumMaxCount(bits)));
      }
    }
  }
  const uint32_t magic = kPackedSumMagic;
  const uint16_t version = kPackedSumVersion;
  const uint8_t bits8 = static_cast<uint8_t>(bits), reserved = 0;
  const uint32_t count = static_cast<uint32_t>(n);
  std::memcpy(out, &magic, 4);
  std::memcpy(out + 4, &version, 2);
  std::memcpy(out + 6, &bits8, 1);
  std::memcpy(out + 7, &reserved, 1);
  std::memcpy(out + 8, &threshold, 4);
  std::memcpy(out + 12, &count, 4);
  return Status::Ok();
}

StatusOr<PackedSumView> ParsePackedSum(const uint8_t* bytes, size_t size, size_t expected_count) {
  if (bytes == nullptr && size != 0) return PackedError("null payload");
  if (size < kPackedSumHeaderBytes) {
    return PackedError("truncated header: " + std::to_string(size) + " bytes, need at least " +
                       std::to_string(kPackedSumHeaderBytes));
  }
  const uint32_t magic = Load<uint32_t>(bytes);
  if (magic != kPackedSumMagic) {
    char buf[80];
    std::snprintf(buf, sizeof(buf), "bad magic 0x%08x, want 0x%08x (\"TRPK\")", magic,
                  kPackedSumMagic);
    return PackedError(buf);
  }
  const uint16_t version = Load<uint16_t>(bytes + 4);
  if (version != kPackedSumVersion) {
    return PackedError("unsupported version " + std::to_string(version) +
                       ", this build reads version " + std::to_string(kPackedSumVersion));
  }
  const int bits = bytes[6];
  if (bits != 4 && bits != 8) {
    return PackedError("unsupported width of " + std::to_string(bits) + " bits, want 4 or 8");
  }
  if (bytes[7] != 0) {
    return PackedError("reserved header field is " + std::to_string(bytes[7]) + ", must be 0");
  }
  const float t = Load<float>(bytes + 8);
  if (!ValidateTwoBitThreshold(t).ok()) {
    return PackedError("threshold must be finite and > 0, got " + FloatText(t));
  }
  const size_t count = Load<uint32_t>(bytes + 12);
  if (count != expected_count) {
    return PackedError("element count " + std::to_string(count) + " does not match the expected " +
                       std::to_string(expected_count));
  }
  const size_t want = PackedSumBytes(count, bits);
  if (size != want) {
    return PackedError(std::string(size < want ? "truncated: " : "oversized: ") +
                       std::to_string(size) + " bytes, " + std::to_string(want) +
                       " expected for " + std::to_string(count) + " elements of " +
                       std::to_string(bits) + " bits");
  }
  const uint8_t* data = bytes + kPackedSumHeaderBytes;
  const size_t data_bytes = want - kPackedSumHeaderBytes;
  // The one value each width never carries: -8 (nibble 0x8) or -128 (0x80). One OR-ed pass,
  // then a second to name the element when something is wrong.
  bool bad = false;
  if (packed_internal::UseAvx2()) {
    bad = packed_internal::HasInvalidCountAvx2(data, data_bytes, bits);
  } else if (bits == 8) {
    for (size_t i = 0; i < data_bytes; ++i) bad |= data[i] == 0x80;
  } else {
    for (size_t i = 0; i < data_bytes; ++i) bad |= ((data[i] & 15) == 8) | ((data[i] >> 4) == 8);
  }
  if (bad) {
    for (size_t i = 0; i < count; ++i) {
      const bool invalid = bits == 8 ? data[i] == 0x80
                                     : (((i % 2 == 0) ? data[i / 2] : data[i / 2] >> 4) & 15) == 8;
      if (invalid) {
        return PackedError("count " + std::to_string(bits == 8 ? -128 : -8) + " at element " +
                           std::to_string(i) + " is out of range (|k| <= " +
                           std::to_string(PackedSumMaxCount(bits)) + ")");
      }
    }
  }
  if (bits == 4 && count % 2 != 0 && (data[count / 2] >> 4) != 0) {
    return PackedError("nonzero padding after element count " + std::to_string(count));
  }
  return PackedSumView{count, bits, t, data};
}

void UnpackParsedSum(const PackedSumView& view, float* out) {
  const size_t count = view.count;
  const float t = view.threshold;
  const uint8_t* data = view.data;
  if (packed_internal::UseAvx2()) {
    packed_internal::UnpackAvx2(data, count, view.bits, t, out);
    return;
  }
  // A table of the decoded values: one float product per possible code, then a lookup per
  // element (the product is the same whether taken here or per element).
  if (view.bits == 8) {
    float table[256];
    for (int c = 0; c < 256; ++c) table[c] = static_cast<float>(static_cast<int8_t>(c)) * t;
    for (size_t i = 0; i < count; ++i) out[i] = table[data[i]];
  } else {
    float table[16];
    for (int c = 0; c < 16; ++c) table[c] = static_cast<float>(Nibble(static_cast<uint8_t>(c))) * t;
    for (size_t j = 0; j < count / 2; ++j) {
      out[2 * j] = table[data[j] & 15];
      out[2 * j + 1] = table[data[j] >> 4];
    }
    if (count % 2 != 0) out[count - 1] = table[data[count / 2] & 15];
  }
}

Status UnpackSum(const uint8_t* bytes, size_t size, size_t expected_count, float* out) {
  TRELLIS_ASSIGN_OR_RETURN(PackedSumView view, ParsePackedSum(bytes, size, expected_count));
  UnpackParsedSum(view, out);
  return Status::Ok();
}

void UnpackSumReference(const uint8_t* bytes, float* out) {
  const int bits = bytes[6];
  const float t = Load<float>(bytes + 8);
  const size_t count = Load<uint32_t>(bytes + 12);
  const uint8_t* data = bytes + kPackedSumHeaderBytes;
  for (size_t i = 0; i < count; ++i) {
    int32_t k;
    if (bits == 8) {
      k = static_cast<int8_t>(data[i]);
    } else {
      k = Nibble(static_cast<uint8_t>(i % 2 == 0 ? data[i / 2] : data[i / 2] >> 4));
    }
    out[i] = static_cast<float>(k) * t;
  }
}

}  // namespace trellis
