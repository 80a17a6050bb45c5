// The worker's check of a packed pull answer (docs/compression.md, "Packed pull answers"),
// apart from the dispatch code so that its verdicts can be tested without a misbehaving server.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/status.h"
#include "datapath/codec/packed_sum.h"
#include "worker-lib/src/transport.h"

namespace trellis {

// A packed answer (Payload::packed) checked completely before anything is written: the request
// accepted one (`accepted`), its count is the slice's (`want_bytes` of float32), and the format
// holds (ParsePackedSum). The view points into the payload or *scratch. Errors are
// INVALID_ARGUMENT naming the problem; the worker fails the operation with DATA_LOSS.
StatusOr<PackedSumView> ParsePackedAnswer(const Payload& p, bool accepted, int64_t want_bytes,
                                          std::vector<uint8_t>* scratch);

}  // namespace trellis
