#include "src/core/names.hpp"

#include <cstdio>
#include <string>

#include "src/common/check.hpp"
#include "src/common/quote.hpp"

namespace zoe::core {
namespace {
const char* kind_name(NameKind kind) {
  switch (kind) {
    case NameKind::parameter: return "parameter";
    case NameKind::module: return "module";
    case NameKind::param_group: return "param group";
  }
  return "?";
}
// A byte as the messages show it: 0xff.
std::string byte_at(std::string_view text, std::size_t i) {
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(text[i]));
  return byte;
}
constexpr const char* kRule =
    "; names must be non-empty UTF-8 without NUL bytes (they become checkpoint and safetensors keys)";
}  // namespace

void check_name(NameKind kind, std::size_t index, std::string_view name) {
  const char* what = kind_name(kind);
  ZOE_CHECK_USAGE(!name.empty(), what, " ", index, ": the name is empty", kRule);
  if (const std::size_t nul = name.find('\0'); nul != std::string_view::npos)
    ZOE_THROW(UsageError, what, " ", index, ": the name ", detail::quoted(name), " has a NUL byte at byte ", nul, kRule);
  if (const std::size_t bad = detail::invalid_utf8_at(name); bad != std::string_view::npos)
    ZOE_THROW(UsageError, what, " ", index, ": the name ", detail::quoted(name), " is not valid UTF-8 (byte ", bad,
              " is ", byte_at(name, bad), ")", kRule);
}

void check_utf8(const char* what, std::string_view text) {
  if (const std::size_t bad = detail::invalid_utf8_at(text); bad != std::string_view::npos)
    ZOE_THROW(UsageError, what, " ", detail::quoted(text), " is not valid UTF-8 (byte ", bad, " is ", byte_at(text, bad),
              "); it is stored as JSON text");
}

}  // namespace zoe::core
