// Where an operation enters the worker: whether it may start (the worker is open, declarations
// are finished, its key is placed, its buffers are there) and which step it belongs to. A key's
// step is the number of pushes this worker made of it, which its servers count too: a push opens
// the key's next step, a pull reads the current one, and step n of the job starts with the first
// push numbered n (WorkerMetrics::KeyPushed). The worker's step boundary is therefore here.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/base/status.h"
#include "datapath/frame.h"
#include "worker-lib/src/key_state.h"
#include "worker-lib/src/key_table.h"
#include "worker-lib/src/op_request.h"
#include "worker-lib/src/worker_metrics.h"

namespace trellis {

class StepGate {
 public:
  StepGate(const KeyTable& keys, WorkerMetrics& series) : keys_(keys), series_(series) {}
  StepGate(const StepGate&) = delete;
  StepGate& operator=(const StepGate&) = delete;

  // No operation starts from now on (the worker is shutting down).
  void Close() { closing_.store(true); }
  bool closing() const { return closing_.load(); }

  // The placed key of `r`, or why `r` may not start: the worker shutting down, before
  // FinishDeclarations, an undeclared or late key, a buffer missing.
  StatusOr<KeyState*> Admit(const OpRequest& r) const;
  // A server-wide command (wire::Op::kSave, kLoad, kRejoin): shutting down, or before
  // FinishDeclarations.
  Status AdmitCommand(wire::Op op) const;
  // The step `r` of `k` belongs to: a push (or pushpull) counts the key's next step, a pull reads
  // the current one, a stash or fetch carries its tag; a broadcast is step 0 and only before the
  // key's first push.
  StatusOr<int64_t> StepOf(KeyState& k, const OpRequest& r);

 private:
  const KeyTable& keys_;
  WorkerMetrics& series_;
  std::atomic<bool> closing_{false};
};

}  // namespace trellis
