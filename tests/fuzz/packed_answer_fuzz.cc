// libFuzzer target: the worker's decoder of packed pull answers (ParsePackedSum / UnpackSum in
// datapath/codec/packed_sum.h) fed arbitrary bytes, as a worker is by the network. It must
// never crash or read out of bounds, must leave the output untouched when it rejects, and what
// it accepts must decode to k*t with |k| within the width's range, agree with the reference
// decoder bit for bit, and pack back to the same bytes.
//
// The first input byte picks how the rest is used: 0 = raw answer bytes (the expected count
// taken from the bytes' count field, so the body checks are reached); otherwise an answer is
// built from fields of the input (bits, count, threshold, body length), valid more often than not.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "datapath/codec/packed_sum.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using trellis_fuzz::Check;
using trellis_fuzz::Reader;

std::vector<uint8_t> BuildAnswer(Reader& in) {
  const uint8_t flags = in.U8();
  const uint8_t bits = (flags & 1) ? 8 : 4;
  const uint32_t count = in.U32() % 2048;
  float threshold = 0.5f;
  if (flags & 2) {
    const uint32_t raw = in.U32();
    std::memcpy(&threshold, &raw, 4);
  }
  size_t body = trellis::PackedSumBytes(count, bits) - trellis::kPackedSumHeaderBytes;
  if (flags & 4) body = in.U8() % (body + 8);  // wrong length (sometimes right)
  std::vector<uint8_t> answer(trellis::kPackedSumHeaderBytes + body, 0);
  const uint32_t magic = (flags & 8) ? in.U32() : trellis::kPackedSumMagic;
  const uint16_t version =
      (flags & 16) ? static_cast<uint16_t>(in.U32()) : trellis::kPackedSumVersion;
  const uint8_t width = (flags & 32) ? in.U8() : bits;
  const uint8_t reserved = (flags & 64) ? in.U8() : 0;
  std::memcpy(answer.data(), &magic, 4);
  std::memcpy(answer.data() + 4, &version, 2);
  answer[6] = width;
  answer[7] = reserved;
  std::memcpy(answer.data() + 8, &threshold, 4);
  std::memcpy(answer.data() + 12, &count, 4);
  const size_t copy = in.size < body ? in.size : body;
  if (copy > 0) std::memcpy(answer.data() + trellis::kPackedSumHeaderBytes, in.data, copy);
  return answer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Reader in{data + 1, size - 1};
  std::vector<uint8_t> answer;
  if (data[0] == 0) {
    answer.assign(in.data, in.data + in.size);  // an exact-size copy: ASan sees any overread
  } else {
    answer = BuildAnswer(in);
  }
  uint32_t count = 0;
  if (answer.size() >= 16) std::memcpy(&count, answer.data() + 12, 4);
  const size_t n = count % 4096;  // the slice the worker expects (usually the announced count)
  std::vector<float> out(n, 3.0f);
  auto view = trellis::ParsePackedSum(answer.data(), answer.size(), n);
  const trellis::Status st = trellis::UnpackSum(answer.data(), answer.size(), n, out.data());
  Check(st.ok() == view.ok());
  if (!st.ok()) {
    Check(st.code() == trellis::StatusCode::kInvalidArgument && !st.message().empty());
    for (float v : out) Check(v == 3.0f);
    return 0;
  }
  Check(view->count == n && answer.size() == trellis::PackedSumBytes(n, view->bits));
  const float t = view->threshold;
  Check(std::isfinite(t) && t > 0);
  std::vector<float> ref(n, 5.0f);
  trellis::UnpackSumReference(answer.data(), ref.data());
  Check(n == 0 || std::memcmp(ref.data(), out.data(), n * sizeof(float)) == 0);
  bool finite = true;
  for (float v : out) {
    const float k = v / t;
    Check(std::isinf(v) || std::fabs(k - std::nearbyint(k)) <= 1.0f / 64);
    const int32_t max = trellis::PackedSumMaxCount(view->bits);
    Check(std::isinf(v) || std::fabs(std::nearbyint(k)) <= static_cast<float>(max));
    finite = finite && std::isfinite(v);
  }
  // Decoded values pack back to the same bytes (unless k*t overflowed a huge threshold).
  if (finite) {
    std::vector<uint8_t> again(answer.size());
    Check(trellis::PackSum(out.data(), n, t, view->bits, again.data(), again.size()).ok());
    Check(again == answer);
  }
  return 0;
}
