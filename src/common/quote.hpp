// How an error message shows text a user gave (a parameter name, a path, a config value):
// escaped, so a NUL, a control character or a byte that is not UTF-8 neither cuts what() nor
// garbles a terminal, and shortened, so a megabyte name does not make a megabyte message.
// Used for every user string zoe quotes (the config reader, the checkpoint reader, the Engine's
// errors). Thread-safe (no state).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace zoe::detail {

/// How many characters `text` has: UTF-8 code points, each byte outside a valid sequence
/// counting as one.
std::size_t character_count(std::string_view text);

/// The byte offset of the first byte of `text` that is not part of a valid UTF-8 sequence
/// (overlong forms, surrogates and code points above U+10FFFF are invalid), or npos.
std::size_t invalid_utf8_at(std::string_view text);

/// `text` escaped and cut to its first `max_chars` characters: valid UTF-8 stays as it is,
/// except control characters (U+0000-U+001F, U+007F-U+009F), which read \xNN (\n, \t as such),
/// and each byte that is not valid UTF-8, which reads \xNN. When cut (never inside a
/// character), "... (N characters)" follows with the full count (character_count).
std::string excerpt(std::string_view text, std::size_t max_chars = 64);

/// `text` in single quotes as messages name things: "'<excerpt>'", when cut
/// "'<first max_chars characters>...' (N characters)".
std::string quoted(std::string_view text, std::size_t max_chars = 64);

/// A file or directory path as messages name it: quoted() with room for a long real path
/// (512 characters; PATH_MAX is 4096 bytes, a path of that length is someone's mistake).
inline std::string quoted_path(std::string_view path) { return detail::quoted(path, 512); }

/// A JSON value as an error message quotes it: its compact JSON text (invalid UTF-8 replaced by
/// U+FFFD), cut to about `max_chars` characters with the full length said
/// ("\"xxxx...\" (100000 characters)"). Dumps at most max_chars characters of a long string,
/// whatever its size.
std::string json_excerpt(const nlohmann::json& value, std::size_t max_chars = 64);

}  // namespace zoe::detail
