// "did you mean 'x'?" for misspelt configuration keys.
// Pure functions on strings; thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zoe::config_detail {

/// Optimal-string-alignment distance (Levenshtein plus adjacent transpositions, each edit
/// costs 1), compared case-insensitively (ASCII). Damerau 1964, Levenshtein 1966.
std::size_t edit_distance(std::string_view a, std::string_view b);

/// The candidate nearest to `word` if it is a near miss: an edit distance of at most
/// 1 + |word| / 5 (capped at 3), or one name containing the other when the shorter has at
/// least 6 characters (e.g. "prefetch_bucket_size" -> "stage3_prefetch_bucket_size").
/// Ties go to the earlier candidate. nullopt when nothing is near.
std::optional<std::string> nearest(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace zoe::config_detail
