#include "pserver/slice_handover.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "datapath/handover.h"

namespace trellis {
namespace {

uint32_t Bit(wire::HandoverPart part) { return 1u << static_cast<uint32_t>(part); }

std::string PartOf(wire::HandoverPart part, const Slice& s) {
  return std::string(wire::HandoverPartName(part)) + " of " + s.name;
}

// What the slice's state block says of it (and so which parts it has).
wire::HandoverState StateOf(const Slice& s) REQUIRES(s.mu) {
  wire::HandoverState state;
  state.complete = s.complete;
  state.step_base = s.weights.step_base;
  state.initialized = s.initialized;
  state.has_m = !s.weights.opt.m.empty();
  state.has_v = !s.weights.opt.v.empty();
  return state;
}

}  // namespace

Status SliceHandover::RefuseWhileMovingIn(const Slice& s) {
  std::string from = s.move.from_server >= 0 ? " from server " + std::to_string(s.move.from_server) : "";
  return FailedPreconditionError(s.name + " is moving here at a server resize" + from +
                                 ": it answers nothing but hand-ins before every part of its state "
                                 "arrived");
}

void SliceHandover::HandOut(int32_t worker, const wire::RequestHeader& h, const wire::Chunks& frame,
                            StoreReply reply) {
  StatusOr<Values> taken = [&]() -> StatusOr<Values> {
    TRELLIS_ASSIGN_OR_RETURN(const wire::HandoverPart part,
                             wire::ParseHandoverPart(frame, wire::kRequestHeaderBytes, h.payload_bytes));
    if (h.payload_bytes != wire::kHandoverPartBytes) {
      return InvalidArgumentError("handout: " + std::to_string(h.payload_bytes) +
                                  " payload bytes, the part alone is 4");
    }
    ReaderMutexLock map_lock(table_->mu());
    Slice* s = table_->FindRetired(h.key, h.slice);
    if (s == nullptr && table_->Find(h.key, h.slice) != nullptr) {
      return FailedPreconditionError(
          "handout: key " + std::to_string(h.key) + " slice " + std::to_string(h.slice) +
          " is held by server " + std::to_string(config_.server_rank) +
          " under the installed shard map (world epoch " + std::to_string(table_->world_epoch()) +
          "): nothing moved it away");
    }
    if (s == nullptr) return table_->Describe404(h.key, h.slice).Annotate("handout");
    MutexLock lock(&s->mu);
    return TakePart(worker, s, part, h.step);
  }();
  // Answered with no lock held, as every store reply.
  if (!taken.ok()) return reply(taken.status(), Answer{});
  reply(Status::Ok(), Answer{std::move(*taken), nullptr});
}

StatusOr<Values> SliceHandover::TakePart(int32_t worker, Slice* s, wire::HandoverPart part,
                                         int64_t step) {
  SliceMove& m = s->move;
  if (m.released) {
    return FailedPreconditionError("handout: " + s->name + " was handed to server " +
                                   std::to_string(m.to_server) +
                                   " and every worker took its state: it is freed here");
  }
  if (step != s->complete || s->pushes != 0 || s->rebuild) {
    return FailedPreconditionError(
        "handout: " + s->name + " completed step " + std::to_string(s->complete) +
        (s->pushes != 0 ? " and counted " + std::to_string(s->pushes) + " pushes of the next" : "") +
        (s->rebuild ? " and is being rebuilt" : "") + "; the handover is of step " +
        std::to_string(step) + " (a resize moves a slice between two steps)");
  }
  const wire::HandoverState state = StateOf(*s);
  auto words = std::make_shared<std::vector<float>>();
  switch (part) {
    case wire::HandoverPart::kState: {
      Values result = wire::HandoverCarriesValues(state) ? s->results.Get(s->complete) : nullptr;
      if (wire::HandoverCarriesValues(state) && !result) {
        return InternalError("handout: " + s->name + " keeps no result of step " +
                             std::to_string(s->complete));
      }
      words->resize(wire::kHandoverStateWords + (result ? result->size() : 0));
      uint8_t block[wire::kHandoverStateBytes];
      wire::EncodeHandoverState(state, block);
      std::memcpy(words->data(), block, sizeof(block));
      if (result) std::copy(result->begin(), result->end(), words->begin() + wire::kHandoverStateWords);
      break;
    }
    case wire::HandoverPart::kOptimizerM:
    case wire::HandoverPart::kOptimizerV: {
      const auto& moment = part == wire::HandoverPart::kOptimizerM ? s->weights.opt.m : s->weights.opt.v;
      if (moment.empty()) {
        return NotFoundError("handout: " + PartOf(part, *s) + ": the optimizer keeps none");
      }
      *words = moment;
      break;
    }
  }
  if (m.handed_out.empty()) m.handed_out.assign(static_cast<size_t>(config_.slots()), 0);
  m.handed_out[worker] |= Bit(part);
  ReleaseIfTaken(s);
  return Values(std::move(words));
}

void SliceHandover::ReleaseIfTaken(Slice* s) {
  SliceMove& m = s->move;
  if (m.released || m.handed_out.empty()) return;
  const uint32_t all = wire::HandoverPartsOf(StateOf(*s));
  for (int32_t slot = 0; slot < config_.slots(); ++slot) {
    if (s->world->Has(slot) && s->gone.count(slot) == 0 && (m.handed_out[slot] & all) != all) return;
  }
  series_->SliceMovedOut();
  m.released = true;
  s->results.Forget();
  s->weights = SliceWeights{};
  s->accum.reset();
}

void SliceHandover::WorkerLost(int32_t slot) {
  ReaderMutexLock map_lock(table_->mu());
  for (Slice* s : table_->Retired()) {
    MutexLock lock(&s->mu);
    if (s->move.released || s->gone.count(slot) != 0) continue;
    s->gone[slot] = s->complete + 1;
    ReleaseIfTaken(s);
  }
}

Status SliceHandover::HandIn(const wire::RequestHeader& h, const wire::Chunks& frame) {
  TRELLIS_ASSIGN_OR_RETURN(const wire::HandoverPart part,
                           wire::ParseHandoverPart(frame, wire::kRequestHeaderBytes, h.payload_bytes));
  ReaderMutexLock map_lock(table_->mu());
  Slice* s = table_->Find(h.key, h.slice);
  if (s == nullptr) return table_->Describe404(h.key, h.slice).Annotate("handin");
  MutexLock lock(&s->mu);
  if (part == wire::HandoverPart::kState) return FillState(s, frame, h.payload_bytes);
  return FillMoment(s, part, frame, h.payload_bytes);
}

Status SliceHandover::FillState(Slice* s, const wire::Chunks& frame, uint64_t bytes) {
  const size_t at = wire::kRequestHeaderBytes + wire::kHandoverPartBytes;
  if (bytes < wire::kHandoverPartBytes + wire::kHandoverStateBytes) {
    return InvalidArgumentError("handin: " + std::to_string(bytes) +
                                " payload bytes, shorter than the part and its state block");
  }
  uint8_t block[wire::kHandoverStateBytes];
  wire::CopyOut(frame, at, sizeof(block), block);
  wire::HandoverState state;
  TRELLIS_RETURN_IF_ERROR(wire::ParseHandoverState(block, &state).Annotate("handin of " + s->name));
  const uint64_t values =
      wire::HandoverCarriesValues(state) ? static_cast<uint64_t>(s->num_elements) * sizeof(float) : 0;
  if (bytes != wire::kHandoverPartBytes + wire::kHandoverStateBytes + values) {
    return InvalidArgumentError("handin: " + s->name + " has " + std::to_string(s->num_elements) +
                                " elements; the state part carries " +
                                std::to_string(bytes - wire::kHandoverPartBytes - wire::kHandoverStateBytes) +
                                " bytes of values");
  }
  SliceMove& m = s->move;
  if ((m.parts_in & Bit(wire::HandoverPart::kState)) != 0) {
    if (state.complete == m.handed_in_at) return Status::Ok();  // another worker moved it first
    return FailedPreconditionError("handin: " + s->name + " was handed in at step " +
                                   std::to_string(m.handed_in_at) + ", not " +
                                   std::to_string(state.complete));
  }
  if (s->complete != 0 || s->initialized || s->pushes != 0 || s->rebuild) {
    return FailedPreconditionError("handin: " + s->name + " already holds step " +
                                   std::to_string(s->complete) +
                                   " here: a handover fills only a slice a resize moved here");
  }
  if (config_.mode != ServerMode::kUpdate && (state.has_m || state.has_v)) {
    return InvalidArgumentError("handin: " + s->name +
                                ": optimizer state handed to an aggregate-mode server");
  }
  s->complete = state.complete;
  s->initialized = state.initialized;
  s->results.Forget();
  s->weights = SliceWeights{};
  s->weights.step_base = state.step_base;
  if (wire::HandoverCarriesValues(state)) {
    auto v = std::make_shared<std::vector<float>>(static_cast<size_t>(s->num_elements));
    wire::CopyFloats(frame, at + wire::kHandoverStateBytes, v->size(), v->data());
    if (config_.mode == ServerMode::kUpdate) s->weights.values = *v;
    s->results.Keep(state.complete, std::move(v), 0);
  }
  m.parts_in |= Bit(wire::HandoverPart::kState);
  m.parts_needed = wire::HandoverPartsOf(state);
  m.handed_in_at = state.complete;
  if (m.parts_in == m.parts_needed) series_->SliceMovedIn();
  return Status::Ok();
}

Status SliceHandover::FillMoment(Slice* s, wire::HandoverPart part, const wire::Chunks& frame,
                                 uint64_t bytes) {
  SliceMove& m = s->move;
  if ((m.parts_in & Bit(wire::HandoverPart::kState)) == 0) {
    return FailedPreconditionError("handin: " + PartOf(part, *s) + " before its state part");
  }
  if ((m.parts_needed & Bit(part)) == 0) {
    return InvalidArgumentError("handin: " + PartOf(part, *s) +
                                ", which its state says the slice does not have");
  }
  const uint64_t want = wire::kHandoverPartBytes + static_cast<uint64_t>(s->num_elements) * sizeof(float);
  if (bytes != want) {
    return InvalidArgumentError("handin: " + PartOf(part, *s) + ": " + std::to_string(bytes) +
                                " payload bytes, " + std::to_string(want) + " expected");
  }
  if ((m.parts_in & Bit(part)) != 0) return Status::Ok();  // another worker moved it first
  auto& moment = part == wire::HandoverPart::kOptimizerM ? s->weights.opt.m : s->weights.opt.v;
  moment.resize(static_cast<size_t>(s->num_elements));
  wire::CopyFloats(frame, wire::kRequestHeaderBytes + wire::kHandoverPartBytes, moment.size(),
                   moment.data());
  m.parts_in |= Bit(part);
  if (m.parts_in == m.parts_needed) series_->SliceMovedIn();
  return Status::Ok();
}

}  // namespace trellis
