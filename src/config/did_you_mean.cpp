#include "src/config/did_you_mean.hpp"

#include <algorithm>
#include <cctype>

namespace zoe::config_detail {
namespace {
char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

std::string lowered(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = lower(c);
  return out;
}
}  // namespace

std::size_t edit_distance(std::string_view a_in, std::string_view b_in) {
  const std::string a = lowered(a_in), b = lowered(b_in);
  const std::size_t n = a.size(), m = b.size();
  // d[i][j] = distance between a[0,i) and b[0,j); three rows suffice for the transposition.
  std::vector<std::size_t> prev2(m + 1), prev(m + 1), cur(m + 1);
  for (std::size_t j = 0; j <= m; ++j) prev[j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[m];
}

std::optional<std::string> nearest(std::string_view word, const std::vector<std::string>& candidates) {
  const std::size_t limit = std::min<std::size_t>(3, 1 + word.size() / 5);
  std::optional<std::string> best;
  std::size_t best_distance = limit + 1;
  for (const auto& c : candidates) {
    const std::size_t d = edit_distance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  if (best) return best;
  const std::string w = lowered(word);
  for (const auto& c : candidates) {
    const std::string lc = lowered(c);
    const bool w_shorter = w.size() <= lc.size();
    const std::string& shorter = w_shorter ? w : lc;
    const std::string& longer = w_shorter ? lc : w;
    if (shorter.size() >= 6 && longer.find(shorter) != std::string::npos) return c;
  }
  return std::nullopt;
}

}  // namespace zoe::config_detail
