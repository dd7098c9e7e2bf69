#include "src/config/strict_parse.hpp"

#include <cstdio>
#include <vector>

#include "src/common/check.hpp"
#include "src/common/json_path.hpp"
#include "src/common/quote.hpp"
#include "src/config/json_reader.hpp"

namespace zoe::config_detail {
namespace {
using Json = nlohmann::json;

// A validating SAX pass in front of the DOM parse: it tracks the path of the value being read
// so that each refusal can name it. nlohmann's SAX parser is iterative, so a deep document
// reaches start_object / start_array here without recursion and is refused at kMaxDepth.
class StrictSax {
 public:
  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(Json::number_integer_t) { return value(); }
  bool number_unsigned(Json::number_unsigned_t) { return value(); }
  bool number_float(Json::number_float_t, const Json::string_t&) { return value(); }
  bool string(Json::string_t&) { return value(); }
  bool binary(Json::binary_t&) { return value(); }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(Json::string_t& k) {
    if (!path_.key(k))
      ZOE_THROW_CONFIG(path(), "duplicate key: it appears more than once in the same object (JSON keys must be "
                               "unique; a parser would silently keep one of the values)");
    return true;
  }
  bool parse_error(std::size_t position, const std::string& last_token, const nlohmann::detail::exception& e) {
    if (e.id == 406)  // out_of_range.406: a number beyond a double's range
      ZOE_THROW_CONFIG(path(), "number ", detail::excerpt(last_token), " is outside the range of a double");
    ZOE_THROW_CONFIG("", "not valid JSON at byte ", position, " (near ", detail::excerpt(last_token), "): ",
                     detail::excerpt(without_prefix(e.what()), 160));
  }

 private:
  bool value() {
    path_.value();
    return true;
  }
  bool open(bool object) {
    if (static_cast<int>(path_.depth()) >= kMaxDepth)
      ZOE_THROW_CONFIG(path(), "nested deeper than ", kMaxDepth, " levels of objects and arrays");
    path_.open(object);
    return true;
  }
  bool close() {
    path_.close();
    return true;
  }
  // The path of the value being read: keys joined by '.', array elements as [i]; cut to
  // 120 characters (a hostile document's path may be 64 levels of long keys).
  std::string path() const {
    return detail::excerpt(path_.str([](const std::string& p, const std::string& k) { return join_path(p, detail::excerpt(k, 48)); }), 120);
  }
  // nlohmann's what() starts with "[json.exception.parse_error.101] parse error at line 1, ...".
  static std::string without_prefix(const char* what) {
    std::string s(what);
    if (auto close = s.find("] "); s.rfind("[json.exception.", 0) == 0 && close != std::string::npos)
      s.erase(0, close + 2);
    return s;
  }

  JsonPath path_;
};
}  // namespace

Json parse_strict(std::string_view text) {
  StrictSax sax;
  Json::sax_parse(text.begin(), text.end(), &sax);
  // The text is valid and within the limits: the DOM parse cannot fail now.
  return Json::parse(text.begin(), text.end());
}

}  // namespace zoe::config_detail
