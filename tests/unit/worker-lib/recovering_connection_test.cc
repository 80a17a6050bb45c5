// A recovering ServerConnection's retained pushes against a caller that reuses its memory the moment an
// answer comes back, and a server that answers at once (a 16 MiB copy takes milliseconds, the
// answer microseconds): whenever the retention copy is made, it must be made before the answer
// is passed on, so the replay after a reconnect carries the values that were pushed, never what
// the caller wrote afterwards.
#include "worker-lib/src/server_connection.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "datapath/frame.h"

namespace trellis {
namespace {

// An answer without payload.
class NoPayload final : public link::AnswerPayload {
 public:
  uint64_t bytes() const override { return 0; }
  Status ReadInto(void*, link::WriteGuard*) override { return Status::Ok(); }
  StatusOr<wire::Chunks> View() override { return wire::Chunks{}; }
};

// A link to a server that answers every request at once on a thread of its own (as a
// transport's reader would); once `Break()` was called, the next request ends the link
// (UNAVAILABLE: a lost server) and is dropped. It keeps what it was sent.
class InstantLink final : public link::WorkerLink {
 public:
  struct Sent {
    wire::RequestHeader header;
    const void* payload = nullptr;
    std::shared_ptr<const std::vector<uint8_t>> encoded;
  };
  ~InstantLink() override {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mu_);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
    std::lock_guard lock(mu_);
    if (!closed_) receiver_->OnClosed(CancelledError("link closed"));
  }
  void Start(link::LinkReceiver* receiver) override { receiver_ = receiver; }
  void Write(link::OutFrame f) override {
    std::lock_guard lock(mu_);
    if (closed_) return;
    wire::RequestHeader h;
    EXPECT_TRUE(wire::ParseRequestHeader(f.first.head, &h).ok());
    sent_.push_back({h, f.first.payload, f.first.encoded});
    if (broken_) {
      closed_ = true;
      threads_.emplace_back(
          [r = receiver_] { r->OnClosed(UnavailableError("connection reset by peer")); });
      return;
    }
    threads_.emplace_back([r = receiver_, h, sent = std::move(f.sent)] {
      if (sent) sent();
      wire::ResponseHeader answer;
      answer.op = h.op;
      answer.request_id = h.request_id;
      NoPayload payload;
      r->OnAnswer(answer, "", payload);
    });
  }
  void Break() {
    std::lock_guard lock(mu_);
    broken_ = true;
  }
  std::vector<Sent> Requests() {
    std::lock_guard lock(mu_);
    return sent_;
  }

 private:
  link::LinkReceiver* receiver_ = nullptr;
  std::mutex mu_;
  bool broken_ = false;               // GUARDED_BY(mu_)
  bool closed_ = false;               // GUARDED_BY(mu_): OnClosed ran or is on its way
  std::vector<Sent> sent_;            // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;  // GUARDED_BY(mu_)
};

// Sends `r` and waits for its answer; `on_answer` runs first, on the answering thread.
Status SendAndWait(ServerConnection& c, const SliceRequest& r,
                   std::function<void()> on_answer = nullptr) {
  std::promise<Status> done;
  c.Send(r, [&done, on_answer](const Status& st, const Payload&) {
    if (on_answer) on_answer();
    done.set_value(st);
  });
  return done.get_future().get();
}

TEST(RecoveringConnection, ReplayCarriesThePushedValuesWhenTheCallerReusesItsMemoryAtOnce) {
  // 16 MiB: the copy takes milliseconds, the answer comes back in microseconds.
  constexpr int64_t kElements = 4 << 20;
  std::vector<float> grad(kElements, 1.0f);

  auto first = std::make_unique<InstantLink>();
  InstantLink* first_raw = first.get();
  auto second = std::make_unique<InstantLink>();
  InstantLink* second_raw = second.get();
  std::atomic<int> connects{0};
  ConnectionOptions options;
  options.address.service = "127.0.0.1:1";
  options.timeout_ms = 10000;
  auto install = [](const v1::ShardMap&, int32_t, int64_t) { return Status::Ok(); };
  LinkOpener open = [&](const ConnectionOptions&) -> StatusOr<ServerLink> {
    const int n = connects.fetch_add(1);
    if (n == 0) return ServerLink{std::move(first), install};
    if (n > 1 || !second) return UnavailableError("no more servers");
    return ServerLink{std::move(second), install};
  };
  auto opened = ServerConnection::Open(options, open, RecoveryOptions{});
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<ServerConnection> conn = std::move(*opened);

  for (int round = 0; round < 3; ++round) {
    std::fill(grad.begin(), grad.end(), 1.0f + static_cast<float>(round));
    SliceRequest push;
    push.op = wire::Op::kPush;
    push.key = 7;
    push.slice = 0;
    push.step = round + 1;
    push.payload = grad.data();
    push.payload_elements = kElements;
    // The caller reuses its gradient memory as soon as the operation completes.
    ASSERT_TRUE(SendAndWait(*conn, push, [&] { std::fill(grad.begin(), grad.end(), -1.0f); }).ok());
  }

  // The server is lost: the next push is held, the connection replaced and the retained pushes
  // (steps 2 and 3, the last two) replayed, then the held push resumes.
  first_raw->Break();
  std::fill(grad.begin(), grad.end(), 9.0f);
  SliceRequest push;
  push.op = wire::Op::kPush;
  push.key = 7;
  push.slice = 0;
  push.step = 4;
  push.payload = grad.data();
  push.payload_elements = kElements;
  ASSERT_TRUE(SendAndWait(*conn, push).ok());

  std::vector<int64_t> replayed_steps;
  bool step4_resent = false;
  for (const InstantLink::Sent& r : second_raw->Requests()) {
    if (r.header.op == wire::Op::kPush && r.header.step == 4) {
      step4_resent = true;
      EXPECT_EQ(r.payload, grad.data());
      continue;
    }
    if (r.header.op != wire::Op::kReplay || !r.encoded) continue;
    const std::vector<uint8_t>& bytes = *r.encoded;
    ASSERT_EQ(bytes.size(), wire::kRequestHeaderBytes + kElements * sizeof(float));
    std::vector<float> values(kElements);
    std::memcpy(values.data(), bytes.data() + wire::kRequestHeaderBytes, kElements * sizeof(float));
    // Step s pushed s everywhere (step 4: 9); never the -1 written after an answer.
    const float want = r.header.step == 4 ? 9.0f : static_cast<float>(r.header.step);
    const auto wrong = std::count_if(values.begin(), values.end(),
                                     [want](float v) { return v != want; });
    EXPECT_EQ(wrong, 0) << "replay of step " << r.header.step << " carries " << wrong
                        << " values the caller wrote after the answer";
    replayed_steps.push_back(r.header.step);
  }
  std::sort(replayed_steps.begin(), replayed_steps.end());
  // Step 3, the newest complete push, is always replayed. Step 4 is replayed when the reconnect
  // read the retained pushes after its copy was kept, else it goes out again as it was.
  const bool step4_replayed =
      std::find(replayed_steps.begin(), replayed_steps.end(), 4) != replayed_steps.end();
  EXPECT_NE(std::find(replayed_steps.begin(), replayed_steps.end(), 3), replayed_steps.end());
  EXPECT_NE(step4_replayed, step4_resent);
  EXPECT_EQ(connects.load(), 2);  // the first link and one reconnect
  conn.reset();
}

}  // namespace
}  // namespace trellis
