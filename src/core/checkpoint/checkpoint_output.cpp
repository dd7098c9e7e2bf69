#include "src/core/checkpoint/checkpoint_output.hpp"
#include "src/common/quote.hpp"

#include <filesystem>
#include <regex>

#include "src/common/check.hpp"
#include "src/core/checkpoint/checkpoint_dir.hpp"
#include "src/core/checkpoint/checkpoint_manifest.hpp"

namespace zoe::ckpt {
namespace fs = std::filesystem;

namespace {
// The path with symbolic links, "." and ".." resolved (its missing tail kept as written).
fs::path canonical_of(const std::string& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(fs::absolute(p), ec);
  if (ec) c = fs::absolute(p).lexically_normal();
  if (!c.has_filename()) c = c.parent_path();  // "a/b/" -> "a/b"
  return c;
}

// Whether `inner` is `outer` or below it (canonical paths).
bool within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i)
    if (i == inner.end() || *i != *o) return false;
  return true;
}

// A name a zoe save writes into a checkpoint directory.
bool zoe_name(const std::string& name) {
  static const std::regex rank(R"(rank(0|[1-9][0-9]{0,5})\.zoe)");
  return name == kManifestName || std::regex_match(name, rank);
}

enum class Found { absent, empty_dir, zoe_dir };

// What is at `path` (a reshard's OUT, OUT.tmp or OUT.old); refuses anything zoe did not write.
Found inspect_target(const std::string& path, const std::string& role) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return Found::absent;
  ZOE_CHECK_USAGE(fs::is_directory(st), "reshard: ", role, " ", detail::quoted_path(path),
                  " exists and is not a directory; zoe-ckpt never replaces a file: choose another output");
  bool any = false;
  for (auto it = fs::directory_iterator(path, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    ZOE_CHECK_USAGE(zoe_name(name) && it->is_regular_file(type_ec), "reshard: ", role, " ", detail::quoted_path(path),
                    " is a directory that is not a zoe checkpoint (it holds ", detail::quoted(name),
                    "); zoe-ckpt never removes what it did not write: choose another output or empty it");
    any = true;
  }
  ZOE_CHECK_USAGE(!ec, "reshard: cannot list ", role, " ", detail::quoted_path(path), ": ", ec.message());
  return any ? Found::zoe_dir : Found::empty_dir;
}

void check_apart(const fs::path& in, const fs::path& out, const std::string& in_name, const std::string& out_name,
                 const char* what) {
  ZOE_CHECK_USAGE(!within(out, in) && !within(in, out), what, ": the output '", out_name, "' and the checkpoint '",
                  in_name, "' overlap (", out == in ? "the same directory" : within(out, in) ? "the output is inside it"
                                                                                          : "the checkpoint is inside the output",
                  "): writing there would destroy the checkpoint being read; choose an output outside it");
}
}  // namespace

void check_reshard_output(const std::string& in, const std::string& out, Overwrite overwrite) {
  const fs::path cin = canonical_of(in);
  for (const std::string& p : {out, temp_dir_of(out), old_dir_of(out)}) check_apart(cin, canonical_of(p), in, p, "reshard");
  inspect_target(temp_dir_of(out), "the output's temporary directory");  // removed by the write: zoe's leftovers only
  for (const auto& [path, role] : {std::pair{out, "the output"}, std::pair{old_dir_of(out), "the output's previous copy"}}) {
    const Found f = inspect_target(path, role);
    ZOE_CHECK_USAGE(f != Found::zoe_dir || overwrite == Overwrite::replace_checkpoint, "reshard: ", role, " ", detail::quoted_path(path),
                    " is a zoe checkpoint already; pass --force (Overwrite::replace_checkpoint) to replace it");
  }
}

void check_export_output(const std::string& in, const std::string& out) {
  const fs::path cin = canonical_of(in);
  for (const std::string& p : {out, out + ".tmp"}) {
    const fs::path c = canonical_of(p);
    ZOE_CHECK_USAGE(!within(c, cin), "export: the output '", p, "' is ", c == cin ? "" : "inside ", "the checkpoint '",
                    in, "' being read; writing it would destroy the checkpoint: choose a file outside it");
  }
}

}  // namespace zoe::ckpt
