// The data's content checks: SHA-256 itself, the pinned tokenizer hashes, a token cache that
// was overwritten or built from an edited book is rebuilt (saying why), a truncated vocab.bpe
// is refused naming the file and both hashes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "examples/gpt/dataset.hpp"
#include "examples/gpt/sha256.hpp"
#include "examples/gpt/tokenizer.hpp"
#include "tests/gpt/test_data_dir.hpp"
#include "zoe/error.hpp"

namespace gpt {
namespace {
namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void write_all(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// A data dir with the real tokenizer files and two short books (fast to tokenize), and a
// cache dir beside it; removed at the end.
class SmallData {
 public:
  explicit SmallData(const std::string& source) {
    root_ = fs::path(ZOE_GPT_TEST_DATA).parent_path() /
            ("gpt-integrity-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(data() / "gutenberg");
    fs::copy_file(fs::path(source) / "encoder.json", data() / "encoder.json");
    fs::copy_file(fs::path(source) / "vocab.bpe", data() / "vocab.bpe");
    for (const char* book : {"blake-poems.txt", "burgess-busterbrown.txt"})
      fs::copy_file(fs::path(source) / "gutenberg" / book, data() / "gutenberg" / book);
  }
  ~SmallData() { fs::remove_all(root_); }
  fs::path data() const { return root_ / "data"; }
  fs::path cache() const { return root_ / "cache"; }
  TokenSplit load() const { return load_or_build_tokens(data().string(), cache().string(), 0.05, 2); }

 private:
  fs::path root_;
};

// load() with stderr captured.
TokenSplit load_capturing(const SmallData& d, std::string& err) {
  ::testing::internal::CaptureStderr();
  try {
    TokenSplit s = d.load();
    err = ::testing::internal::GetCapturedStderr();
    return s;
  } catch (...) {
    err = ::testing::internal::GetCapturedStderr();
    throw;
  }
}

}  // namespace

TEST(Sha256, KnownAnswersAndFiles) {
  // FIPS 180-4 examples.
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const fs::path file = fs::path(ZOE_GPT_TEST_DATA).parent_path() / ("sha-" + std::to_string(::getpid()));
  std::string big(3 << 20, 'a');  // crosses the 1 MiB read chunks
  write_all(file, big);
  EXPECT_EQ(sha256_file(file.string()), sha256_hex(big));
  fs::remove(file);
  EXPECT_THROW(sha256_file(file.string()), zoe::Error);
}

TEST(Sha256WithData, PinnedTokenizerHashesMatchFetchData) {
  const std::string script = read_all(fs::path(ZOE_GPT_SOURCE_DIR) / "scripts/fetch-data.sh");
  EXPECT_NE(script.find("encoder_json_sha=" + std::string(kEncoderJsonSha256) + "\n"), std::string::npos);
  EXPECT_NE(script.find("vocab_bpe_sha=" + std::string(kVocabBpeSha256) + "\n"), std::string::npos);
  std::string why;
  const auto dir = test::data_dir(why);
  if (!dir) GTEST_SKIP() << why;
  EXPECT_EQ(sha256_file(*dir + "/encoder.json"), kEncoderJsonSha256);
  EXPECT_EQ(sha256_file(*dir + "/vocab.bpe"), kVocabBpeSha256);
  EXPECT_NO_THROW(Tokenizer::load_gpt2(*dir + "/encoder.json", *dir + "/vocab.bpe"));
}

TEST(DataIntegrityWithData, ACacheOverwrittenWithZerosOfTheSameSizeIsRebuilt) {
  std::string why;
  const auto dir = test::data_dir(why);
  if (!dir) GTEST_SKIP() << why;
  SmallData d(*dir);
  const TokenSplit built = d.load();
  ASSERT_GT(built.train.size(), 10'000u);
  const fs::path train = d.cache() / "train.bin";
  const auto bytes = fs::file_size(train);
  write_all(train, std::string(bytes, '\0'));  // same size, all token 0 ("!")
  std::string err;
  const TokenSplit again = load_capturing(d, err);
  EXPECT_TRUE(again.train == built.train) << "the zeros were used";
  EXPECT_TRUE(again.val == built.val);
  EXPECT_NE(err.find("rebuilding the token cache '" + d.cache().string() + "': '" + train.string() +
                     "' does not match its recorded sha256 (" + sha256_hex(std::string(bytes, '\0'))),
            std::string::npos)
      << err;
  EXPECT_EQ(read_all(train).find(std::string(64, '\0')), std::string::npos) << "train.bin was rewritten";
  // Reused silently once it is good again.
  const TokenSplit third = load_capturing(d, err);
  EXPECT_EQ(err, "");
  EXPECT_TRUE(third.train == built.train);
}

TEST(DataIntegrityWithData, ABookEditedAtTheSameSizeRebuildsTheCache) {
  std::string why;
  const auto dir = test::data_dir(why);
  if (!dir) GTEST_SKIP() << why;
  SmallData d(*dir);
  const TokenSplit before = d.load();
  const fs::path book = d.data() / "gutenberg" / "blake-poems.txt";
  std::string text = read_all(book);
  const std::size_t at = text.find("Tiger");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 5, "Zebra");  // same size
  write_all(book, text);
  std::string err;
  const TokenSplit after = load_capturing(d, err);
  EXPECT_NE(err.find("book blake-poems.txt changed (sha256 " + sha256_hex(text)), std::string::npos) << err;
  EXPECT_FALSE(after.train == before.train) << "the stale cache was reused";
  // The tokens are those of the edited text: a fresh cache from the same books agrees.
  const TokenSplit fresh = load_or_build_tokens(d.data().string(), (d.cache() / "fresh").string(), 0.05, 1);
  EXPECT_TRUE(after.train == fresh.train);
  EXPECT_TRUE(after.val == fresh.val);
}

TEST(DataIntegrityWithData, ATruncatedVocabIsRefusedNamingTheFileAndBothHashes) {
  std::string why;
  const auto dir = test::data_dir(why);
  if (!dir) GTEST_SKIP() << why;
  SmallData d(*dir);
  d.load();  // a good cache exists: a bad tokenizer file is refused all the same
  const fs::path vocab = d.data() / "vocab.bpe";
  std::string text = read_all(vocab);
  text.resize(text.size() / 2);
  text.resize(text.rfind('\n') + 1);  // cut between two merges: it still parses
  write_all(vocab, text);
  EXPECT_NO_THROW(Tokenizer::load((d.data() / "encoder.json").string(), vocab.string())) << "parses, so only a hash can tell";
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      if (attempt == 0) d.load();
      else Tokenizer::load_gpt2((d.data() / "encoder.json").string(), vocab.string());
      ADD_FAILURE() << "a truncated vocab.bpe was accepted";
    } catch (const zoe::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("tokenizer file '" + vocab.string() + "' is not the expected file: sha256 " +
                         sha256_hex(text) + ", expected " + std::string(kVocabBpeSha256)),
                std::string::npos)
          << msg;
    }
  }
  // An edited encoder.json is refused the same way.
  write_all(vocab, read_all(fs::path(*dir) / "vocab.bpe"));
  const fs::path encoder = d.data() / "encoder.json";
  std::string json = read_all(encoder);
  json[json.find("\"!\"") + 1] = '?';
  write_all(encoder, json);
  try {
    d.load();
    ADD_FAILURE() << "an edited encoder.json was accepted";
  } catch (const zoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer file '" + encoder.string() + "'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(std::string(kEncoderJsonSha256)), std::string::npos) << e.what();
  }
}

}  // namespace gpt
