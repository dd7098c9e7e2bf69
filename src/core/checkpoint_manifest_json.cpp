#include "src/core/checkpoint_manifest_json.hpp"

#include <set>
#include <vector>

#include "src/common/check.hpp"

namespace zoe::ckpt {
namespace {
using nlohmann::json;
constexpr std::size_t kShownChars = 64;
// A cut may split a UTF-8 sequence: dump it as U+FFFD rather than throw.
constexpr auto kReplace = json::error_handler_t::replace;

// The path of the value being parsed, and the keys seen in each open object.
class KeyTracker {
 public:
  explicit KeyTracker(const std::string& path) : path_(path) {}

  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: frames_.push_back(Frame{true, {}, 0, {}}); break;
      case json::parse_event_t::array_start: frames_.push_back(Frame{false, {}, 0, {}}); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames_.pop_back();
        next();
        break;
      case json::parse_event_t::key: {
        Frame& f = frames_.back();
        f.key = parsed.get<std::string>();
        if (!f.keys.insert(f.key).second)
          ZOE_THROW(CorruptionError, "'", path_, "': field '", where(),
                    "': duplicate key (it appears more than once in one object; a parser would keep one of the "
                    "values silently): the file was edited or is corrupt");
        break;
      }
      case json::parse_event_t::value: next(); break;
    }
    return true;
  }

 private:
  struct Frame {
    bool object;
    std::string key;             // object: the key being read
    std::size_t index = 0;       // array: the element being read
    std::set<std::string> keys;  // object: keys seen
  };
  void next() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
  }
  std::string where() const {
    std::string p;
    for (const Frame& f : frames_) {
      if (f.object && f.keys.empty()) break;
      if (f.object) {
        if (!p.empty()) p += '.';
        p += f.key;
      } else {
        p += '[';
        p += std::to_string(f.index);
        p += ']';
      }
    }
    return p.size() > 160 ? p.substr(0, 160) + "..." : p;
  }

  const std::string& path_;
  std::vector<Frame> frames_;
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
