// The token cache, the split, entropy and batch sampling.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "examples/gpt/dataset.hpp"
#include "zoe/error.hpp"
#include "tests/gpt/test_data_dir.hpp"

namespace gpt {
namespace {

TEST(Dataset, NormalizesCrlfOnly) {
  EXPECT_EQ(normalize_newlines("a\r\nb\rc\n\r\n"), "a\nb\rc\n\n");
}

TEST(Dataset, UnigramEntropy) {
  EXPECT_DOUBLE_EQ(unigram_entropy({7, 7, 7}), 0.0);
  EXPECT_NEAR(unigram_entropy({1, 2, 3, 4}), std::log(4.0), 1e-12);
  // p = (1/2, 1/4, 1/4): H = 1.5 ln 2.
  EXPECT_NEAR(unigram_entropy({5, 5, 9, 11}), 1.5 * std::log(2.0), 1e-12);
}

TEST(Dataset, BatchesAreShiftedWindows) {
  std::vector<TokenId> tokens(1000);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i);
  std::mt19937_64 rng(3);
  const Batch b = sample_batch(tokens, 4, 16, rng);
  ASSERT_EQ(b.inputs.size(), 64u);
  for (int w = 0; w < 4; ++w)
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(b.targets[w * 16 + t], b.inputs[w * 16 + t] + 1);
      if (t) EXPECT_EQ(b.inputs[w * 16 + t], b.inputs[w * 16 + t - 1] + 1);
    }
  const Batch s = sequential_batch(tokens, 2, 10, 1);  // windows 2 and 3
  EXPECT_EQ(s.inputs[0], 20);
  EXPECT_EQ(s.inputs[10], 30);
  EXPECT_EQ(s.targets[19], 40);
  EXPECT_THROW(sample_batch(tokens, 1, 1000, rng), zoe::Error);
}

TEST(DatasetWithData, BuildsAndReusesTheTokenCache) {
  std::string why;
  const auto dir = test::data_dir(why);
  if (!dir) GTEST_SKIP() << why;
  const std::string cache = std::string(ZOE_GPT_TEST_DATA) + "/cache-test";
  std::filesystem::remove_all(cache);
  const TokenSplit a = load_or_build_tokens(*dir, cache, 0.05, 2);
  const double total = static_cast<double>(a.train.size() + a.val.size());
  EXPECT_GT(total, 2.5e6);  // ~11.8 MB of English at ~4 bytes per token
  EXPECT_LT(total, 3.5e6);
  EXPECT_NEAR(a.val.size() / total, 0.05, 0.001);
  EXPECT_EQ(std::count(a.train.begin(), a.train.end(), 50256) +
                std::count(a.val.begin(), a.val.end(), 50256),
            18);  // one <|endoftext|> per book
  // The second call reads the cache: same tokens, and the files are what it returns.
  const auto mtime = std::filesystem::last_write_time(cache + "/train.bin");
  const TokenSplit b = load_or_build_tokens(*dir, cache, 0.05, 2);
  EXPECT_EQ(std::filesystem::last_write_time(cache + "/train.bin"), mtime);
  EXPECT_TRUE(a.train == b.train);
  EXPECT_TRUE(a.val == b.val);
  const double h = unigram_entropy(a.train);
  EXPECT_GT(h, 5.0);
  EXPECT_LT(h, 9.0);
  std::filesystem::remove_all(cache);
}

}  // namespace
}  // namespace gpt
