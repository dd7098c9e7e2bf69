// GPT-2's pre-tokenizer, written by hand because std::regex has no \p{L}. It splits text into
// the pieces that GPT-2's regex (Radford et al. 2019, openai/gpt-2 src/encoder.py)
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// finds, with its leftmost-first alternation and backtracking reproduced exactly; letters,
// numbers and white space are classified as unicode.hpp documents.
// Thread-safety: pure function.
#pragma once

#include <string_view>
#include <vector>

namespace gpt {

/// Splits `text` (UTF-8; invalid bytes allowed) into consecutive pieces whose concatenation is
/// `text`. The views point into `text`.
std::vector<std::string_view> pretokenize(std::string_view text);

}  // namespace gpt
