// Parsing a configuration's text into a nlohmann::json document, refusing what JSON parsers
// let through but a configuration must not contain: keys repeated in one object (nlohmann keeps
// the last, so {"stage": 0, "stage": 3} would run ZeRO-3 silently), nesting deeper than
// kMaxDepth (a hostile document 100,000 levels deep would overflow the stack when a message
// quotes it), and numbers outside a double's range (1e999). Each refusal is a ConfigError
// whose key() is the JSON path where it happened ("zero_optimization.stage", "a.b[3]").
// Thread-safe (no shared state).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace zoe::config_detail {

/// The deepest nesting of objects and arrays a configuration may have; DeepSpeed's deepest
/// key is 3 levels down, so 64 leaves room for any real file.
inline constexpr int kMaxDepth = 64;

/// Parses `text` as one JSON document. Throws ConfigError: key "" with "not valid JSON: ..."
/// for a syntax error (its position and a short excerpt of the text there); the path of the
/// offending key for a duplicate key, a nesting deeper than kMaxDepth, or a number that
/// overflows a double.
nlohmann::json parse_strict(std::string_view text);

}  // namespace zoe::config_detail
