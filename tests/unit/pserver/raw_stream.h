// A blocking raw client of DataService.Stream for tests: sends arbitrary bytes (good frames or
// garbage) and reads answer frames, every wait bounded.
#pragma once

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "datapath/grpc/frame.h"

namespace trellis::testing {

struct Answer {
  wire::ResponseHeader header;
  std::string message;
  std::vector<float> values;    // a float32 payload
  std::vector<uint8_t> payload;  // the payload's bytes (a packed answer: header.packed)
};

class RawStream {
 public:
  RawStream(const std::string& address, const std::string& token, const std::string& rank,
            std::chrono::seconds deadline = std::chrono::seconds(20)) {
    channel_ = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    stub_ = std::make_unique<grpc::GenericStub>(channel_);
    if (!token.empty()) ctx_.AddMetadata("x-trellis-token", token);
    if (!rank.empty()) ctx_.AddMetadata(wire::kRankMetadataKey, rank);
    ctx_.set_deadline(std::chrono::system_clock::now() + deadline);
    call_ = stub_->PrepareCall(&ctx_, wire::kStreamMethod, &cq_);
    call_->StartCall(Tag(1));
    ok_ = Next();
  }
  ~RawStream() {
    if (!finished_) {
      ctx_.TryCancel();
      grpc::Status s;
      call_->Finish(&s, Tag(9));
      Next();
    }
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  bool Write(const std::vector<uint8_t>& bytes) {
    StartWrite(bytes);
    return Next();
  }
  // False when the stream ended instead.
  bool Read(Answer* a) {
    StartRead();
    return Next() && TakeAnswer(a);
  }

  // Split-phase use, for a client that writes without reading: at most one write and one read
  // outstanding (the async API's rule); Poll says which completed.
  enum class Event { kNone, kWrote, kRead, kFailed };
  void StartWrite(const std::vector<uint8_t>& bytes) {
    grpc::Slice s(bytes.data(), bytes.size());
    write_buf_ = grpc::ByteBuffer(&s, 1);
    call_->Write(write_buf_, Tag(2));
  }
  void StartRead() { call_->Read(&read_buf_, Tag(3)); }
  // kNone: nothing completed within `wait`.
  Event Poll(std::chrono::milliseconds wait) {
    void* tag;
    bool ok = false;
    auto r = cq_.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + wait);
    if (r != grpc::CompletionQueue::GOT_EVENT) return Event::kNone;
    if (!ok) return Event::kFailed;
    return tag == Tag(2) ? Event::kWrote : Event::kRead;
  }
  // The answer of the last kRead.
  bool TakeAnswer(Answer* a) { return Decode(read_buf_, a); }

  grpc::Status Finish() {
    call_->WritesDone(Tag(4));
    Next();
    grpc::Status s;
    call_->Finish(&s, Tag(5));
    // `s` is only written when the status arrives: a server that never ends the stream must
    // not read as a clean finish.
    const bool arrived = Next();
    finished_ = true;
    if (!arrived) {
      ctx_.TryCancel();  // ends the pending Finish, so the destructor's drain does not wait on it
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "RawStream::Finish: no status from the server in time");
    }
    return s;
  }

 private:
  static bool Decode(grpc::ByteBuffer& bb, Answer* a) {
    std::vector<grpc::Slice> slices;
    (void)bb.Dump(&slices);
    bb.Clear();
    auto chunks = wire::ChunksOf(slices);
    if (!wire::DecodeResponse(chunks, &a->header, &a->message).ok()) return false;
    a->payload.resize(a->header.payload_bytes);
    wire::CopyOut(chunks, wire::kResponseHeaderBytes + a->header.message_bytes,
                  a->header.payload_bytes, a->payload.data());
    a->values.resize(a->header.packed ? 0 : a->payload.size() / 4);
    if (!a->values.empty()) std::memcpy(a->values.data(), a->payload.data(), a->values.size() * 4);
    return true;
  }

  static void* Tag(intptr_t i) { return reinterpret_cast<void*>(i); }
  bool Next() {
    void* tag;
    bool ok = false;
    auto r = cq_.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::seconds(20));
    return r == grpc::CompletionQueue::GOT_EVENT && ok;
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
  grpc::ClientContext ctx_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  grpc::ByteBuffer write_buf_;  // the split-phase write, alive until it completes
  grpc::ByteBuffer read_buf_;
  bool ok_ = false;
  bool finished_ = false;
};

}  // namespace trellis::testing
