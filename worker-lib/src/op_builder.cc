#include "worker-lib/src/op_builder.h"

#include <chrono>
#include <string>

namespace trellis {

OpPlan OpBuilder::Plan(const KeyState& k, const OpRequest& r, int64_t step) const {
  OpPlan plan;
  plan.priority = !priority_enabled_ && !r.broadcast ? 0 : r.priority;
  plan.compressed =
      (r.op == wire::Op::kPush || r.op == wire::Op::kPushPull) && compression_.Compressed(k, step);
  plan.op = r.op;
  // A pull of a compressed step may come back packed as well (never a broadcast's: step 0).
  if (!r.broadcast) {
    plan.op = compression_.WireOp(
        r.op, plan.compressed || (r.op == wire::Op::kPull && compression_.Compressed(k, step)),
        /*packable=*/!k.half.has_value());
  }
  return plan;
}

std::shared_ptr<Handle::State> OpBuilder::NewOperation(const KeyState& k, const OpRequest& r,
                                                       const OpPlan& plan, int64_t step,
                                                       Callback done) const {
  auto st = std::make_shared<Handle::State>();
  st->what = std::string(r.verb) + " " + KeyName(k.decl) + " step " + std::to_string(step);
  st->deadline = Handle::State::Clock::now() + std::chrono::milliseconds(timeout_ms_);
  st->spin_before_blocking =
      k.decl.num_elements * static_cast<int64_t>(sizeof(float)) <= Handle::State::kSpinMaxBytes;
  // Latency and errors of the whole operation, recorded before the user's callback runs.
  st->SetCallback([&series = series_, op = plan.op, start = Handle::State::Clock::now(),
                   user = std::move(done)](const Status& s) {
    series.OperationDone(
        op, s.ok(), std::chrono::duration<double>(Handle::State::Clock::now() - start).count());
    if (user) user(s);
  });
  st->slice_index.reserve(k.slices.size());
  st->slice_server.reserve(k.slices.size());
  for (const auto& s : k.slices) {
    st->slice_index.push_back(s.index);
    st->slice_server.push_back(s.server);
  }
  st->ExpectParts(k.slices.size());
  return st;
}

Operation OpBuilder::Slices(const KeyState& k, const OpRequest& r, const OpPlan& plan,
                            int64_t step, std::shared_ptr<Handle::State> state,
                            std::vector<WorkerCompression::Frame> frames) const {
  const bool needs_src = wire::OpHasPayload(r.op);
  const bool needs_dst = wire::AnswersWithValues(r.op);
  Operation out;
  out.priority = plan.priority;
  out.tasks.reserve(k.slices.size());
  for (size_t i = 0; i < k.slices.size(); ++i) {
    const SliceInfo& s = k.slices[i];
    SliceTask t;
    t.op = state;
    t.part = i;
    t.server = s.server;
    t.request.op = plan.op;
    t.request.key = r.key;
    t.request.slice = s.index;
    t.request.step = step;
    t.request.priority = plan.priority;
    if (plan.compressed) {
      t.request.encoded = std::move(frames[i]);
    } else if (needs_src) {
      t.request.payload = r.src + s.offset;
      t.request.payload_elements = s.num_elements;
    }
    t.out = needs_dst ? r.dst + s.offset : nullptr;
    t.slice_bytes = s.num_elements * static_cast<int64_t>(sizeof(float));
    t.enqueued = SliceClock::now();
    if (t.out != nullptr) {  // a bulk transport reads the answer straight into `out`
      t.request.out = t.out;
      t.request.out_elements = s.num_elements;
      t.request.out_mu = &state->data_mu;
      t.request.out_closed = &state->closed;
    }
    out.tasks.push_back(std::move(t));
  }
  out.state = std::move(state);
  return out;
}

Operation OpBuilder::ServerCommand(wire::Op op, int64_t step, uint64_t key, size_t num_servers,
                                   std::shared_ptr<const std::vector<uint8_t>> payload) const {
  Operation out;
  out.priority = kBroadcastPriority;
  out.state = std::make_shared<Handle::State>();
  Handle::State& st = *out.state;
  st.what = op == wire::Op::kWorld
                ? "announcing world " + std::to_string(step) + " to the servers"
                : std::string("checkpoint ") + wire::OpName(op) + " of step " + std::to_string(step);
  st.deadline = Handle::State::Clock::now() + std::chrono::milliseconds(timeout_ms_);
  st.ExpectParts(num_servers);
  for (size_t i = 0; i < num_servers; ++i) {
    st.slice_index.push_back(0);
    st.slice_server.push_back(static_cast<int32_t>(i));
    SliceTask t;
    t.op = out.state;
    t.part = i;
    t.server = static_cast<int32_t>(i);
    t.request.op = op;
    t.request.key = key;
    t.request.step = step;
    t.request.priority = kBroadcastPriority;
    t.request.encoded = payload;
    t.out = nullptr;
    t.enqueued = SliceClock::now();  // its queue wait is measured like any slice's
    out.tasks.push_back(std::move(t));
  }
  return out;
}

}  // namespace trellis
