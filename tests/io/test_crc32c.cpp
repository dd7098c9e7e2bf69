#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "io/crc32c.hpp"
#include "io/crc32c_fold.hpp"
#include "tests/io/test_support.hpp"
#include "zoe/error.hpp"

using zoe::io::crc32c;
using zoe::io::crc32c_portable;
using zoe::io::crc32c_via;
using zoe::io::Crc32cPath;

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

// x^e mod P by long division in the ordinary (not reflected) bit order, P = x^32 + 0x1EDC6F41:
// an independent derivation of what io/crc32c_fold.hpp computes in the reflected order.
std::uint32_t xpow_mod_normal(unsigned e) {
  std::uint64_t r = 1;
  for (unsigned k = 0; k < e; ++k) {
    r <<= 1;
    if (r >> 32) r ^= 0x11EDC6F41ull;
  }
  return static_cast<std::uint32_t>(r);
}

std::uint32_t reverse_bits(std::uint32_t v) {
  std::uint32_t r = 0;
  for (int i = 0; i < 32; ++i) r |= ((v >> i) & 1u) << (31 - i);
  return r;
}

const Crc32cPath kAllPaths[] = {Crc32cPath::table, Crc32cPath::sse42, Crc32cPath::pclmul, Crc32cPath::vpclmul};

std::string path_label(const testing::TestParamInfo<Crc32cPath>& info) {
  std::string name(zoe::io::crc32c_path_name(info.param));
  for (char& c : name)
    if (c == '.') c = '_';
  return name;
}

// One instance per path; a path this CPU cannot run is reported as skipped.
class Crc32cPathTest : public testing::TestWithParam<Crc32cPath> {
 protected:
  void SetUp() override {
    if (!zoe::io::crc32c_path_supported(GetParam()))
      GTEST_SKIP() << "this CPU cannot run the " << zoe::io::crc32c_path_name(GetParam()) << " path";
  }
  std::uint32_t crc(const void* data, std::size_t bytes, std::uint32_t init = 0) const {
    return crc32c_via(GetParam(), data, bytes, init);
  }
};
}  // namespace

TEST(Crc32c, FoldConstantsMatchLongDivision) {
  using namespace zoe::io::detail;
  for (unsigned d : {kFold128, kFold256, kFold384, kFold512, kFold2048}) {
    const FoldConstant k = crc32c_fold_constant(d);
    EXPECT_EQ(k.high_half, std::uint64_t{reverse_bits(xpow_mod_normal(d + 32))} << 1) << "distance " << d;
    EXPECT_EQ(k.low_half, std::uint64_t{reverse_bits(xpow_mod_normal(d - 32))} << 1) << "distance " << d;
  }
  // Spot values: x^32 mod P is P's low part; x^31 is itself (bit 0 of the register).
  EXPECT_EQ(crc32c_xpow_mod(32), 0x82F63B78u);
  EXPECT_EQ(crc32c_xpow_mod(31), 1u);
  EXPECT_EQ(crc32c_xpow_mod(0), 0x80000000u);
}

TEST(Crc32c, ActivePathIsTheFirstSupportedInPreferenceOrder) {
  Crc32cPath best = Crc32cPath::table;
  for (Crc32cPath p : {Crc32cPath::pclmul, Crc32cPath::sse42, Crc32cPath::vpclmul})  // least preferred first
    if (zoe::io::crc32c_path_supported(p)) best = p;
  EXPECT_EQ(zoe::io::crc32c_active_path(), best);
  EXPECT_TRUE(zoe::io::crc32c_path_supported(Crc32cPath::table));
  std::printf("crc32c path on this CPU: %s\n", std::string(zoe::io::crc32c_path()).c_str());
}

TEST(Crc32c, UnsupportedPathIsAUsageError) {
  for (Crc32cPath p : kAllPaths) {
    if (zoe::io::crc32c_path_supported(p)) continue;
    EXPECT_THROW(crc32c_via(p, "x", 1), zoe::UsageError) << zoe::io::crc32c_path_name(p);
  }
}

