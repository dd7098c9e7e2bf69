// Just enough Unicode for GPT-2's pre-tokenizer: UTF-8 decoding that never fails and a
// classification of code points into letters (\p{L}), numbers (\p{N}), white space (\s) and
// everything else.
//
// The classification is an approximation by block ranges, not the full Unicode database:
// ASCII, Latin-1, Latin Extended A/B/Additional, IPA, Greek, Cyrillic, Armenian, Hebrew, Arabic,
// Devanagari, Thai, Georgian, Kana, CJK, Hangul and full-width forms are classified exactly
// enough for text in those scripts; other code points count as "other". White space is Unicode's
// White_Space property (what Python's `regex` module matches with \s). Only the split points of
// rare non-Latin text depend on this; encode/decode round-trips every byte string regardless.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string_view>

namespace gpt {

enum class CharClass : unsigned char { letter, number, space, other };

/// One decoded code point and the bytes it spans.
struct CodePoint {
  char32_t value = 0;
  int length = 1;  // bytes, 1..4
};

/// Decodes the code point starting at byte `pos` (< text.size()). A byte that does not start a
/// valid UTF-8 sequence decodes as itself read as Latin-1 (U+0080..U+00FF), length 1, so Latin-1
/// text (two of the books have a few such bytes) classifies sensibly.
CodePoint decode_utf8(std::string_view text, std::size_t pos);

/// The class of a code point (see the file comment for the approximation).
CharClass classify(char32_t cp);

}  // namespace gpt
