// For the link tests (tcp/worker_link_test, grpc/worker_link_test, grpc/server_link_test): a
// LinkReceiver that records what a worker's link delivers and when it ended, and request frames
// as parts.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "datapath/link.h"

namespace trellis::link {

// Records what the link delivers. `view`: read payloads with View() instead of ReadInto();
// `skip_first`: leave the first answer's payload unread.
class Recorder final : public LinkReceiver {
 public:
  bool view = false;
  bool skip_first = false;

  void OnAnswer(const wire::ResponseHeader& h, std::string_view message,
                AnswerPayload& payload) override {
    std::vector<float> values(payload.bytes() / sizeof(float));
    std::lock_guard lock(mu_);
    const bool skip = skip_first && answers_.empty();
    if (!skip && payload.bytes() > 0) {
      if (view) {
        auto chunks = payload.View();
        EXPECT_TRUE(chunks.ok());
        if (chunks.ok()) wire::CopyOut(*chunks, 0, payload.bytes(), values.data());
      } else {
        EXPECT_TRUE(payload.ReadInto(values.data(), nullptr).ok());
      }
    }
    answers_.push_back({h.request_id, skip ? std::vector<float>{} : values});
    codes_.push_back(h.code);
    messages_.emplace_back(message);
    cv_.notify_all();
  }
  void OnClosed(const Status& st) override {
    std::lock_guard lock(mu_);
    ++closed_;
    closed_status_ = st;
    cv_.notify_all();
  }

  std::vector<std::pair<uint64_t, std::vector<float>>> WaitAnswers(size_t n) {
    std::unique_lock lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(10), [&] { return answers_.size() >= n; }));
    return answers_;
  }
  Status WaitClosed() {
    std::unique_lock lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(10), [&] { return closed_ > 0; }));
    return closed_status_;
  }
  // Answer i's status: its code and message.
  std::pair<int32_t, std::string> Verdict(size_t i) {
    std::lock_guard lock(mu_);
    return {codes_.at(i), messages_.at(i)};
  }
  int closed() {
    std::lock_guard lock(mu_);
    return closed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<uint64_t, std::vector<float>>> answers_;  // GUARDED_BY(mu_)
  std::vector<int32_t> codes_;                                    // GUARDED_BY(mu_)
  std::vector<std::string> messages_;                             // GUARDED_BY(mu_)
  int closed_ = 0;                                                // GUARDED_BY(mu_)
  Status closed_status_;                                          // GUARDED_BY(mu_)
};

// The count of `sent` callbacks once it reached `n`, or after 10 s. A writer runs `sent` once its
// sendmsg returned, which may be after the server already answered.
inline int WaitSent(const std::atomic<int>& sent, int n) {
  for (int i = 0; i < 1000 && sent.load() < n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return sent.load();
}

// A push-pull request part: its header (id, payload length) and the caller's payload.
inline Part PartOf(uint64_t id, const void* payload, uint64_t bytes) {
  Part p;
  wire::RequestHeader h;
  h.op = wire::Op::kPushPull;
  h.request_id = id;
  h.payload_bytes = bytes;
  wire::EncodeRequestHeader(h, p.head);
  p.payload = payload;
  p.payload_bytes = bytes;
  return p;
}

// The bytes a frame must arrive as: each part's header, then its payload.
inline std::vector<uint8_t> BytesOf(const OutFrame& f) {
  std::vector<uint8_t> out;
  auto add = [&](const Part& p) {
    out.insert(out.end(), p.head, p.head + sizeof p.head);
    const auto* b = static_cast<const uint8_t*>(p.payload);
    if (p.payload_bytes > 0) out.insert(out.end(), b, b + p.payload_bytes);
  };
  add(f.first);
  for (const auto& e : f.entries) add(e);
  return out;
}

}  // namespace trellis::link
