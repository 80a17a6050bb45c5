#include "datapath/codec/half.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <string>

namespace trellis {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t u) { return std::bit_cast<float>(u); }

void StoreLE16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
void StoreLE32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t LoadLE16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t LoadLE32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// IEEE binary16 from float32, round to nearest even, with float arithmetic doing the rounding
// (M. Dukhan's FP16 library, fp16_ieee_from_fp32_value; needs the default rounding mode).
uint16_t Float16FromFloat(float f) {
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = Bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = FromBits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = Bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

float FloatFromFloat16(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = FromBits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = FromBits((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t result = sign | (two_w < (1u << 27) ? Bits(denormalized) : Bits(normalized));
  return FromBits(result);
}

uint16_t BFloat16FromFloat(float f) {
  const uint32_t u = Bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace

const char* HalfTypeName(HalfType t) {
  return t == HalfType::kBFloat16 ? "bfloat16" : "float16";
}

uint16_t FloatToHalf(HalfType t, float v) {
  return t == HalfType::kBFloat16 ? BFloat16FromFloat(v) : Float16FromFloat(v);
}

float HalfToFloat(HalfType t, uint16_t h) {
  return t == HalfType::kBFloat16 ? FromBits(static_cast<uint32_t>(h) << 16) : FloatFromFloat16(h);
}

Status HalfEncode(HalfType t, const float* grad, size_t n, std::vector<uint8_t>* out) {
  if (n == 0 || n > UINT32_MAX) {
    return InvalidArgumentError("16-bit encode: " + std::to_string(n) +
                                " elements (want 1 to 4294967295)");
  }
  out->resize(HalfEncodedBytes(n));
  uint8_t* p = out->data();
  StoreLE32(p, kHalfMagic);
  StoreLE16(p + 4, kHalfVersion);
  p[6] = static_cast<uint8_t>(t);
  p[7] = 0;
  StoreLE32(p + 8, static_cast<uint32_t>(n));
  StoreLE32(p + 12, 0);
  uint8_t* v = p + kHalfHeaderBytes;
  if (t == HalfType::kBFloat16) {
    for (size_t i = 0; i < n; ++i) StoreLE16(v + 2 * i, BFloat16FromFloat(grad[i]));
  } else {
    for (size_t i = 0; i < n; ++i) StoreLE16(v + 2 * i, Float16FromFloat(grad[i]));
  }
  return Status::Ok();
}

StatusOr<HalfFrame> HalfParse(const uint8_t* payload, size_t bytes, size_t expected_count) {
  auto bad = [](const std::string& what) { return InvalidArgumentError("16-bit frame: " + what); };
  if (bytes < kHalfHeaderBytes) {
    return bad(std::to_string(bytes) + " bytes, shorter than the 16-byte header");
  }
  if (LoadLE32(payload) != kHalfMagic) return bad("bad magic");
  if (const uint16_t v = LoadLE16(payload + 4); v != kHalfVersion) {
    return bad("version " + std::to_string(v) + ", this build reads version 1");
  }
  const uint8_t type = payload[6];
  if (type != static_cast<uint8_t>(HalfType::kFloat16) &&
      type != static_cast<uint8_t>(HalfType::kBFloat16)) {
    return bad("unknown type " + std::to_string(type) + " (1 float16, 2 bfloat16)");
  }
  if (payload[7] != 0 || LoadLE32(payload + 12) != 0) return bad("reserved bytes not zero");
  const size_t count = LoadLE32(payload + 8);
  if (count != expected_count) {
    return bad("element count " + std::to_string(count) + " does not match the expected " +
               std::to_string(expected_count));
  }
  if (bytes != HalfEncodedBytes(count)) {
    return bad(std::to_string(bytes) + " bytes, " + std::to_string(count) + " elements need " +
               std::to_string(HalfEncodedBytes(count)));
  }
  return HalfFrame{static_cast<HalfType>(type), count, payload + kHalfHeaderBytes};
}

void HalfDecodeFrame(const HalfFrame& f, float* out) {
  for (size_t i = 0; i < f.count; ++i) out[i] = HalfToFloat(f.type, LoadLE16(f.values + 2 * i));
}

void HalfDecodeAddFrame(const HalfFrame& f, float* acc) {
  for (size_t i = 0; i < f.count; ++i) acc[i] += HalfToFloat(f.type, LoadLE16(f.values + 2 * i));
}

}  // namespace trellis
