// TwoBitCodec: one residual per slice, sizes pinned per slice, safe from several threads.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "tests/unit/datapath/codec/twobit_reference.h"
#include "datapath/codec/twobit.h"
#include "datapath/codec/twobit_codec.h"

namespace trellis {
namespace {

TEST(TwoBitCodec, CreateRejectsBadThreshold) {
  auto codec = TwoBitCodec::Create(0.0f);
  ASSERT_FALSE(codec.ok());
  EXPECT_NE(codec.status().message().find("threshold must be finite and > 0"), std::string::npos);
}

TEST(TwoBitCodec, KeepsOneResidualPerSlice) {
  auto codec = TwoBitCodec::Create(1.0f);
  ASSERT_TRUE(codec.ok());
  const std::vector<float> small{0.6f, -0.6f};
  std::vector<uint8_t> frame;
  // Slice 1 twice: 0.6 then 1.2 -> sends on the second push. Slice 2 once: nothing sent.
  ASSERT_TRUE((*codec)->Encode(1, small.data(), 2, &frame).ok());
  ASSERT_TRUE((*codec)->Encode(2, small.data(), 2, &frame).ok());
  ASSERT_TRUE((*codec)->Encode(1, small.data(), 2, &frame).ok());
  std::vector<float> out(2);
  ASSERT_TRUE(TwoBitDequantize(frame.data(), frame.size(), out.data(), 2).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f, -1.0f}));
  EXPECT_EQ((*codec)->Residual(1), (std::vector<float>{0.6f + 0.6f - 1.0f, -0.6f - 0.6f + 1.0f}));
  EXPECT_EQ((*codec)->Residual(2), small);
  EXPECT_TRUE((*codec)->Residual(3).empty());
  (*codec)->Reset();
  EXPECT_EQ((*codec)->Residual(1), (std::vector<float>{0.0f, 0.0f}));
}

TEST(TwoBitCodec, SliceSizeIsFixed) {
  auto codec = TwoBitCodec::Create(1.0f);
  ASSERT_TRUE(codec.ok());
  std::vector<float> grad(8, 0.0f);
  std::vector<uint8_t> frame;
  ASSERT_TRUE((*codec)->Encode(5, grad.data(), 8, &frame).ok());
  const Status st = (*codec)->Encode(5, grad.data(), 4, &frame);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("2bit slice 5: 4 elements, but its residual has 8"), std::string::npos)
      << st.message();
}

TEST(TwoBitCodec, ConcurrentSlicesMatchSerialEncoding) {
  const float t = 0.5f;
  const size_t n = 4096;
  const int slices = 4, steps = 20;
  auto parallel = TwoBitCodec::Create(t);
  auto serial = TwoBitCodec::Create(t);
  ASSERT_TRUE(parallel.ok() && serial.ok());
  std::vector<std::vector<uint8_t>> last(slices);
  std::vector<std::thread> threads;
  for (int s = 0; s < slices; ++s) {
    threads.emplace_back([&, s] {
      for (int step = 0; step < steps; ++step) {
        const auto grad = testing::RandomGradient(n, t, static_cast<uint32_t>(s * 1000 + step));
        if (!(*parallel)->Encode(s, grad.data(), n, &last[s]).ok()) return;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int s = 0; s < slices; ++s) {
    std::vector<uint8_t> frame;
    for (int step = 0; step < steps; ++step) {
      const auto grad = testing::RandomGradient(n, t, static_cast<uint32_t>(s * 1000 + step));
      ASSERT_TRUE((*serial)->Encode(s, grad.data(), n, &frame).ok());
    }
    EXPECT_EQ(frame, last[s]) << "slice " << s;
    EXPECT_TRUE(testing::SameBits((*serial)->Residual(s), (*parallel)->Residual(s)));
  }
}

}  // namespace
}  // namespace trellis
