#include "examples/gpt/pretokenize.hpp"

#include <cstdint>

#include "examples/gpt/unicode.hpp"

namespace gpt {
namespace {

struct Char {
  std::uint32_t offset;  // byte offset in the text
  char32_t cp;
  CharClass cls;
};

// Length in characters of the contraction ('s 't 're 've 'm 'll 'd) at i, or 0.
std::size_t contraction(const std::vector<Char>& c, std::size_t i) {
  if (c[i].cp != U'\'' || i + 1 >= c.size()) return 0;
  const char32_t a = c[i + 1].cp;
  if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
  if (i + 2 >= c.size()) return 0;
  const char32_t b = c[i + 2].cp;
  if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
  return 0;
}

std::size_t run_of(const std::vector<Char>& c, std::size_t i, CharClass cls) {
  while (i < c.size() && c[i].cls == cls) ++i;
  return i;
}

// End (exclusive, in characters) of the piece starting at i.
std::size_t piece_end(const std::vector<Char>& c, std::size_t i) {
  const std::size_t n = c.size();
  if (std::size_t k = contraction(c, i)) return i + k;
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional single U+0020, then a run.
  const bool space_prefix = c[i].cp == U' ' && i + 1 < n && c[i + 1].cls != CharClass::space;
  const std::size_t start = space_prefix ? i + 1 : i;
  if (c[start].cls != CharClass::space) return run_of(c, start, c[start].cls);
  // '\s+(?!\S)': the white-space run, minus its last character when a non-space follows
  // (that character then prefixes the next piece); a lone space before a non-space is '\s+'.
  const std::size_t end = run_of(c, i, CharClass::space);
  if (end == n) return end;
  return end - i >= 2 ? end - 1 : end;
}

}  // namespace

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<Char> chars;
  chars.reserve(text.size());
  for (std::size_t pos = 0; pos < text.size();) {
    const CodePoint cp = decode_utf8(text, pos);
    chars.push_back({static_cast<std::uint32_t>(pos), cp.value, classify(cp.value)});
    pos += cp.length;
  }
  std::vector<std::string_view> pieces;
  for (std::size_t i = 0; i < chars.size();) {
    const std::size_t j = piece_end(chars, i);
    const std::size_t begin = chars[i].offset;
    const std::size_t end = j < chars.size() ? chars[j].offset : text.size();
    pieces.push_back(text.substr(begin, end - begin));
    i = j;
  }
  return pieces;
}

}  // namespace gpt
