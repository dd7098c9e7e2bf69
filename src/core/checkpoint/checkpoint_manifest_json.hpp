// manifest.json's text as a JSON document, parsed strictly, and its values as error messages
// quote them. nlohmann's parser keeps the last of a repeated key, so {"step": 2, "step": 0}
// would read as step 0 with a checksum recomputed over that; the manifest's parse refuses it
// as the configuration's does (src/config/strict_parse.hpp, which core may not use: the
// dependency rule in docs/architecture.md), here through nlohmann's parser callback.
//
// Thread-safety: pure functions. Errors: as each says.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace zoe::ckpt {

/// Parses `text` (the file `path`) as one JSON document. Throws CorruptionError "'<path>' is
/// not valid JSON (truncated or corrupt): ..." for a syntax error, and "'<path>': field
/// 'manifest.groups[0].params[1].dtype': duplicate key ..." naming the repeated key's path.
nlohmann::json parse_manifest_json(std::string_view text, const std::string& path);

/// A value as an error message quotes it: its compact JSON, cut to about 64 characters with
/// the full length said ("\"xxxx...\" (100000 characters)"), never more whatever its size.
std::string shown(const nlohmann::json& value);

}  // namespace zoe::ckpt
