// The TCP listener's answers: the thread that serves a request sends its answer itself when
// nothing else is being sent, but only what the socket takes without waiting; the rest goes to
// the connection's writer. A worker that stops reading must therefore cost the serving threads
// nothing (the server's one pool thread here serves every connection), and every answer must
// arrive whole and in order once it reads again, however the bytes were split between the
// serving thread and the writer. And the answers such a worker does not read are bounded: past
// the read-ahead's bytes the server reads no more of its requests, so its own socket holds it back.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "pserver/parameter_server.h"
#include "tests/testing/test_frames.h"
#include "tests/testing/test_pserver.h"
#include "tests/unit/pserver/raw_tcp.h"

namespace trellis {
namespace {

using testing::Answer;
using testing::RequestBytes;

constexpr char kToken[] = "tok";
constexpr int kElements = 255 << 10;  // 1020 KiB of floats per answer: one slice (under 1 MiB)
// About 96 MiB of answers: far more than the socket buffers (2 x 8 MiB each way) and the server's
// bound on answers not sent (the read-ahead's two maximal messages) together.
constexpr int kSteps = 96;

std::vector<float> Filled(float v) { return std::vector<float>(kElements, v); }

class TcpAnswersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ps = testing::StartTestPserver(
        testing::TestPserverOptions(kToken),
        {testing::FloatKey(0, kElements), testing::FloatKey(1, kElements)},
        testing::MapInstall::kOnStore);
    ASSERT_TRUE(ps.ok()) << ps.status().ToString();
    ps_ = std::move(ps->server);
  }
  // A connection past its hello (worker rank 0).
  std::unique_ptr<testing::RawTcp> Connect() {
    auto c = std::make_unique<testing::RawTcp>(ps_->tcp_port());
    Answer a;
    EXPECT_TRUE(c->Hello(kToken, 0, &a) && a.header.code == 0) << a.message;
    return c;
  }
  std::unique_ptr<ParameterServer> ps_;
};

TEST_F(TcpAnswersTest, AWorkerThatStopsReadingHoldsUpNoOneAndGetsEveryAnswerLater) {
  // The stalled worker: kSteps push-pulls of key 0 (step s pushes s, W = 1: the answer is s),
  // written by a thread (the server stops reading it once its answers back up), none read yet.
  auto stalled = Connect();
  ASSERT_GE(stalled->fd(), 0);
  std::atomic<int> written{0};
  std::thread flood([&] {
    for (int s = 1; s <= kSteps; ++s) {
      if (!stalled->Write(RequestBytes(wire::Op::kPushPull, 0, 0, s, Filled(float(s)), s))) return;
      written.fetch_add(1);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let its answers back up

  // Another worker's big requests, two back to back (served by the pool, not the reader): they
  // are answered while the first worker still reads nothing.
  auto other = Connect();
  ASSERT_GE(other->fd(), 0);
  ASSERT_TRUE(other->Write(RequestBytes(wire::Op::kPushPull, 1, 0, 1, Filled(0.5f), 101)));
  ASSERT_TRUE(other->Write(RequestBytes(wire::Op::kPushPull, 1, 0, 2, Filled(1.5f), 102)));
  for (uint64_t id : {101u, 102u}) {
    Answer a;
    ASSERT_TRUE(other->Read(&a, 10000)) << "a worker that stopped reading held up another's answer";
    EXPECT_EQ(a.header.code, 0) << a.message;
    EXPECT_EQ(a.header.request_id, id);
    ASSERT_EQ(a.values.size(), static_cast<size_t>(kElements));
    EXPECT_EQ(a.values.front(), id == 101 ? 0.5f : 1.5f);
  }

  // The server stopped reading the stalled worker once its answers backed up: its requests wait
  // in its own socket, not as answers in the server's memory.
  EXPECT_LT(written.load(), kSteps) << "the server read every request of a worker that reads no "
                                       "answers: what it queues for it is unbounded";

  // The stalled worker reads again: every answer, in order, whole and with its own step's sum.
  for (int s = 1; s <= kSteps; ++s) {
    Answer a;
    ASSERT_TRUE(stalled->Read(&a, 10000)) << "answer " << s;
    ASSERT_EQ(a.header.code, 0) << a.message;
    EXPECT_EQ(a.header.request_id, static_cast<uint64_t>(s));
    ASSERT_EQ(a.values.size(), static_cast<size_t>(kElements));
    EXPECT_EQ(a.values.front(), float(s));
    EXPECT_EQ(a.values.back(), float(s));
    EXPECT_EQ(a.values[kElements / 2 + 7], float(s));
  }
  flood.join();
}

}  // namespace
}  // namespace trellis
