#include "common/checkpoint/crc32c.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace trellis {
namespace {

// RFC 3720 (iSCSI) appendix B.4 vectors and the usual check value.
TEST(Crc32cTest, StandardVectors) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  std::vector<uint8_t> zeros(32, 0x00), ones(32, 0xFF), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<uint8_t>(i);
    dec[i] = static_cast<uint8_t>(31 - i);
  }
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(dec.data(), 32), 0x113FDB5Cu);
}

TEST(Crc32cTest, PortableEqualsDispatchedAndExtendsInPieces) {
  std::string s;
  for (int i = 0; i < 1000; ++i) s += static_cast<char>((i * 131 + 7) & 0xFF);
  for (size_t len : {0u, 1u, 7u, 8u, 9u, 63u, 64u, 999u, 1000u}) {
    EXPECT_EQ(Crc32cExtendPortable(0, s.data(), len), Crc32cExtend(0, s.data(), len)) << len;
    for (size_t cut : {size_t{0}, len / 3, len}) {
      uint32_t a = Crc32cExtend(Crc32cExtend(0, s.data(), cut), s.data() + cut, len - cut);
      EXPECT_EQ(a, Crc32c(s.data(), len)) << len << " cut " << cut;
    }
  }
}

}  // namespace
}  // namespace trellis
