// libFuzzer target: the parameter server's handling of compressed pushes (SliceStore::Handle
// with kPushTwoBit / kPushPullTwoBit / kPushPullTwoBitPacked), as both front-ends call it, fed
// arbitrary payloads split into arbitrary chunks. It must never crash or read out of bounds; it
// must answer exactly once; it must accept a payload exactly when the codec's validator accepts
// it for the slice's size (and then return the decoded values, W = 1, and for the packed op a
// packed answer that decodes to the same bits), and reject everything else with
// INVALID_ARGUMENT, leaving the slice able to take the next good push.
//
// Input: byte 0 picks the slice size (1..64 elements), byte 1 the op, byte 2 the chunk size of
// the split (0: one chunk); byte 3 != 0 replaces the rest by a valid frame built from the input
// (so the accept path is reached too); the rest is the payload.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "pserver/slice_store.h"
#include "datapath/frame.h"
#include "datapath/codec/packed_sum.h"
#include "datapath/codec/twobit.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/store_request.h"

namespace {

using trellis_fuzz::Check;
using trellis_fuzz::Outcome;
using trellis_fuzz::Run;

using trellis::StatusCode;
namespace wire = trellis::wire;

std::unique_ptr<trellis::SliceStore> MakeStore(int64_t n) {
  auto store = std::make_unique<trellis::SliceStore>(trellis::StoreConfig{});
  int64_t slices = 0, bytes = 0;
  Check(store->Install(trellis_fuzz::OneSliceMap(n), &slices, &bytes).ok());
  return store;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const int64_t n = 1 + data[0] % 64;
  const wire::Op ops[] = {wire::Op::kPushTwoBit, wire::Op::kPushPullTwoBit,
                          wire::Op::kPushPullTwoBitPacked};
  const wire::Op op = ops[data[1] % 3];
  const size_t chunk = data[2] % 8 == 0 ? 0 : data[2] % 37;
  std::vector<uint8_t> payload(data + 4, data + size);
  if (data[3] != 0) {
    // A valid frame whose gradient comes from the input bytes.
    std::vector<float> g(n), residual(n, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      const bool have = i < static_cast<int64_t>(payload.size());
      g[i] = have ? (static_cast<int>(payload[i]) - 128) / 64.0f : 0.0f;
    }
    const float t = 0.25f + static_cast<float>(data[3] % 16) / 8.0f;
    std::vector<uint8_t> frame(trellis::TwoBitEncodedBytes(n));
    Check(trellis::TwoBitEncode(g.data(), residual.data(), n, t, frame.data(), frame.size()).ok());
    // A few single-byte edits keep some frames almost valid.
    if (data[3] % 4 == 0 && !payload.empty()) {
      frame[payload[0] % frame.size()] ^= payload.back() | 1;
    }
    payload = std::move(frame);
  }
  auto store = MakeStore(n);
  auto verdict = trellis::TwoBitParse(payload.data(), payload.size(), static_cast<size_t>(n));
  Outcome o = Run(*store, op, 1, payload, chunk);
  Check(o.calls == 1);
  if (!verdict.ok()) {
    Check(o.status.code() == StatusCode::kInvalidArgument);
    // Rejected: the step is still open for a good push.
    std::vector<float> zero(n, 0.0f), residual(n, 0.0f);
    std::vector<uint8_t> good(trellis::TwoBitEncodedBytes(n));
    Check(trellis::TwoBitEncode(zero.data(), residual.data(), n, 1.0f, good.data(), good.size())
              .ok());
    Outcome g = Run(*store, wire::Op::kPushPullTwoBit, 1, good, 0);
    Check(g.calls == 1 && g.status.ok() && g.values == zero);
    return 0;
  }
  Check(o.status.ok());
  if (op != wire::Op::kPushTwoBit) {
    std::vector<float> want(n);
    Check(trellis::TwoBitDequantize(payload.data(), payload.size(), want.data(), n).ok());
    Check(o.values.size() == static_cast<size_t>(n));
    Check(std::memcmp(o.values.data(), want.data(), n * sizeof(float)) == 0);
    // The packed op's answer is packed (the step is one 2-bit push) and decodes to the same bits.
    Check(o.packed.empty() == (op == wire::Op::kPushPullTwoBit));
    if (!o.packed.empty()) {
      std::vector<float> decoded(n);
      Check(trellis::UnpackSum(o.packed.data(), o.packed.size(), n, decoded.data()).ok());
      Check(std::memcmp(decoded.data(), want.data(), n * sizeof(float)) == 0);
    }
  }
  return 0;
}
