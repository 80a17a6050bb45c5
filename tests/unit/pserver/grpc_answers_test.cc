// The gRPC stream's answers to a worker that stops reading them are bounded, as on TCP
// (tcp_answers_test.cc): past the read-ahead's bytes of unsent answers the server reads no more
// of that worker's requests, so gRPC's flow control holds its writes back, and every answer
// arrives whole and in order once it reads again.
#include <chrono>
#include <string>
#include <vector>

#include <grpc/grpc.h>
#include <gtest/gtest.h>

#include "pserver/parameter_server.h"
#include "tests/testing/test_frames.h"
#include "tests/testing/test_pserver.h"
#include "tests/unit/pserver/raw_stream.h"

namespace trellis {
namespace {

using testing::Answer;
using testing::RawStream;
using testing::RequestBytes;
using Event = RawStream::Event;

constexpr char kToken[] = "tok";
constexpr int kElements = 255 << 10;  // 1020 KiB of floats per answer: one slice (under 1 MiB)
// About 96 MiB of answers: far more than gRPC's flow-control windows and the server's bound on
// answers not sent (the read-ahead's two maximal messages) together.
constexpr int kSteps = 96;

// Step s pushes s (W = 1: the answer is s).
std::vector<uint8_t> Step(int s) {
  return RequestBytes(wire::Op::kPushPull, 0, 0, s, std::vector<float>(kElements, float(s)), s);
}

TEST(GrpcAnswersTest, AWorkerThatStopsReadingIsHeldBackAndGetsEveryAnswerLater) {
  // gRPC's library clean-up when its last object goes (here the server, after 96 MiB through
  // one stream) waited 10 s in about one run in ten on a loaded machine: keep the library up
  // until the process exits.
  grpc_init();
  auto ps = testing::StartTestPserver(testing::TestPserverOptions(kToken),
                                      {testing::FloatKey(0, kElements)},
                                      testing::MapInstall::kOnStore);
  ASSERT_TRUE(ps.ok()) << ps.status().ToString();
  RawStream s("127.0.0.1:" + std::to_string(ps->server->port()), kToken, "0",
              std::chrono::seconds(120));

  // Write without reading until a write has not completed for a second: the server stopped
  // reading this stream once its answers backed up.
  int written = 0;
  s.StartWrite(Step(1));
  while (written < kSteps) {
    Event e = s.Poll(std::chrono::milliseconds(1000));
    if (e == Event::kNone) break;
    ASSERT_EQ(e, Event::kWrote) << "the stream failed while writing step " << written + 1;
    if (++written < kSteps) s.StartWrite(Step(written + 1));
  }
  EXPECT_LT(written, kSteps) << "the server read every request of a worker that reads no "
                                "answers: what it queues for it is unbounded";

  // Read again: every answer in order, whole, with its own step's sum; the held-back writes go on.
  int answered = 0;
  s.StartRead();
  while (answered < kSteps) {
    Event e = s.Poll(std::chrono::milliseconds(20000));
    ASSERT_NE(e, Event::kNone) << "no progress after " << answered << " answers";
    ASSERT_NE(e, Event::kFailed) << "the stream failed after " << answered << " answers";
    if (e == Event::kWrote) {
      if (++written < kSteps) s.StartWrite(Step(written + 1));
      continue;
    }
    Answer a;
    ASSERT_TRUE(s.TakeAnswer(&a));
    ++answered;
    ASSERT_EQ(a.header.code, 0) << a.message;
    EXPECT_EQ(a.header.request_id, static_cast<uint64_t>(answered));
    ASSERT_EQ(a.values.size(), static_cast<size_t>(kElements));
    EXPECT_EQ(a.values.front(), float(answered));
    EXPECT_EQ(a.values.back(), float(answered));
    if (answered < kSteps) s.StartRead();
  }
  EXPECT_EQ(written, kSteps);
  EXPECT_TRUE(s.Finish().ok());
}

}  // namespace
}  // namespace trellis
