#include "tools/zoe-ckpt/locate.hpp"

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "src/common/check.hpp"
#include "src/common/quote.hpp"
#include "src/core/checkpoint/checkpoint_dir.hpp"

namespace zoe_ckpt {
namespace fs = std::filesystem;
using zoe::detail::quoted_path;

namespace {
// `dir` or `dir`.old, whichever a load reads, or "" when neither is complete.
std::string readable(const std::string& dir) {
  if (zoe::ckpt::is_complete(dir)) return dir;
  const std::string old = zoe::ckpt::old_dir_of(dir);
  return zoe::ckpt::is_complete(old) ? old : std::string();
}

std::string said(const std::string& dir, const std::string& from, std::ostream& notes) {
  if (from != dir)
    notes << "zoe-ckpt: " << quoted_path(dir) << " is incomplete (a save was interrupted); reading "
          << quoted_path(from) << " as a load would\n";
  return from;
}
}  // namespace

std::string directory_to_read(const std::string& dir, std::ostream& notes) {
  if (const std::string from = readable(dir); !from.empty()) return said(dir, from, notes);
  const std::string engine = (fs::path(dir) / "engine").string();
  if (const std::string from = readable(engine); !from.empty()) {
    notes << "zoe-ckpt: " << quoted_path(dir) << " is a trainer's checkpoint directory; reading its engine checkpoint "
          << quoted_path(engine) << "\n";
    return said(engine, from, notes);
  }
  // A checkpoint one level down: say where to point.
  std::string below;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_directory(type_ec) && !readable(it->path().string()).empty()) {
      below = it->path().string();
      break;
    }
  }
  if (!below.empty())
    ZOE_THROW_ERRNO(ENOENT, "no checkpoint at ", quoted_path(dir), " (no manifest.json there); ", quoted_path(below),
                    " holds one: point zoe-ckpt there");
  return zoe::ckpt::choose_for_load(dir);  // throws, naming dir and dir.old
}

}  // namespace zoe_ckpt
