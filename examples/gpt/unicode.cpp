#include "examples/gpt/unicode.hpp"

#include <algorithm>
#include <array>

namespace gpt {
namespace {

struct Range {
  char32_t lo, hi;
};

// \p{L}: letters, by block (approximate outside Latin; see unicode.hpp).
constexpr std::array kLetters{
    Range{0x41, 0x5A},       Range{0x61, 0x7A},       Range{0xAA, 0xAA},
    Range{0xB5, 0xB5},       Range{0xBA, 0xBA},       Range{0xC0, 0xD6},
    Range{0xD8, 0xF6},       Range{0xF8, 0x2C1},      Range{0x2C6, 0x2D1},
    Range{0x2E0, 0x2E4},     Range{0x370, 0x374},     Range{0x376, 0x377},
    Range{0x37A, 0x37D},     Range{0x386, 0x386},     Range{0x388, 0x3F5},
    Range{0x3F7, 0x481},     Range{0x48A, 0x52F},     Range{0x531, 0x556},
    Range{0x561, 0x587},     Range{0x5D0, 0x5EA},     Range{0x620, 0x64A},
    Range{0x671, 0x6D3},     Range{0x904, 0x939},     Range{0xE01, 0xE30},
    Range{0x10A0, 0x10FF},   Range{0x1E00, 0x1FBC},   Range{0x1FC2, 0x1FCC},
    Range{0x1FD0, 0x1FDB},   Range{0x1FE0, 0x1FEC},   Range{0x1FF2, 0x1FFC},
    Range{0x3041, 0x3096},   Range{0x30A1, 0x30FA},   Range{0x3400, 0x4DBF},
    Range{0x4E00, 0x9FFF},   Range{0xAC00, 0xD7A3},   Range{0xF900, 0xFAFF},
    Range{0xFF21, 0xFF3A},   Range{0xFF41, 0xFF5A},   Range{0x20000, 0x2FFFF},
};

// \p{N}: decimal digits, letter numbers and other numbers (superscripts, fractions, ...).
constexpr std::array kNumbers{
    Range{0x30, 0x39},     Range{0xB2, 0xB3},     Range{0xB9, 0xB9},
    Range{0xBC, 0xBE},     Range{0x660, 0x669},   Range{0x6F0, 0x6F9},
    Range{0x966, 0x96F},   Range{0xE50, 0xE59},   Range{0x2070, 0x2070},
    Range{0x2074, 0x2079}, Range{0x2080, 0x2089}, Range{0x2150, 0x2189},
    Range{0x2460, 0x249B}, Range{0x2776, 0x2793}, Range{0xFF10, 0xFF19},
};

// White_Space.
constexpr std::array kSpaces{
    Range{0x09, 0x0D},     Range{0x20, 0x20},     Range{0x85, 0x85},
    Range{0xA0, 0xA0},     Range{0x1680, 0x1680}, Range{0x2000, 0x200A},
    Range{0x2028, 0x2029}, Range{0x202F, 0x202F}, Range{0x205F, 0x205F},
    Range{0x3000, 0x3000},
};

template <std::size_t N>
bool in(const std::array<Range, N>& ranges, char32_t cp) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                             [](char32_t v, const Range& r) { return v < r.lo; });
  return it != ranges.begin() && cp <= std::prev(it)->hi;
}

}  // namespace

CodePoint decode_utf8(std::string_view text, std::size_t pos) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  if (b0 < 0x80) return {b0, 1};
  int len = 0;
  char32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    cp = b0 & 0x07;
  } else {
    return {b0, 1};  // stray continuation byte or 0xF8..0xFF: Latin-1
  }
  if (pos + len > text.size()) return {b0, 1};
  for (int i = 1; i < len; ++i) {
    const auto b = static_cast<unsigned char>(text[pos + i]);
    if ((b & 0xC0) != 0x80) return {b0, 1};
    cp = (cp << 6) | (b & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are invalid: Latin-1 as well.
  static constexpr char32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {b0, 1};
  return {cp, len};
}

CharClass classify(char32_t cp) {
  if (cp < 0x80) {  // fast path: ASCII
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CharClass::letter;
    if (cp >= '0' && cp <= '9') return CharClass::number;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return CharClass::space;
    return CharClass::other;
  }
  if (in(kLetters, cp)) return CharClass::letter;
  if (in(kNumbers, cp)) return CharClass::number;
  if (in(kSpaces, cp)) return CharClass::space;
  return CharClass::other;
}

}  // namespace gpt
