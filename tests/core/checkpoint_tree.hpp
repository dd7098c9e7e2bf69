// A directory tree's every file and its bytes, to assert that a refused command changed
// nothing on disk (tests of zoe-ckpt's refusals). Not thread-safe.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace zoe::test {

/// Relative path -> content of every regular file under `root` ("<dir>" for a directory;
/// `root` itself a file: its content under ""). Empty when `root` does not exist.
inline std::map<std::string, std::string> tree_of(const std::string& root) {
  namespace fs = std::filesystem;
  std::map<std::string, std::string> out;
  auto content = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  if (fs::is_regular_file(root)) out[""] = content(root);
  if (!fs::is_directory(root)) return out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const std::string rel = fs::relative(e.path(), root).string();
    out[rel] = e.is_directory() ? std::string("<dir>") : content(e.path());
  }
  return out;
}

}  // namespace zoe::test