TEST_P(Crc32cPathTest, KnownVectors) {
  const char* check = "123456789";
  EXPECT_EQ(crc(check, 9), 0xE3069283u);
  EXPECT_EQ(crc("", 0), 0u);
  EXPECT_EQ(crc("", 0, 0x12345678u), 0x12345678u);
  // RFC 3720 appendix B.4: 32 bytes of zeros, of 0xFF, ascending and descending.
  unsigned char buf[32];
  std::memset(buf, 0, 32);
  EXPECT_EQ(crc(buf, 32), 0x8A9136AAu);
  std::memset(buf, 0xFF, 32);
  EXPECT_EQ(crc(buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc(buf, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(crc(buf, 32), 0x113FDB5Cu);
  // RFC 3720 B.4: an iSCSI read command PDU.
  const unsigned char pdu[48] = {0x01, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                 0x14, 0, 0, 0, 0, 0, 0x04, 0, 0, 0, 0, 0x14, 0, 0, 0, 0x18,
                                 0x28, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(crc(pdu, 48), 0xD9963A56u);
  // Long enough for every folding loop: 4 KiB of zeros and of 0xFF (values from the bitwise
  // reference, which is checked against the vectors above).
  std::vector<unsigned char> big(4096, 0);
  EXPECT_EQ(crc(big.data(), big.size()), crc32c_bitwise(big.data(), big.size()));
  std::memset(big.data(), 0xFF, big.size());
  EXPECT_EQ(crc(big.data(), big.size()), crc32c_bitwise(big.data(), big.size()));
}

TEST_P(Crc32cPathTest, AgreesWithBitwiseReferenceAcrossThresholds) {
  // Lengths around the SSE4.2 interleave (3x256, 3x8192) and the folding loops (64, 128, 256,
  // 512 bytes and their multiples); offsets test alignment.
  auto data = zoe::test::pattern_buffer(3 * 8192 * 2 + 4096, 7);
  const auto* base = static_cast<const unsigned char*>(data.data());
  std::vector<std::size_t> lengths = {1, 7, 8, 9, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513, 767, 768,
                                      769, 1000, 24575, 24576, 24577, 49152 + 1234};
  for (std::size_t offset : {0, 1, 3, 8, 13, 63})
    for (std::size_t len : lengths)
      EXPECT_EQ(crc(base + offset, len), crc32c_bitwise(base + offset, len)) << "offset " << offset << " length " << len;
}

TEST_P(Crc32cPathTest, EqualsTheTablePathAtEveryLengthAndAlignment) {
  // Every length 0..2304 at each of 64 offsets, so every loop's remainder and every start
  // alignment meets every other; the table path is itself checked against the bitwise reference.
  constexpr std::size_t kMaxLen = 2304;
  auto data = zoe::test::pattern_buffer(kMaxLen + 64, 11);
  const auto* base = static_cast<const unsigned char*>(data.data());
  int failures = 0;
  for (std::size_t offset = 0; offset < 64 && failures < 10; ++offset)
    for (std::size_t len = 0; len <= kMaxLen && failures < 10; ++len) {
      const std::uint32_t init = static_cast<std::uint32_t>(len * 2654435761u + offset);
      const std::uint32_t want = crc32c_portable(base + offset, len, init), got = crc(base + offset, len, init);
      if (got != want) {
        ++failures;
        ADD_FAILURE() << "offset " << offset << " length " << len << ": " << std::hex << got << " != " << want;
      }
    }
}

TEST_P(Crc32cPathTest, LongBuffersWithRandomBytes) {
  std::mt19937_64 rng(42);
  std::vector<unsigned char> buf((1 << 20) + 4096);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (std::size_t len : {std::size_t{1} << 20, (std::size_t{1} << 20) + 1, (std::size_t{1} << 20) + 4095, std::size_t{100003}})
    for (std::size_t offset : {0, 5, 32, 4000}) {
      if (offset + len > buf.size()) continue;
      EXPECT_EQ(crc(buf.data() + offset, len), crc32c_portable(buf.data() + offset, len))
          << "offset " << offset << " length " << len;
    }
}

TEST_P(Crc32cPathTest, ContinuesAcrossCalls) {
  auto data = zoe::test::pattern_buffer(100000, 3);
  const auto* p = static_cast<const unsigned char*>(data.data());
  std::uint32_t whole = crc32c_bitwise(p, 100000);
  for (std::size_t split : {0, 1, 4095, 30000, 99999, 100000}) {
    EXPECT_EQ(crc(p + split, 100000 - split, crc(p, split)), whole) << split;
    EXPECT_EQ(crc(p + split, 100000 - split, crc32c_portable(p, split)), whole) << split;
  }
  EXPECT_EQ(crc32c(p, 100000), whole);
}

INSTANTIATE_TEST_SUITE_P(Paths, Crc32cPathTest, testing::ValuesIn(kAllPaths), path_label);
