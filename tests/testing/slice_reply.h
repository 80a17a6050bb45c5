// The worker side of a data-path test: a slice request to send on a ServerConnection, and a box
// its reply lands in, waited for with a deadline.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "common/base/status.h"
#include "datapath/frame.h"
#include "worker-lib/src/transport.h"

namespace trellis::testing {

// A PushPull of `grad` on `key` at `step`, answered into `out`; both outlive the reply.
inline SliceRequest PushPullRequest(uint64_t key, int64_t step, const std::vector<float>& grad,
                                    std::vector<float>& out) {
  SliceRequest r;
  r.op = wire::Op::kPushPull;
  r.key = key;
  r.step = step;
  r.payload = grad.data();
  r.payload_elements = static_cast<int64_t>(grad.size());
  r.out = out.data();
  r.out_elements = static_cast<int64_t>(out.size());
  return r;
}

// One reply: its status and, when the transport handed the answer's bytes over instead of reading
// them into the request's `out`, a copy of them.
struct ReplyBox {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;             // GUARDED_BY(mu)
  Status status;                 // GUARDED_BY(mu)
  bool in_place = false;         // GUARDED_BY(mu): the answer was read straight into `out`
  std::vector<float> values;     // GUARDED_BY(mu): float32 bytes handed over (not in place)
  std::vector<uint8_t> packed;   // GUARDED_BY(mu): a packed answer (Payload::packed)

  SliceReply Reply() {
    return [this](const Status& st, const Payload& p) {
      std::lock_guard lock(mu);
      status = st;
      in_place = p.in_place;
      if (p.packed) {
        packed.resize(p.bytes);
        wire::CopyOut(*p.chunks, p.offset, p.bytes, packed.data());
      } else if (p.chunks != nullptr) {
        values.resize(p.bytes / sizeof(float));
        wire::CopyOut(*p.chunks, p.offset, p.bytes, values.data());
      }
      done = true;
      cv.notify_all();
    };
  }
  bool Wait(std::chrono::seconds timeout = std::chrono::seconds(10)) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return done; });
  }
};

}  // namespace trellis::testing
