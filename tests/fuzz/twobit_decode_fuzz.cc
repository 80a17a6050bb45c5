// libFuzzer target: the 2-bit frame decoder fed arbitrary bytes, as the parameter server is by
// the network. It must never crash, read out of bounds or accept a frame it cannot decode; what
// it accepts must decode to {0, +t, -t} on every CPU path and re-encode to the same bytes.
//
// The first input byte picks how the rest is used, so the fuzzer also reaches the code scan
// without first guessing a magic number: 0 = raw frame bytes; otherwise a frame is built from
// fields taken from the input (count, threshold, body length), with a valid header more often
// than not.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "datapath/codec/twobit.h"
#include "datapath/codec/twobit_kernels.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using trellis_fuzz::Check;
using trellis_fuzz::Reader;

using trellis::TwoBitFrame;
namespace internal = trellis::twobit_internal;

std::vector<uint8_t> BuildFrame(Reader& in) {
  const uint8_t flags = in.U8();
  const uint32_t count = in.U32() % 4096;
  float threshold = 0.5f;
  if (flags & 1) {
    const uint32_t bits = in.U32();
    std::memcpy(&threshold, &bits, 4);
  }
  size_t body = 4 * trellis::TwoBitWords(count);
  if (flags & 2) body = in.U8() % (body + 8);  // wrong length (sometimes right)
  std::vector<uint8_t> frame(trellis::kTwoBitHeaderBytes + body, 0);
  const uint32_t magic = (flags & 4) ? in.U32() : trellis::kTwoBitMagic;
  const uint16_t version = (flags & 8) ? static_cast<uint16_t>(in.U32()) : trellis::kTwoBitVersion;
  const uint16_t reserved = (flags & 16) ? static_cast<uint16_t>(in.U32()) : 0;
  std::memcpy(frame.data(), &magic, 4);
  std::memcpy(frame.data() + 4, &version, 2);
  std::memcpy(frame.data() + 6, &reserved, 2);
  std::memcpy(frame.data() + 8, &threshold, 4);
  std::memcpy(frame.data() + 12, &count, 4);
  const size_t copy = in.size < body ? in.size : body;
  std::memcpy(frame.data() + trellis::kTwoBitHeaderBytes, in.data, copy);
  return frame;
}

void CheckAccepted(const TwoBitFrame& frame, const uint8_t* payload, size_t bytes) {
  const size_t n = frame.count;
  const float t = frame.threshold;
  Check(std::isfinite(t) && t > 0);
  Check(bytes == trellis::TwoBitEncodedBytes(n));
  std::vector<float> out(n, 1.0f);
  Check(trellis::TwoBitDequantize(payload, bytes, out.data(), n).ok());
  for (float v : out) Check(v == 0.0f || v == t || v == -t);
  // Every CPU path decodes the same.
  std::vector<const internal::Kernels*> paths{&internal::ScalarKernels()};
  if (const auto* avx2 = internal::Avx2Kernels()) paths.push_back(avx2);
  for (const auto* k : paths) {
    std::vector<float> mine(n, 5.0f), sum(n, 0.0f);
    k->dequantize(frame.words, n, t, mine.data());
    k->dequantize_add(frame.words, n, t, sum.data());
    Check(mine == out);  // operator== on vectors: no memcmp on the null data() of empty ones
    Check(sum == out);
  }
  // Decoded values re-encode (from a zero residual) to the same frame, leaving nothing behind.
  std::vector<float> residual(n, 0.0f);
  std::vector<uint8_t> again(bytes);
  Check(trellis::TwoBitEncode(out.data(), residual.data(), n, t, again.data(), again.size()).ok());
  Check(std::memcmp(again.data(), payload, bytes) == 0);
  for (float r : residual) Check(r == 0.0f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Reader in{data + 1, size - 1};
  std::vector<uint8_t> frame;
  if (data[0] == 0) {
    frame.assign(in.data, in.data + in.size);  // an exact-size copy: ASan sees any overread
  } else {
    frame = BuildFrame(in);
  }
  auto parsed = trellis::TwoBitParse(frame.data(), frame.size());
  if (parsed.ok()) {
    CheckAccepted(*parsed, frame.data(), frame.size());
    Check(trellis::TwoBitParse(frame.data(), frame.size(), parsed->count).ok());
    Check(!trellis::TwoBitParse(frame.data(), frame.size(), parsed->count + 1).ok());
  } else {
    // A rejected frame leaves the output untouched, whatever count the caller expects.
    std::vector<float> out(16, 3.0f);
    const size_t n = frame.size() >= 16 ? (frame[12] | frame[13] << 8) % 17 : 16;
    Check(!trellis::TwoBitDequantizeAdd(frame.data(), frame.size(), out.data(), n).ok());
    for (float v : out) Check(v == 3.0f);
    Check(!parsed.status().message().empty());
  }
  return 0;
}
