#include "pserver/front_door.h"

#include <utility>

#include "common/tls/auth.h"
#include "common/base/logging.h"

namespace trellis {

Status CheckToken(const std::string& expected, const std::string& token) {
  if (expected.empty()) return Status::Ok();
  if (token.empty()) return UnauthenticatedError("missing job token");
  if (!TokenEquals(expected, token)) return UnauthenticatedError("wrong job token");
  return Status::Ok();
}

Status CheckWorker(const std::string& expected, const std::string& token, int32_t rank,
                   int32_t num_workers) {
  TRELLIS_RETURN_IF_ERROR(CheckToken(expected, token));
  if (rank < 0 || rank >= num_workers) {
    return InvalidArgumentError("worker rank " + std::to_string(rank) + " outside [0, " +
                                std::to_string(num_workers) + ")");
  }
  return Status::Ok();
}

FrontDoor::FrontDoor(SliceStore* store, ServingQueue* serving, int32_t worker,
                     std::weak_ptr<AnswerSink> sink)
    : store_(store),
      worker_(worker),
      sink_(std::move(sink)),
      strand_(std::make_shared<ServingStrand>(serving)) {}

void FrontDoor::SendError(wire::Op op, uint64_t id, const Status& status) {
  if (auto sink = sink_.lock()) sink->Send(AnswerFrame::Error(op, id, status));
}

void FrontDoor::Receive(RequestFrame frame, ServingQueue::Inline policy) {
  const wire::RequestHeader& h = frame.header;
  if (h.op != wire::Op::kBulk) {
    Submit(h, std::move(frame.chunks), std::move(frame.hold), frame.floats, policy);
    return;
  }
  std::vector<wire::BulkEntry> entries;
  Status st = wire::ParseBulk(frame.chunks, wire::kRequestHeaderBytes, h.payload_bytes, &entries);
  if (!st.ok()) {
    // The frame was read whole, so the connection is still in step: refuse the bulk, go on.
    TLOG_WARN << "data connection of worker " << worker_ << ": " << st.ToString();
    SendError(wire::Op::kBulk, h.request_id, st);
    return;
  }
  // Each entry is served by its own priority; the frame lives until the last one is served.
  for (const auto& e : entries) {
    Submit(e.header, wire::SubChunks(frame.chunks, e.offset, e.bytes), frame.hold, nullptr,
           ServingQueue::Inline::kSmallOnly);
  }
}

void FrontDoor::Submit(const wire::RequestHeader& h, wire::Chunks chunks,
                       std::shared_ptr<void> hold, std::vector<float>* floats,
                       ServingQueue::Inline policy) {
  auto job = [self = shared_from_this(), h, chunks = std::move(chunks), hold, floats] {
    self->Serve(h, chunks, floats);
  };
  if (!strand_->Submit(h.priority, h.payload_bytes, std::move(job), policy)) {
    SendError(h.op, h.request_id, UnavailableError("parameter server shutting down"));
  }
}

void FrontDoor::Serve(const wire::RequestHeader& h, const wire::Chunks& chunks,
                      std::vector<float>* floats) {
  store_->Handle(worker_, h, chunks, [sink = sink_, h](const Status& st, Answer answer) {
    std::shared_ptr<AnswerSink> to = sink.lock();
    if (to == nullptr) return;  // the worker is gone
    if (!st.ok()) {
      to->Send(AnswerFrame::Error(h.op, h.request_id, st));
      return;
    }
    AnswerFrame a;
    a.priority = h.priority;
    if (answer.packed) {
      a.packed = std::move(answer.packed);  // only what is sent is held
    } else {
      a.values = std::move(answer.values);
    }
    wire::ResponseHeader r;
    r.op = h.op;
    r.request_id = h.request_id;
    r.packed = a.packed != nullptr;
    r.payload_bytes = a.PayloadBytes();
    a.head.resize(wire::kResponseHeaderBytes);
    wire::EncodeResponseHeader(r, a.head.data());
    to->Send(std::move(a));
  }, floats);
}

}  // namespace trellis
