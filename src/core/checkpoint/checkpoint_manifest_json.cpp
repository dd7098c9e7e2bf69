#include "src/core/checkpoint/checkpoint_manifest_json.hpp"


#include "src/common/check.hpp"
#include "src/common/json_path.hpp"
#include "src/common/quote.hpp"

namespace zoe::ckpt {
namespace {
using nlohmann::json;

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
          ZOE_THROW(CorruptionError, detail::quoted_path(file_), ": field '", where(),
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
    return detail::excerpt(p, 160);
  }

  const std::string& file_;
  JsonPath path_;
};
}  // namespace

json parse_manifest_json(std::string_view text, const std::string& path) {
  try {
    return json::parse(text.begin(), text.end(), KeyTracker(path));
  } catch (const json::exception& e) {
    ZOE_THROW(CorruptionError, detail::quoted_path(path), " is not valid JSON (truncated or corrupt): ", e.what());
  }
}

std::string shown(const json& value) { return detail::json_excerpt(value); }

}  // namespace zoe::ckpt
