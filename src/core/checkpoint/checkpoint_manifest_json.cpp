#include "src/core/checkpoint/checkpoint_manifest_json.hpp"


#include "src/common/check.hpp"
#include "src/common/json_path.hpp"

namespace zoe::ckpt {
namespace {
using nlohmann::json;
constexpr std::size_t kShownChars = 64;
// A cut may split a UTF-8 sequence: dump it as U+FFFD rather than throw.
constexpr auto kReplace = json::error_handler_t::replace;

// The path of the value being parsed (JsonPath), fed by nlohmann's parser callback.
class KeyTracker {
 public:
  explicit KeyTracker(const std::string& path) : file_(path) {}

  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: path_.open(true); break;
      case json::parse_event_t::array_start: path_.open(false); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end: path_.close(); break;
      case json::parse_event_t::key:
        if (!path_.key(parsed.get<std::string>()))
          ZOE_THROW(CorruptionError, "'", file_, "': field '", where(),
                    "': duplicate key (it appears more than once in one object; a parser would keep one of the "
                    "values silently): the file was edited or is corrupt");
        break;
      case json::parse_event_t::value: path_.value(); break;
    }
    return true;
  }

 private:
  std::string where() const {
    const std::string p = path_.str([](std::string p, const std::string& k) {
      if (!p.empty()) p += '.';
      return p + k;
    });
    return p.size() > 160 ? p.substr(0, 160) + "..." : p;
  }

  const std::string& file_;
  JsonPath path_;
};
}  // namespace

json parse_manifest_json(std::string_view text, const std::string& path) {
  try {
    return json::parse(text.begin(), text.end(), KeyTracker(path));
  } catch (const json::exception& e) {
    ZOE_THROW(CorruptionError, "'", path, "' is not valid JSON (truncated or corrupt): ", e.what());
  }
}

std::string shown(const json& value) {
  if (value.is_string()) {
    const auto& s = value.get_ref<const std::string&>();
    if (s.size() > kShownChars)  // dump only the shown part: the value may be megabytes
      return json(s.substr(0, kShownChars)).dump(-1, ' ', false, kReplace).substr(0, kShownChars + 1) + "...\" (" +
             std::to_string(s.size()) + " characters)";
  }
  const std::string d = value.dump(-1, ' ', false, kReplace);
  return d.size() > kShownChars ? d.substr(0, kShownChars) + "... (" + std::to_string(d.size()) + " characters)" : d;
}

}  // namespace zoe::ckpt
