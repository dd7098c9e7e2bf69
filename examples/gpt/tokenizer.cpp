#include "examples/gpt/tokenizer.hpp"

#include <array>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "examples/gpt/error.hpp"
#include "examples/gpt/pretokenize.hpp"
#include "examples/gpt/sha256.hpp"
#include "examples/gpt/unicode.hpp"

namespace gpt {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  GPT_CHECK(in, "cannot open tokenizer file '", path, "'");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// encoder.py's bytes_to_unicode(), inverted: the code point that stands for each byte.
std::array<char32_t, 256> byte_to_unicode() {
  std::array<char32_t, 256> table{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    table[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return table;
}

// A token string of encoder.json / vocab.bpe (UTF-8 of byte-standing code points) -> raw bytes.
std::string to_bytes(std::string_view mapped, const std::unordered_map<char32_t, char>& inverse,
                     const std::string& file) {
  std::string out;
  for (std::size_t pos = 0; pos < mapped.size();) {
    const CodePoint cp = decode_utf8(mapped, pos);
    auto it = inverse.find(cp.value);
    GPT_CHECK(it != inverse.end(), "tokenizer file '", file, "': token '", mapped,
              "' has a character that stands for no byte (U+", std::hex,
              static_cast<std::uint32_t>(cp.value), ")");
    out.push_back(it->second);
    pos += cp.length;
  }
  return out;
}

std::uint32_t pair_key(TokenId a, TokenId b) { return (std::uint32_t{a} << 16) | b; }

}  // namespace

Tokenizer Tokenizer::load(const std::string& encoder_json_path,
                          const std::string& vocab_bpe_path) {
  std::unordered_map<char32_t, char> inverse;
  const auto table = byte_to_unicode();
  for (int b = 0; b < 256; ++b) inverse[table[b]] = static_cast<char>(b);

  Tokenizer t;
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(read_file(encoder_json_path));
  } catch (const nlohmann::json::exception& e) {
    GPT_THROW("tokenizer file '", encoder_json_path, "' is not valid JSON: ", e.what());
  }
  GPT_CHECK(encoder.is_object() && !encoder.empty() &&
                encoder.size() <= std::numeric_limits<TokenId>::max(),
            "tokenizer file '", encoder_json_path, "': expected an object of at most 65535 ids");
  t.tokens_.resize(encoder.size());
  std::unordered_map<std::string, TokenId> ids;
  std::vector<bool> seen(encoder.size(), false);
  bool have_eot = false;
  for (const auto& [key, value] : encoder.items()) {
    GPT_CHECK(value.is_number_unsigned() && value.get<std::size_t>() < encoder.size(),
              "tokenizer file '", encoder_json_path, "': id of '", key, "' is not in [0, ",
              encoder.size(), ")");
    const auto id = value.get<TokenId>();
    GPT_CHECK(!seen[id], "tokenizer file '", encoder_json_path, "': id ", id, " used twice");
    seen[id] = true;
    if (key == "<|endoftext|>") {
      t.end_of_text_ = id;
      have_eot = true;
      t.tokens_[id] = key;
      continue;
    }
    std::string bytes = to_bytes(key, inverse, encoder_json_path);
    ids.emplace(bytes, id);
    t.tokens_[id] = std::move(bytes);
  }
  GPT_CHECK(have_eot, "tokenizer file '", encoder_json_path, "' has no <|endoftext|>");
  for (int b = 0; b < 256; ++b) {
    auto it = ids.find(std::string(1, static_cast<char>(b)));
    GPT_CHECK(it != ids.end(), "tokenizer file '", encoder_json_path, "' lacks the token of byte ",
              b);
    t.byte_token_[b] = it->second;
  }

  std::istringstream merges(read_file(vocab_bpe_path));
  std::string line;
  std::uint32_t rank = 0;
  std::size_t line_no = 0;
  while (std::getline(merges, line)) {
    ++line_no;
    if (line.empty() || line.starts_with("#version")) continue;
    const auto space = line.find(' ');
    GPT_CHECK(space != std::string::npos, "tokenizer file '", vocab_bpe_path, "' line ", line_no,
              ": expected two tokens, got '", line, "'");
    const std::string a = to_bytes(std::string_view(line).substr(0, space), inverse, vocab_bpe_path);
    const std::string b = to_bytes(std::string_view(line).substr(space + 1), inverse, vocab_bpe_path);
    auto ia = ids.find(a), ib = ids.find(b), ir = ids.find(a + b);
    GPT_CHECK(ia != ids.end() && ib != ids.end() && ir != ids.end(), "tokenizer file '",
              vocab_bpe_path, "' line ", line_no, ": merge '", line,
              "' uses or makes a token missing from ", encoder_json_path);
    t.merges_.emplace(pair_key(ia->second, ib->second), Merge{rank++, ir->second});
  }
  return t;
}

void Tokenizer::verify_gpt2_files(const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
  require_sha256(encoder_json_path, kEncoderJsonSha256, "tokenizer file");
  require_sha256(vocab_bpe_path, kVocabBpeSha256, "tokenizer file");
}

Tokenizer Tokenizer::load_gpt2(const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
  verify_gpt2_files(encoder_json_path, vocab_bpe_path);
  return load(encoder_json_path, vocab_bpe_path);
}

std::vector<TokenId> Tokenizer::bpe(std::string_view piece) const {
  std::vector<TokenId> word;
  word.reserve(piece.size());
  for (char c : piece) word.push_back(byte_token_[static_cast<unsigned char>(c)]);
  while (word.size() > 1) {
    // The adjacent pair with the lowest rank...
    std::uint32_t best_rank = std::numeric_limits<std::uint32_t>::max();
    std::uint32_t best_key = 0;
    TokenId best_result = 0;
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = merges_.find(pair_key(word[i], word[i + 1]));
      if (it != merges_.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank;
        best_key = it->first;
        best_result = it->second.result;
      }
    }
    if (best_rank == std::numeric_limits<std::uint32_t>::max()) break;
    // ... merged at every occurrence, left to right.
    std::size_t out = 0;
    for (std::size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && pair_key(word[i], word[i + 1]) == best_key) {
        word[out++] = best_result;
        i += 2;
      } else {
        word[out++] = word[i++];
      }
    }
    word.resize(out);
  }
  return word;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, EncodeCache& cache) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3);
  for (std::string_view piece : pretokenize(text)) {
    auto it = cache.find(std::string(piece));
    if (it == cache.end()) it = cache.emplace(std::string(piece), bpe(piece)).first;
    ids.insert(ids.end(), it->second.begin(), it->second.end());
  }
  return ids;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text) const {
  EncodeCache cache;
  return encode(text, cache);
}

const std::string& Tokenizer::token_bytes(TokenId id) const {
  GPT_CHECK(id < tokens_.size(), "token id ", id, " is not below the vocabulary size ",
            tokens_.size());
  return tokens_[id];
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
  std::string out;
  for (TokenId id : ids) out += token_bytes(id);
  return out;
}

}  // namespace gpt
