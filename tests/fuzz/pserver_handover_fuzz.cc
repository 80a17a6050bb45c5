// libFuzzer target: the parameter server's side of a server resize (SliceStore::Handle with
// kHandIn, pserver/slice_handover.h), fed arbitrary hand-ins of a slice the resize's map moved
// to this server, split into arbitrary chunks. It must never crash or read out of bounds; it must
// answer exactly once, OK or INVALID_ARGUMENT / FAILED_PRECONDITION; a refused state part leaves
// the slice taking no data request and still able to take a good hand-in; an accepted one whose
// state needs no other part makes the slice answer a pull of the handed step with the values
// handed in.
//
// Input: byte 0 picks the slice size (1..64 elements), byte 1 the part (mod 3), byte 2 the chunk
// size of the split (0: one chunk); byte 3 != 0 builds a valid aggregate-mode state part from
// the rest (values from its bytes, the step from byte 3), sometimes with one byte flipped; the
// rest is the payload after the part.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "datapath/frame.h"
#include "datapath/handover.h"
#include "pserver/slice_store.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/store_request.h"

namespace {

using trellis_fuzz::Check;
using trellis_fuzz::Outcome;
using trellis_fuzz::Run;

using trellis::StatusCode;
namespace wire = trellis::wire;

// Server 0 of 2, with key 7's one slice moved here from server 1 (waiting for its hand-in).
std::unique_ptr<trellis::SliceStore> MakeStore(int64_t n) {
  auto store = std::make_unique<trellis::SliceStore>(trellis::StoreConfig{});
  int64_t slices = 0, bytes = 0;
  Check(store->Install(trellis_fuzz::OneSliceMap(n, 2, 1, 0), &slices, &bytes).ok() && slices == 0);
  Check(store->Install(trellis_fuzz::OneSliceMap(n, 2, 0, 1), &slices, &bytes).ok() && slices == 1);
  return store;
}

std::vector<uint8_t> StatePart(int64_t n, int64_t step, const std::vector<float>& values) {
  std::vector<uint8_t> p = wire::EncodeHandoverPart(wire::HandoverPart::kState);
  wire::HandoverState s;
  s.complete = step;
  s.initialized = true;
  uint8_t block[wire::kHandoverStateBytes];
  wire::EncodeHandoverState(s, block);
  p.insert(p.end(), block, block + sizeof(block));
  const auto* v = reinterpret_cast<const uint8_t*>(values.data());
  p.insert(p.end(), v, v + n * sizeof(float));
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const int64_t n = 1 + data[0] % 64;
  const uint32_t part = data[1] % 3;
  const size_t chunk = data[2] % 8 == 0 ? 0 : data[2] % 37;
  std::vector<uint8_t> rest(data + 4, data + size);
  std::vector<uint8_t> payload = wire::EncodeHandoverPart(static_cast<wire::HandoverPart>(part));
  payload.insert(payload.end(), rest.begin(), rest.end());
  std::vector<float> values(n);
  const int64_t step = data[3];
  bool built = false;
  if (data[3] != 0) {
    for (int64_t i = 0; i < n; ++i) {
      values[i] = i < static_cast<int64_t>(rest.size()) ? (static_cast<int>(rest[i]) - 128) / 16.0f : 0.5f;
    }
    payload = StatePart(n, step, values);
    built = true;
    if (data[3] % 4 == 0 && !rest.empty()) payload[rest[0] % payload.size()] ^= rest.back() | 1;
  }
  auto store = MakeStore(n);
  Outcome o = Run(*store, wire::Op::kHandIn, 0, payload, chunk);
  Check(o.calls == 1);
  Check(o.status.ok() || o.status.code() == StatusCode::kInvalidArgument ||
        o.status.code() == StatusCode::kFailedPrecondition);
  if (!o.status.ok()) {
    Outcome pull = Run(*store, wire::Op::kPull, 0, {}, 0);
    Check(pull.calls == 1);
    // Refused: the slice still waits for its state, and takes a good hand-in.
    Check(pull.status.code() == StatusCode::kFailedPrecondition);
    std::vector<float> good(n, 0.25f);
    Outcome g = Run(*store, wire::Op::kHandIn, 0, StatePart(n, 3, good), 0);
    Check(g.calls == 1 && g.status.ok());
    Outcome after = Run(*store, wire::Op::kPull, 3, {}, 0);
    Check(after.calls == 1 && after.status.ok() && after.values == good);
    return 0;
  }
  if (built && payload == StatePart(n, step, values)) {
    Outcome pull = Run(*store, wire::Op::kPull, step, {}, 0);
    Check(pull.calls == 1 && pull.status.ok());
    Check(pull.values.size() == static_cast<size_t>(n));
    Check(std::memcmp(pull.values.data(), values.data(), n * sizeof(float)) == 0);
  }
  return 0;
}
