// GPT-2 tokenizer: pre-tokenizer splits, ids against the reference implementation (the npm
// package gpt-3-encoder 1.1.4's Encoder.js, run with node to produce the expected ids), and
// byte-exact round trips.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "examples/gpt/dataset.hpp"
#include "zoe/error.hpp"
#include "examples/gpt/pretokenize.hpp"
#include "examples/gpt/tokenizer.hpp"
#include "examples/gpt/unicode.hpp"
#include "tests/gpt/test_data_dir.hpp"

namespace gpt {
namespace {

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> out;
  for (auto p : pretokenize(text)) out.emplace_back(p);
  return out;
}

TEST(Pretokenize, FollowsGpt2Regex) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split("Hello world"), (V{"Hello", " world"}));
  // '\s+(?!\S)' leaves the last space to prefix the next word; a lone newline is '\s+'.
  EXPECT_EQ(split("I'm here  now\n\nok "), (V{"I", "'m", " here", " ", " now", "\n", "\n", "ok", " "}));
  EXPECT_EQ(split("don't 'S"), (V{"don", "'t", " '", "S"}));
  EXPECT_EQ(split("3.14!! x"), (V{"3", ".", "14", "!!", " x"}));
  EXPECT_EQ(split("   "), (V{"   "}));
  EXPECT_EQ(split(""), V{});
}

TEST(Unicode, ClassifiesAndNeverFailsToDecode) {
  EXPECT_EQ(classify(U'é'), CharClass::letter);
  EXPECT_EQ(classify(U'漢'), CharClass::letter);
  EXPECT_EQ(classify(U'½'), CharClass::number);
  EXPECT_EQ(classify(0x3000), CharClass::space);
  EXPECT_EQ(classify(U'!'), CharClass::other);
  const std::string latin1 = "caf\xe9";  // invalid UTF-8: the byte reads as Latin-1 'é'
  EXPECT_EQ(decode_utf8(latin1, 3).value, U'é');
  EXPECT_EQ(decode_utf8(latin1, 3).length, 1);
  EXPECT_EQ(decode_utf8("\xc3\xa9", 0).value, U'é');
  EXPECT_EQ(decode_utf8("\xc0\x80", 0).length, 1);  // overlong
}

class TokenizerWithData : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    if (auto dir = test::data_dir(why)) {
      dir_ = *dir;
      tok_ = new Tokenizer(Tokenizer::load(dir_ + "/encoder.json", dir_ + "/vocab.bpe"));
    } else {
      skip_reason_ = why;
    }
  }
  static void TearDownTestSuite() { delete tok_; }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << skip_reason_;
  }
  static inline Tokenizer* tok_ = nullptr;
  static inline std::string dir_, skip_reason_;
};

TEST_F(TokenizerWithData, HelloWorld) {
  EXPECT_EQ(tok_->vocab_size(), 50257u);
  EXPECT_EQ(tok_->end_of_text(), 50256);
  EXPECT_EQ(tok_->encode("Hello world"), (std::vector<TokenId>{15496, 995}));
}

TEST_F(TokenizerWithData, MatchesReferenceEncoder) {
  // Expected ids from gpt-3-encoder 1.1.4 (node: require('./Encoder.js').encode(text)).
  const std::vector<std::pair<std::string, std::vector<TokenId>>> cases = {
      {"I'm here  now\n\nok ", {40, 1101, 994, 220, 783, 198, 198, 482, 220}},
      {"don't you're we've I'll he'd 'S",
       {9099, 470, 345, 821, 356, 1053, 314, 1183, 339, 1549, 705, 50}},
      {"  leading\ttabs\t\n", {220, 3756, 197, 8658, 82, 197, 198}},
      {"Numbers: 12345 and 3.14159!!", {49601, 25, 17031, 2231, 290, 513, 13, 1415, 19707, 3228}},
      {"\xc3\xa9migr\xc3\xa9 caf\xc3\xa9 na\xc3\xafve", {2634, 76, 3692, 2634, 40304, 41492}},
      {"x = a+b; // comment\r\n", {87, 796, 257, 10, 65, 26, 3373, 2912, 201, 198}},
      {"   ", {220, 220, 220}},
      {"'''quoted''' ?!?", {7061, 6, 421, 5191, 7061, 6, 5633, 22857}},
      {"\xc3\x9cn\xc3\xaf" "c\xc3\xb6" "d\xc3\xa9 \xc2\xbd \xc2\xb2 \xe6\xbc\xa2\xe5\xad\x97\xe3\x83\x86\xe3\x82\xb9\xe3\x83\x88",
       {127, 250, 77, 26884, 66, 9101, 67, 2634, 25208, 1587, 110, 10545, 120, 95, 27764, 245,
        24336, 43302}},
  };
  for (const auto& [text, ids] : cases) {
    EXPECT_EQ(tok_->encode(text), ids) << "text: " << text;
    EXPECT_EQ(tok_->decode(ids), text);
  }
}

TEST_F(TokenizerWithData, RoundTripsWholeBooks) {
  // A CRLF book with Latin-1 bytes (invalid UTF-8) and a plain one: decode(encode(t)) == t.
  for (const char* name : {"shakespeare-caesar.txt", "carroll-alice.txt"}) {
    std::ifstream in(dir_ + "/gutenberg/" + name, std::ios::binary);
    ASSERT_TRUE(in) << name;
    std::ostringstream os;
    os << in.rdbuf();
    const std::string text = os.str();
    const auto ids = tok_->encode(text);
    EXPECT_GT(ids.size(), text.size() / 6) << name;
    EXPECT_LT(ids.size(), text.size() / 2) << name;
    EXPECT_TRUE(tok_->decode(ids) == text) << name << " does not round-trip";
  }
}

TEST_F(TokenizerWithData, RejectsIdsOutsideTheVocabulary) {
  const std::vector<TokenId> bad{50257};
  EXPECT_THROW(tok_->decode(bad), zoe::Error);
}

TEST(TokenizerLoad, MissingFileNamesThePath) {
  try {
    Tokenizer::load("/nonexistent/encoder.json", "/nonexistent/vocab.bpe");
    FAIL() << "expected zoe::Error";
  } catch (const zoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/encoder.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace gpt
