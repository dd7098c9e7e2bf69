// The real DeepSpeed configs of tests/config/real (SOURCES names each file's origin) and a
// tally of how a reader takes them: how many it accepts and, for the rest, every problem of
// every file (ConfigError::problems(): key and reason), counted once per file, by frequency.
// Used by tests/config/test_real_configs.cpp (as zoe-estimate reads) and
// tests/gpt/test_real_configs_gpt.cpp (as zoe-gpt --config reads).
#pragma once

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "zoe/error.hpp"

namespace zoe::test {

/// Every *.json under `dir`, sorted by name.
inline std::vector<std::string> real_configs(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

struct ConfigTally {
  int files = 0, accepted = 0;
  std::map<std::string, int> blockers;       // "key: reason" -> files it blocks
  std::map<std::string, int> blocked_alone;  // files blocked by this one problem only

  /// Runs `read` for one file: accepted if it returns, else its ConfigError's problems are
  /// counted (another exception counts as one problem under its message).
  void read(const std::function<void()>& read) {
    ++files;
    std::set<std::string> problems;
    try {
      read();
      ++accepted;
      return;
    } catch (const ConfigError& e) {
      for (const ConfigError::Problem& p : e.problems()) problems.insert(p.key + ": " + shorten(p.reason));
    } catch (const Error& e) {
      problems.insert(shorten(e.message()));
    } catch (const std::exception& e) {
      problems.insert(shorten(e.what()));
    }
    for (const std::string& p : problems) ++blockers[p];
    if (problems.size() == 1) ++blocked_alone[*problems.begin()];
  }

  /// "accepted A of F" then one line per problem, most frequent first: count, files it alone
  /// blocks, the problem.
  std::string report(const std::string& reader) const {
    std::ostringstream o;
    o << reader << ": accepted " << accepted << " of " << files << " real DeepSpeed configs\n";
    std::vector<std::pair<int, std::string>> sorted;
    for (const auto& [p, n] : blockers) sorted.push_back({-n, p});
    std::sort(sorted.begin(), sorted.end());
    o << "  files  alone  problem\n";
    for (const auto& [n, p] : sorted) {
      auto alone = blocked_alone.find(p);
      o << "  " << -n << "\t " << (alone == blocked_alone.end() ? 0 : alone->second) << "\t" << p << "\n";
    }
    return o.str();
  }

 private:
  // The reason without the values, the file name and the "did you mean", cut at 90
  // characters: the same refusal of different values reads as one line.
  static std::string shorten(const std::string& reason) {
    std::string r = reason;
    for (const char* open : {" (in '", " (value ", "; did you mean"}) {
      for (auto at = r.find(open); at != std::string::npos; at = r.find(open)) {
        const bool paren = open[1] == '(';
        // A value may hold parentheses of its own: cut to the matching close.
        std::size_t end = at + 1, depth = 0;
        if (paren) {
          for (; end < r.size(); ++end) {
            if (r[end] == '(') ++depth;
            if (r[end] == ')' && --depth == 0) break;
          }
          r.erase(at, end + 1 - at);
        } else {
          r.erase(at);
        }
      }
    }
    if (r.size() > 90) r = r.substr(0, 90) + "...";
    return r;
  }
};

}  // namespace zoe::test
