// One worker's connection to this server above its transport: the part both front doors share
// (the raw-TCP listener, pserver/tcp_data_server.*, and the gRPC stream, pserver/data_service.*),
// so that the wire contract means the same on either (DESIGN).
//
//  * Admission: CheckWorker checks the job token and the worker's rank, as the TCP hello and the
//    gRPC metadata carry them.
//  * Serving: each request frame a transport read whole goes to Receive; a bulk is split into its
//    entries. The connection's requests are served through the server's serving queue one at a
//    time, highest priority first, arrival order where priorities tie (ServingStrand), each
//    competing with every other connection's by its priority.
//  * Answers: the store's answer (or its error) is encoded once, as an AnswerFrame that references
//    the store's result buffer, and handed to the transport's AnswerSink with the request's
//    priority; errors with the highest, so that the worker's handle fails at once.
//
// What stays with each transport: reading frames (and bounding what one connection may have read
// and not had served: the frame's `hold` gives its share back when it is let go of) and writing
// answers highest priority first. The types between them are the server's side of the link
// interface (datapath/link.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "datapath/frame.h"
#include "datapath/link.h"
#include "pserver/serving_queue.h"
#include "pserver/slice_store.h"

namespace trellis {

// Checks a caller's job token against the job's (`expected` empty: no check): UNAUTHENTICATED
// "missing job token" or "wrong job token".
Status CheckToken(const std::string& expected, const std::string& token);
// Checks a connecting worker: its token (CheckToken), then `rank` in [0, slots), the job's
// worker ranks (INVALID_ARGUMENT "worker rank 5 outside [0, 2)").
Status CheckWorker(const std::string& expected, const std::string& token, int32_t rank,
                   int32_t slots);

using link::AnswerFrame;
using link::AnswerSink;
using link::RequestFrame;

class FrontDoor : public link::RequestReceiver, public std::enable_shared_from_this<FrontDoor> {
 public:
  // `store` and `serving` outlive the door. Answers to a connection that is gone (its sink
  // destroyed) are dropped, so a pull answered long after its worker left costs nothing.
  FrontDoor(SliceStore* store, ServingQueue* serving, int32_t worker,
            std::weak_ptr<AnswerSink> sink);

  // Serves `frame` (a bulk: each entry by its own priority; a bulk that does not parse is
  // refused and the connection goes on). `policy`: whether it may be served on the caller's
  // thread whatever its size (ServingQueue::Inline).
  void Receive(RequestFrame frame,
               ServingQueue::Inline policy = ServingQueue::Inline::kSmallOnly);
  // RequestReceiver (a server link's reader): Receive, on that thread whatever the size when
  // nothing is behind it.
  void OnRequest(RequestFrame frame, bool nothing_behind) override {
    Receive(std::move(frame), nothing_behind ? ServingQueue::Inline::kAnySize
                                             : ServingQueue::Inline::kSmallOnly);
  }
  // Answers request `id` with an error (highest priority).
  void SendError(wire::Op op, uint64_t id, const Status& status);
  // Drops the requests not started yet (shutdown: what they hold is let go of).
  void Clear() override { strand_->Clear(); }

 private:
  void Serve(const wire::RequestHeader& h, const wire::Chunks& chunks,
             std::vector<float>* floats);
  void Submit(const wire::RequestHeader& h, wire::Chunks chunks,
              std::shared_ptr<void> hold, std::vector<float>* floats,
              ServingQueue::Inline policy);

  SliceStore* const store_;
  const int32_t worker_;
  const std::weak_ptr<AnswerSink> sink_;
  const std::shared_ptr<ServingStrand> strand_;
};

}  // namespace trellis
