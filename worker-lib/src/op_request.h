// An operation as the program asked for it (Push, Pull, PushPull, Broadcast; a rejoin's Stash
// or Fetch), and one slice of it as it waits in the queue and goes to its server.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "datapath/frame.h"
#include "trellis/trellis.h"
#include "worker-lib/src/op_state.h"
#include "worker-lib/src/slice_metrics.h"
#include "worker-lib/src/transport.h"

namespace trellis {

struct OpRequest {
  const char* verb;  // how errors name it: "PushPull", "Broadcast", "Stash"
  wire::Op op;       // kPush, kPull, kPushPull; kInit or kPull for a broadcast; kStash, kFetch
  KeyId key;
  const float* src;  // what goes up, or null
  float* dst;        // where the answer goes, or null
  int priority;
  Callback done;
  bool broadcast = false;
  int64_t tag = 0;  // kStash / kFetch: the rejoin id, sent in the step field
};

// One slice of one operation, waiting in the queue or in flight.
struct SliceTask {
  std::shared_ptr<Handle::State> op;
  size_t part = 0;
  int32_t server = 0;
  SliceRequest request;
  float* out = nullptr;     // pull destination, or nullptr
  int64_t slice_bytes = 0;  // the slice's size (what a pull brings back)
  SliceClock::time_point enqueued{};
};

}  // namespace trellis
