// Dispatch, frame encoding and the validating decoder. Everything read from a frame is checked
// against `bytes` before use: frames arrive from the network.
#include "datapath/codec/twobit.h"

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/config/env_names.h"
#include "datapath/codec/twobit_kernels.h"

namespace trellis {
namespace twobit_internal {

bool ChooseScalar(const char* force_scalar_env, bool have_avx2) {
  const bool forced = force_scalar_env != nullptr && std::strcmp(force_scalar_env, "1") == 0;
  return forced || !have_avx2;
}

const Kernels& ActiveKernels() {
  // Chosen once: the environment is read at first use only (documented in twobit.h).
  static const Kernels& active = [] () -> const Kernels& {
    const Kernels* avx2 = Avx2Kernels();
    if (ChooseScalar(std::getenv(kEnvCodecForceScalar), avx2 != nullptr)) return ScalarKernels();
    return *avx2;
  }();
  return active;
}

}  // namespace twobit_internal

namespace {

using twobit_internal::ActiveKernels;
using twobit_internal::LoadWord;
using twobit_internal::StoreWord;

std::string FloatText(float v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
  return buf;
}

Status FrameError(const std::string& what) { return InvalidArgumentError("2bit frame: " + what); }

// Low bit set, high bit clear: the one code the format never produces.
inline uint32_t Code01Bits(uint32_t word) { return word & ~(word >> 1) & 0x55555555u; }

// OK when all TwoBitWords(n) words are well formed: no 01 code among the first n elements and
// only 00 codes after them. Frames are almost always good, so the fast pass only ORs the
// per-word checks together (no branch per word); a second pass finds the element to report.
Status CheckWords(const uint8_t* words, size_t n) {
  const size_t full = n / kTwoBitElementsPerWord;
  uint32_t any_bad = 0;
  for (size_t w = 0; w < full; ++w) any_bad |= Code01Bits(LoadWord(words + 4 * w));
  if (any_bad != 0) {
    for (size_t w = 0;; ++w) {
      const uint32_t bad = Code01Bits(LoadWord(words + 4 * w));
      if (bad != 0) {
        const size_t element = w * kTwoBitElementsPerWord + (std::countl_zero(bad) - 1) / 2;
        return FrameError("invalid code 01 at element " + std::to_string(element));
      }
    }
  }
  const size_t in_last = n - full * kTwoBitElementsPerWord;
  if (in_last == 0) return Status::Ok();
  const uint32_t last = LoadWord(words + 4 * full);
  const uint32_t padding_mask = (1u << (32 - 2 * in_last)) - 1;  // codes of elements >= n
  const uint32_t bad = Code01Bits(last) & ~padding_mask;
  if (bad != 0) {
    const size_t element = full * kTwoBitElementsPerWord + (std::countl_zero(bad) - 1) / 2;
    return FrameError("invalid code 01 at element " + std::to_string(element));
  }
  if ((last & padding_mask) != 0) {
    return FrameError("nonzero padding after element count " + std::to_string(n) + " in last word");
  }
  return Status::Ok();
}

}  // namespace

Status ValidateTwoBitThreshold(float threshold) {
  if (!std::isfinite(threshold) || !(threshold > 0.0f)) {
    return InvalidArgumentError("2bit threshold must be finite and > 0, got " + FloatText(threshold));
  }
  return Status::Ok();
}

std::string_view TwoBitActivePath() { return ActiveKernels().name; }

void TwoBitQuantize(const float* grad, float* residual, size_t n, float threshold, uint32_t* words) {
  ActiveKernels().quantize(grad, residual, n, threshold, reinterpret_cast<uint8_t*>(words));
}

Status TwoBitValidateWords(const uint32_t* words, size_t n) {
  return CheckWords(reinterpret_cast<const uint8_t*>(words), n);
}

void TwoBitDequantizeWords(const uint32_t* words, size_t n, float threshold, float* out) {
  ActiveKernels().dequantize(reinterpret_cast<const uint8_t*>(words), n, threshold, out);
}

void TwoBitDequantizeAddWords(const uint32_t* words, size_t n, float threshold, float* acc) {
  ActiveKernels().dequantize_add(reinterpret_cast<const uint8_t*>(words), n, threshold, acc);
}

Status TwoBitEncode(const float* grad, float* residual, size_t n, float threshold, uint8_t* payload,
                    size_t payload_bytes) {
  TRELLIS_RETURN_IF_ERROR(ValidateTwoBitThreshold(threshold));
  if (n > kTwoBitMaxElements) {
    return InvalidArgumentError("2bit encode: " + std::to_string(n) + " elements exceed the frame limit of " +
                                std::to_string(kTwoBitMaxElements));
  }
  if (payload_bytes < TwoBitEncodedBytes(n)) {
    return InvalidArgumentError("2bit encode: payload buffer has " + std::to_string(payload_bytes) +
                                " bytes, " + std::to_string(TwoBitEncodedBytes(n)) + " needed for " +
                                std::to_string(n) + " elements");
  }
  StoreWord(payload, kTwoBitMagic);
  const uint16_t version = kTwoBitVersion;
  const uint16_t reserved = 0;
  std::memcpy(payload + 4, &version, 2);
  std::memcpy(payload + 6, &reserved, 2);
  std::memcpy(payload + 8, &threshold, 4);
  StoreWord(payload + 12, static_cast<uint32_t>(n));
  ActiveKernels().quantize(grad, residual, n, threshold, payload + kTwoBitHeaderBytes);
  return Status::Ok();
}

namespace {

// Validates in the order a reader wants the message: header, expected count, length, codes.
StatusOr<TwoBitFrame> Parse(const uint8_t* payload, size_t bytes, const size_t* expected_count) {
  if (payload == nullptr && bytes != 0) return FrameError("null payload");
  if (bytes < kTwoBitHeaderBytes) {
    return FrameError("truncated header: " + std::to_string(bytes) + " bytes, need at least " +
                      std::to_string(kTwoBitHeaderBytes));
  }
  const uint32_t magic = LoadWord(payload);
  if (magic != kTwoBitMagic) {
    char buf[80];
    std::snprintf(buf, sizeof(buf), "bad magic 0x%08x, want 0x%08x (\"TR2B\")", magic, kTwoBitMagic);
    return FrameError(buf);
  }
  uint16_t version = 0, reserved = 0;
  std::memcpy(&version, payload + 4, 2);
  std::memcpy(&reserved, payload + 6, 2);
  if (version != kTwoBitVersion) {
    return FrameError("unsupported version " + std::to_string(version) + ", this build reads version " +
                      std::to_string(kTwoBitVersion));
  }
  if (reserved != 0) return FrameError("reserved header field is " + std::to_string(reserved) + ", must be 0");
  float threshold = 0;
  std::memcpy(&threshold, payload + 8, 4);
  if (!ValidateTwoBitThreshold(threshold).ok()) {
    return FrameError("threshold must be finite and > 0, got " + FloatText(threshold));
  }
  const size_t count = LoadWord(payload + 12);
  if (expected_count != nullptr && count != *expected_count) {
    return FrameError("element count " + std::to_string(count) + " does not match the expected " +
                      std::to_string(*expected_count));
  }
  const size_t want = TwoBitEncodedBytes(count);
  if (bytes != want) {
    return FrameError(std::string(bytes < want ? "truncated: " : "oversized: ") + std::to_string(bytes) +
                      " bytes, " + std::to_string(want) + " expected for " + std::to_string(count) +
                      " elements");
  }
  TRELLIS_RETURN_IF_ERROR(CheckWords(payload + kTwoBitHeaderBytes, count));
  return TwoBitFrame{count, threshold, payload + kTwoBitHeaderBytes};
}

}  // namespace

StatusOr<TwoBitFrame> TwoBitParse(const uint8_t* payload, size_t bytes) { return Parse(payload, bytes, nullptr); }

StatusOr<TwoBitFrame> TwoBitParse(const uint8_t* payload, size_t bytes, size_t expected_count) {
  return Parse(payload, bytes, &expected_count);
}

Status TwoBitDequantize(const uint8_t* payload, size_t bytes, float* out, size_t n) {
  TRELLIS_ASSIGN_OR_RETURN(TwoBitFrame frame, TwoBitParse(payload, bytes, n));
  ActiveKernels().dequantize(frame.words, frame.count, frame.threshold, out);
  return Status::Ok();
}

void TwoBitDequantizeFrame(const TwoBitFrame& frame, float* out) {
  ActiveKernels().dequantize(frame.words, frame.count, frame.threshold, out);
}

void TwoBitDequantizeAddFrame(const TwoBitFrame& frame, float* acc) {
  ActiveKernels().dequantize_add(frame.words, frame.count, frame.threshold, acc);
}

Status TwoBitDequantizeAdd(const uint8_t* payload, size_t bytes, float* acc, size_t n) {
  TRELLIS_ASSIGN_OR_RETURN(TwoBitFrame frame, TwoBitParse(payload, bytes, n));
  ActiveKernels().dequantize_add(frame.words, frame.count, frame.threshold, acc);
  return Status::Ok();
}

}  // namespace trellis
