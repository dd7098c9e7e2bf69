#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "io/crc32c.hpp"
#include "tests/io/test_support.hpp"

using zoe::io::crc32c;
using zoe::io::crc32c_portable;

namespace {
// Bitwise reference: one bit at a time, straight from the polynomial definition.
std::uint32_t crc32c_bitwise(const void* data, std::size_t bytes) {
  auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < bytes; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}
}  // namespace

TEST(Crc32c, KnownVectors) {
  const char* check = "123456789";
  EXPECT_EQ(crc32c(check, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(check, 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // RFC 3720 appendix B.4: 32 bytes of zeros, of 0xFF, ascending and descending.
  unsigned char buf[32];
  std::memset(buf, 0, 32);
  EXPECT_EQ(crc32c(buf, 32), 0x8A9136AAu);
  std::memset(buf, 0xFF, 32);
  EXPECT_EQ(crc32c(buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(buf, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(crc32c(buf, 32), 0x113FDB5Cu);
  // RFC 3720 B.4: an iSCSI read command PDU.
  const unsigned char pdu[48] = {0x01, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                 0x14, 0, 0, 0, 0, 0, 0x04, 0, 0, 0, 0, 0x14, 0, 0, 0, 0x18,
                                 0x28, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(crc32c(pdu, 48), 0xD9963A56u);
  std::printf("crc32c path on this CPU: %s\n", std::string(zoe::io::crc32c_path()).c_str());
}

TEST(Crc32c, PathsAgreeWithBitwiseReferenceAtAllLengthsAndAlignments) {
  // Lengths cross the 3x256 and 3x8192 interleave thresholds; offsets test alignment.
  auto data = zoe::test::pattern_buffer(3 * 8192 * 2 + 4096, 7);
  const auto* base = static_cast<const unsigned char*>(data.data());
  std::vector<std::size_t> lengths = {1, 7, 8, 9, 63, 255, 767, 768, 769, 1000, 24575, 24576, 24577, 49152 + 1234};
  for (std::size_t offset : {0, 1, 3, 8, 13})
    for (std::size_t len : lengths) {
      std::uint32_t want = crc32c_bitwise(base + offset, len);
      EXPECT_EQ(crc32c(base + offset, len), want) << "offset " << offset << " length " << len;
      EXPECT_EQ(crc32c_portable(base + offset, len), want) << "offset " << offset << " length " << len;
    }
}

TEST(Crc32c, ContinuesAcrossCalls) {
  auto data = zoe::test::pattern_buffer(100000, 3);
  const auto* p = static_cast<const unsigned char*>(data.data());
  std::uint32_t whole = crc32c_bitwise(p, 100000);
  for (std::size_t split : {0, 1, 4095, 30000, 99999, 100000}) {
    EXPECT_EQ(crc32c(p + split, 100000 - split, crc32c(p, split)), whole) << split;
    EXPECT_EQ(crc32c_portable(p + split, 100000 - split, crc32c_portable(p, split)), whole) << split;
  }
}
