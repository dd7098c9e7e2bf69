// How messages show user strings (src/common/quote.hpp): escaped byte for byte, cut at a
// character boundary with the full count said, and the JSON excerpt the config and checkpoint
// readers share.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "src/common/byte_size.hpp"
#include "src/common/quote.hpp"

namespace q = zoe::detail;  // qualified: std::quoted would be found by ADL
using namespace std::string_literals;

TEST(Quote, ShortPrintableTextIsQuotedAsIs) {
  EXPECT_EQ(q::quoted("layers.0.attn.weight"), "'layers.0.attn.weight'");
  EXPECT_EQ(q::quoted(""), "''");
  EXPECT_EQ(q::quoted("größe ✓ 名"), "'größe ✓ 名'");  // valid UTF-8 stays readable
}

TEST(Quote, ControlAndInvalidBytesAreEscaped) {
  EXPECT_EQ(q::quoted("bad\xff\xfe"), "'bad\\xff\\xfe'");
  EXPECT_EQ(q::quoted("a\0b"s), "'a\\x00b'");  // a NUL no longer cuts what()
  EXPECT_EQ(q::quoted("tab\there\nnewline\x1b[31m"), "'tab\\there\\nnewline\\x1b[31m'");
  EXPECT_EQ(q::quoted("\xc2\x85"), "'\\xc2\\x85'");               // U+0085, a C1 control
  EXPECT_EQ(q::quoted("\xc0\xaf"), "'\\xc0\\xaf'");               // overlong '/'
  EXPECT_EQ(q::quoted("\xed\xa0\x80"), "'\\xed\\xa0\\x80'");      // a surrogate
  EXPECT_EQ(q::quoted("\xf4\x90\x80\x80"), "'\\xf4\\x90\\x80\\x80'");  // above U+10FFFF
  EXPECT_EQ(q::quoted("\xe2\x9c"), "'\\xe2\\x9c'");               // truncated sequence
}

TEST(Quote, LongTextIsCutWithItsLengthSaid) {
  const std::string name(10000, 'n');
  const std::string q = q::quoted(name);
  EXPECT_EQ(q, "'" + std::string(64, 'n') + "...' (10000 characters)");
  EXPECT_EQ(q::quoted(name, 5), "'nnnnn...' (10000 characters)");
  EXPECT_EQ(q::excerpt(name, 3), "nnn... (10000 characters)");
  // Characters, not bytes: a cut never splits a UTF-8 sequence, the count is of characters.
  std::string wide;
  for (int i = 0; i < 100; ++i) wide += "名";  // 3 bytes each
  EXPECT_EQ(q::quoted(wide, 2), "'名名...' (100 characters)");
  EXPECT_EQ(q::character_count(wide), 100u);
  EXPECT_EQ(q::character_count("a\xff" "b"), 3u);
  EXPECT_EQ(q::quoted_path(std::string(600, 'p')), "'" + std::string(512, 'p') + "...' (600 characters)");
}

TEST(Quote, FindsTheFirstInvalidByte) {
  EXPECT_EQ(q::invalid_utf8_at("plain"), std::string_view::npos);
  EXPECT_EQ(q::invalid_utf8_at("größe"), std::string_view::npos);
  EXPECT_EQ(q::invalid_utf8_at("bad\xff\xfe"), 3u);
  EXPECT_EQ(q::invalid_utf8_at("ok\xe2\x9c"), 2u);
}

TEST(Quote, JsonExcerpt) {
  using nlohmann::json;
  EXPECT_EQ(q::json_excerpt(json("short")), "\"short\"");
  EXPECT_EQ(q::json_excerpt(json(std::string(100, 'A')), 8), "\"AAAAAAAA...\" (100 characters)");
  EXPECT_EQ(q::json_excerpt(json::array({1, 2, 3})), "[1,2,3]");
  EXPECT_EQ(q::json_excerpt(json::array({1111, 2222, 3333}), 6), "[1111,... (16 characters)");
  // Invalid UTF-8 in a value does not throw: it is shown as U+FFFD.
  EXPECT_EQ(q::json_excerpt(json("a\xff")), "\"a\xef\xbf\xbd\"");
}

// Log lines' sizes: bytes below 1 KiB, one decimal below 10 of a unit.
TEST(ByteSize, SaysTheLargestUnit) {
  EXPECT_EQ(zoe::detail::byte_size(0), "0 B");
  EXPECT_EQ(zoe::detail::byte_size(1023), "1023 B");
  EXPECT_EQ(zoe::detail::byte_size(1024), "1.0 KiB");
  EXPECT_EQ(zoe::detail::byte_size(3500), "3.4 KiB");
  EXPECT_EQ(zoe::detail::byte_size(40 * 1024), "40 KiB");
  EXPECT_EQ(zoe::detail::byte_size(12 * 1024 * 1024 + 5), "12 MiB");
  EXPECT_EQ(zoe::detail::byte_size(std::int64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(zoe::detail::byte_size(std::int64_t{5} << 50), "5120 TiB");
}
