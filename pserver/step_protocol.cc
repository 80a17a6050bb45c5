#include "pserver/step_protocol.h"

#include <algorithm>
#include <chrono>

#include "datapath/codec/packed_sum.h"

namespace trellis {

Status StepProtocol::CheckPayload(const Slice& s, const wire::RequestHeader& h,
                                  const wire::Chunks& frame, std::vector<uint8_t>* scratch,
                                  CodedFrame* coded) const {
  if (wire::IsTwoBit(h.op)) {
    const uint8_t* bytes =
        wire::Contiguous(frame, wire::kRequestHeaderBytes, h.payload_bytes, scratch);
    auto parsed = ParseCodedFrame(bytes, h.payload_bytes, static_cast<size_t>(s.num_elements));
    if (!parsed.ok()) {
      return InvalidArgumentError(s.name + ": " + wire::OpName(h.op) + ": " +
                                  parsed.status().message());
    }
    *coded = *parsed;
    return Status::Ok();
  }
  const int64_t got = static_cast<int64_t>(h.payload_bytes / sizeof(float));
  if (wire::OpHasPayload(h.op) && got != s.num_elements) {
    return InvalidArgumentError(s.name + ": " + wire::OpName(h.op) + " of " + std::to_string(got) +
                                " elements, the slice has " + std::to_string(s.num_elements));
  }
  return Status::Ok();
}

Status StepProtocol::Init(Slice* s, const wire::Chunks& frame, std::vector<DeferredReply>* out) {
  if (s->complete != 0 || s->pushes != 0) {
    return FailedPreconditionError(s->name + ": init after step 1 started (complete step " +
                                   std::to_string(s->complete) + "); broadcast before training");
  }
  auto v = std::make_shared<std::vector<float>>(s->num_elements);
  wire::CopyFloats(frame, wire::kRequestHeaderBytes, s->num_elements, v->data());
  if (mode_ == ServerMode::kUpdate) s->weights.values = *v;
  s->results.Restart(v);
  s->initialized = true;
  // Wake pulls of step 0 (broadcast receivers).
  auto& ws = s->waiters;
  for (auto it = ws.begin(); it != ws.end();) {
    if (it->step == 0) {
      series_->PullAnswered();
      out->push_back({std::move(it->reply), Status::Ok(), v, nullptr});
      it = ws.erase(it);
    } else {
      ++it;
    }
  }
  return Status::Ok();
}

Status StepProtocol::Push(int32_t worker, Slice* s, const wire::RequestHeader& h,
                          const Gradient& grad, std::vector<DeferredReply>* out) {
  if (s->rejoin.PushIsNoOp(worker, h.step, s->complete, s->pushed[worker])) return Status::Ok();
  const int64_t expected = s->complete + 1;
  if (h.step != expected) {
    return OutOfRangeError(s->name + ": push for step " + std::to_string(h.step) +
                           " outside the window: the server expects step " +
                           std::to_string(expected) + " (latest complete step " +
                           std::to_string(s->complete) + ")");
  }
  if (mode_ == ServerMode::kUpdate && !s->initialized) {
    return FailedPreconditionError(s->name + ": gradient pushed before the key was initialized "
                                   "(update mode needs Broadcast from the root before step 1)");
  }
  const World& world = *s->world;
  if (auto gone = s->gone.find(worker); gone != s->gone.end() && h.step >= gone->second) {
    return FailedPreconditionError(s->name + ": worker " + std::to_string(worker) + " pushed step " +
                                   std::to_string(h.step) + ", but it was lost for good from step " +
                                   std::to_string(gone->second) + " (docs/elastic.md#losing-a-worker)");
  }
  if (!world.Has(worker)) {
    return FailedPreconditionError(s->name + ": worker " + std::to_string(worker) +
                                   " pushed step " + std::to_string(h.step) + ", but it is not in " +
                                   world.Describe() + " (docs/elastic.md)");
  }
  if (s->pushed[worker]) {
    return AlreadyExistsError(s->name + ": worker " + std::to_string(worker) +
                              " pushed step " + std::to_string(h.step) + " twice");
  }
  const size_t n = static_cast<size_t>(s->num_elements);
  using Clock = std::chrono::steady_clock;
  const auto add_start = Clock::now();
  // Whether the step stays a sum of 2-bit pushes of one threshold (then its answer can be packed).
  const float t = grad.coded != nullptr ? PackThreshold(*grad.coded) : 0.0f;
  s->step_threshold = s->pushes == 0 || s->step_threshold == t ? t : 0.0f;
  if (s->pushes == 0) {
    // First contribution: copy instead of zero + add. Reuse a result buffer nobody references.
    const bool swap = grad.coded == nullptr && grad.owner != nullptr && grad.owner->size() == n &&
                      s->accum && s->accum->size() == n;
    if (!s->accum) s->accum = std::make_unique<std::vector<float>>(n);
    if (swap) {
      // The request's buffer becomes the sum, the spare accumulator the caller's next read
      // buffer: no copy, and both were written before (no page faults).
      s->accum->swap(*grad.owner);
    } else if (grad.coded != nullptr) {
      DecodeCodedFrame(*grad.coded, s->accum->data());
    } else {
      wire::CopyFloats(*grad.frame, wire::kRequestHeaderBytes, n, s->accum->data());
    }
  } else if (grad.coded != nullptr) {
    DecodeAddCodedFrame(*grad.coded, s->accum->data());
  } else {
    wire::AddFloats(*grad.frame, wire::kRequestHeaderBytes, n, s->accum->data());
  }
  s->pushed[worker] = true;
  const auto add_end = Clock::now();
  series_->Aggregated(std::chrono::duration<double>(add_end - add_start).count());
  if (++s->pushes < Needed(*s, expected)) return Status::Ok();
  Complete(s, out);
  return Status::Ok();
}

int32_t StepProtocol::Needed(const Slice& s, int64_t step) {
  int32_t needed = s.world->size;
  for (const auto& [slot, from] : s.gone) {
    if (step >= from && s.world->Has(slot)) --needed;
  }
  return needed;
}

void StepProtocol::Lose(int32_t slot, Slice* s, std::vector<DeferredReply>* out) {
  if (s->gone.count(slot)) return;
  // Its push of the step in progress counts; else that step completes without it.
  const int64_t next = s->complete + 1;
  s->gone[slot] = s->pushed[slot] ? next + 1 : next;
  if (!s->pushed[slot] && s->pushes > 0 && s->pushes >= Needed(*s, next)) Complete(s, out);
}

void StepProtocol::Complete(Slice* s, std::vector<DeferredReply>* out) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const size_t n = static_cast<size_t>(s->num_elements);
  const int64_t step = s->complete + 1;
  const float packable = mode_ == ServerMode::kAggregate ? s->step_threshold : 0.0f;
  // The mean divides by those who pushed: the world's members, but a lost one that did not.
  Values result = update_->Apply(step, s->pushes, &s->accum, &s->weights);
  // Recycle the buffer of step-2 as the next accumulator when no answer still references it
  // (saves a multi-MiB allocation and zero-fill per step).
  auto old = std::const_pointer_cast<std::vector<float>>(
      s->results.Keep(step, result, packable, s->pushes));
  if (!s->accum && old && old.use_count() == 1 && old->size() == n) {
    s->accum = std::make_unique<std::vector<float>>(std::move(*old));
  }
  s->complete = step;
  s->pushes = 0;
  s->step_threshold = 0;
  std::fill(s->pushed.begin(), s->pushed.end(), false);
  auto& ws = s->waiters;
  for (auto it = ws.begin(); it != ws.end();) {
    if (it->step == step) {
      series_->PullAnswered();
      out->push_back({std::move(it->reply), Status::Ok(), result,
                      PackedAnswer(s, step, it->packed)});
      it = ws.erase(it);
    } else {
      ++it;
    }
  }
  series_->StepCompleted(std::chrono::duration<double>(Clock::now() - start).count());
}

void StepProtocol::Pull(Slice* s, int64_t step, bool packed, StoreReply reply,
                        std::vector<DeferredReply>* out) {
  if (step < 0 || step < s->complete - 1 || step > s->complete + 1) {
    out->push_back({std::move(reply),
                    OutOfRangeError(s->name + ": pull of step " + std::to_string(step) +
                                    " outside the window [" +
                                    std::to_string(std::max<int64_t>(0, s->complete - 1)) + ", " +
                                    std::to_string(s->complete + 1) + "]"),
                    nullptr, nullptr});
    return;
  }
  if (Waits(*s, step)) {
    s->waiters.push_back({step, packed, std::move(reply)});  // answered when the step completes
    series_->PullWaiting();
    return;
  }
  Values v = s->results.Get(step);
  if (!v) {
    out->push_back({std::move(reply),
                    FailedPreconditionError(s->name + ": step 0 was never initialized "
                                            "(no Broadcast from the root)"),
                    nullptr, nullptr});
    return;
  }
  Packed p = PackedAnswer(s, step, packed);
  out->push_back({std::move(reply), Status::Ok(), std::move(v), std::move(p)});
}

}  // namespace trellis
