#include "src/common/quote.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace zoe::detail {
namespace {

// Length of the valid UTF-8 sequence starting at text[i] (1-4), or 0 if text[i] starts none
// (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF). *cp: its code point.
std::size_t sequence_at(std::string_view text, std::size_t i, char32_t* cp) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  std::size_t n;
  char32_t v;
  char32_t min;
  if ((c & 0xe0) == 0xc0) {
    n = 2, v = c & 0x1f, min = 0x80;
  } else if ((c & 0xf0) == 0xe0) {
    n = 3, v = c & 0x0f, min = 0x800;
  } else if ((c & 0xf8) == 0xf0) {
    n = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xc0) != 0x80) return 0;
    v = (v << 6) | (b(k) & 0x3f);
  }
  if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
  *cp = v;
  return n;
}

void append_escaped_byte(std::string& out, unsigned char c) {
  if (c == '\n') {
    out += "\\n";
  } else if (c == '\t') {
    out += "\\t";
  } else {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", c);
    out += buf;
  }
}

// Appends the first `max_chars` characters of `text` escaped; returns whether all of it fit.
bool append_excerpt(std::string& out, std::string_view text, std::size_t max_chars) {
  std::size_t i = 0, shown = 0;
  for (; i < text.size() && shown < max_chars; ++shown) {
    char32_t cp = 0;
    const std::size_t n = sequence_at(text, i, &cp);
    if (n == 0) {
      append_escaped_byte(out, static_cast<unsigned char>(text[i]));
      i += 1;
    } else if (cp < 0x20 || cp == 0x7f) {
      append_escaped_byte(out, static_cast<unsigned char>(cp));
      i += 1;
    } else if (cp >= 0x80 && cp <= 0x9f) {  // C1 controls: two bytes, both shown as bytes
      append_escaped_byte(out, static_cast<unsigned char>(text[i]));
      append_escaped_byte(out, static_cast<unsigned char>(text[i + 1]));
      i += 2;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return i == text.size();
}

// Bytes of the first `max_chars` characters of `text`.
std::size_t prefix_bytes(std::string_view text, std::size_t max_chars) {
  std::size_t i = 0;
  for (std::size_t shown = 0; i < text.size() && shown < max_chars; ++shown) {
    char32_t cp = 0;
    const std::size_t n = sequence_at(text, i, &cp);
    i += n == 0 ? 1 : n;
  }
  return i;
}

std::string count_note(std::string_view text) {
  return " (" + std::to_string(character_count(text)) + " characters)";
}

}  // namespace

std::size_t character_count(std::string_view text) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < text.size(); ++count) {
    char32_t cp = 0;
    const std::size_t n = sequence_at(text, i, &cp);
    i += n == 0 ? 1 : n;
  }
  return count;
}

std::size_t invalid_utf8_at(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    const std::size_t n = sequence_at(text, i, &cp);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string excerpt(std::string_view text, std::size_t max_chars) {
  std::string out;
  if (!append_excerpt(out, text, max_chars)) out += "..." + count_note(text);
  return out;
}

std::string quoted(std::string_view text, std::size_t max_chars) {
  std::string out = "'";
  const bool whole = append_excerpt(out, text, max_chars);
  out += whole ? "'" : "...'" + count_note(text);
  return out;
}

std::string json_excerpt(const nlohmann::json& value, std::size_t max_chars) {
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
  if (value.is_string()) {
    const auto& s = value.get_ref<const std::string&>();
    const std::size_t shown = prefix_bytes(s, max_chars);
    if (shown < s.size()) {
      // Dump only the shown part (the value may be megabytes); the closing quote goes after
      // the "...", and the text is cut once and counted once.
      std::string dumped = nlohmann::json(s.substr(0, shown)).dump(-1, ' ', false, kReplace);
      dumped.pop_back();
      return dumped + "...\"" + count_note(s);
    }
    return nlohmann::json(s).dump(-1, ' ', false, kReplace);
  }
  // The config and manifest readers bound the depth, so dump() cannot recurse deeply.
  return excerpt(value.dump(-1, ' ', false, kReplace), max_chars);
}

}  // namespace zoe::detail
