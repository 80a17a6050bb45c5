#include "worker-lib/src/server_resize.h"

#include "common/base/logging.h"
#include "datapath/handover.h"

namespace trellis {
namespace {

// One handover request as a whole frame (datapath/frame.h).
std::string HandoverFrame(wire::Op op, uint64_t key, uint32_t slice, int64_t step,
                          const std::string& payload) {
  wire::RequestHeader h;
  h.op = op;
  h.request_id = 1;
  h.key = key;
  h.slice = slice;
  h.step = step;
  h.payload_bytes = payload.size();
  std::string frame(wire::kRequestHeaderBytes, '\0');
  wire::EncodeRequestHeader(h, reinterpret_cast<uint8_t*>(frame.data()));
  return frame + payload;
}

std::string PartBytes(wire::HandoverPart part) {
  const std::vector<uint8_t> b = wire::EncodeHandoverPart(part);
  return std::string(b.begin(), b.end());
}

// Every part of slice `slice` of `k`, from server `from` to server `to`.
Status MoveSlice(ServerSet* servers, const KeyState& k, uint32_t slice, int32_t from, int32_t to,
                 int64_t timeout_ms) {
  const int64_t step = k.push_step.load();  // every slice of the key completed it
  wire::HandoverState state;
  for (const auto part : {wire::HandoverPart::kState, wire::HandoverPart::kOptimizerM,
                          wire::HandoverPart::kOptimizerV}) {
    // The state part comes first and says which others exist.
    if ((wire::HandoverPartsOf(state) & (1u << static_cast<uint32_t>(part))) == 0) continue;
    const std::string what = std::string(wire::HandoverPartName(part)) + " of " + KeyName(k.decl) +
                             " slice " + std::to_string(slice) + " from server " +
                             std::to_string(from) + " to server " + std::to_string(to);
    auto taken = servers->connection(from).HandOver(
        HandoverFrame(wire::Op::kHandOut, k.decl.id, slice, step, PartBytes(part)), timeout_ms);
    if (!taken.ok()) return taken.status().Annotate("moving the " + what);
    if (part == wire::HandoverPart::kState) {
      if (taken->size() < wire::kHandoverStateBytes) {
        return InternalError("moving the " + what + ": the answer has " +
                             std::to_string(taken->size()) + " bytes, no state block");
      }
      TRELLIS_RETURN_IF_ERROR(
          wire::ParseHandoverState(reinterpret_cast<const uint8_t*>(taken->data()), &state)
              .Annotate("moving the " + what));
    }
    auto given = servers->connection(to).HandOver(
        HandoverFrame(wire::Op::kHandIn, k.decl.id, slice, step, PartBytes(part) + *taken),
        timeout_ms);
    if (!given.ok()) return given.status().Annotate("moving the " + what);
  }
  return Status::Ok();
}

}  // namespace

Status ResizeServers(KeyTable* keys, ServerSet* servers, const v1::ShardMap& map,
                     const std::vector<std::string>& addresses, int64_t timeout_ms) {
  if (map.num_servers() != static_cast<int32_t>(addresses.size())) {
    return InvalidArgumentError("server resize: a shard map for " + std::to_string(map.num_servers()) +
                                " servers with " + std::to_string(addresses.size()) + " addresses");
  }
  const int32_t was = servers->size();
  TRELLIS_RETURN_IF_ERROR(servers->Expand(map, addresses));
  // The keys point at their new servers from here on; no operation runs before the moves end.
  TRELLIS_ASSIGN_OR_RETURN(const std::vector<KeyTable::SliceMoveOf> moves, keys->Relayout(map));
  for (const auto& m : moves) {
    TRELLIS_RETURN_IF_ERROR(MoveSlice(servers, *m.key, m.slice, m.from, m.to, timeout_ms));
  }
  servers->SwitchTo(map.num_servers());
  TLOG_INFO << "servers " << was << " -> " << map.num_servers() << ": " << moves.size()
            << " slices moved to their new servers";
  return Status::Ok();
}

}  // namespace trellis
