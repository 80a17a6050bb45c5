#include "worker-lib/src/step_gate.h"

#include <string>

namespace trellis {

StatusOr<KeyState*> StepGate::Admit(const OpRequest& r) const {
  if (closing_.load()) return CancelledError("worker shutting down");
  if (!keys_.finished()) {
    return FailedPreconditionError(std::string(r.verb) + " key " + std::to_string(r.key) +
                                   " before FinishDeclarations");
  }
  KeyState* k = keys_.Find(r.key);
  if (k == nullptr) {
    if (keys_.Late(r.key)) {
      return FailedPreconditionError(std::string(r.verb) + " of key " + std::to_string(r.key) +
                                     " declared after FinishDeclarations: call "
                                     "FinishDeclarations again first");
    }
    return NotFoundError(std::string(r.verb) + " of undeclared key " + std::to_string(r.key));
  }
  const bool needs_src = wire::OpHasPayload(r.op);
  const bool needs_dst = wire::AnswersWithValues(r.op);
  if ((needs_src && r.src == nullptr) || (needs_dst && r.dst == nullptr)) {
    return InvalidArgumentError(std::string(r.verb) + " " + KeyName(k->decl) + ": null buffer");
  }
  return k;
}

Status StepGate::AdmitCommand(wire::Op op) const {
  if (closing_.load()) return CancelledError("worker shutting down");
  if (!keys_.finished()) {
    return FailedPreconditionError(std::string(wire::OpName(op)) + " before FinishDeclarations");
  }
  return Status::Ok();
}

StatusOr<int64_t> StepGate::StepOf(KeyState& k, const OpRequest& r) {
  if (wire::IsRejoinOp(static_cast<uint8_t>(r.op))) return r.tag;  // not a step: the tag
  if (r.broadcast) {
    if (k.push_step.load() != 0) {
      return FailedPreconditionError(std::string(r.verb) + " " + KeyName(k.decl) +
                                     " after step " + std::to_string(k.push_step.load()) +
                                     ": broadcast before the first push");
    }
    return 0;
  }
  if (r.op == wire::Op::kPull) return k.push_step.load();
  const int64_t step = k.push_step.fetch_add(1) + 1;
  series_.KeyPushed(step);
  return step;
}

}  // namespace trellis
