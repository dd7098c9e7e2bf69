#include "src/config/json_reader.hpp"

#include <cmath>
#include <limits>

#include "src/common/check.hpp"
#include "src/common/quote.hpp"
#include "src/config/did_you_mean.hpp"
#include "src/config/strict_parse.hpp"

namespace zoe::config_detail {
namespace {
// Values are quoted short: a hostile file may hold a 50 MB string.
std::string shown(const Json& v) { return detail::json_excerpt(v); }

const char* type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    case Json::value_t::number_float: return "a number";
    default: return "an integer";
  }
}

// "a string \"abc\"", "an array [1, 2]", "null" (its kind and its value, once when they are one word).
std::string described(const Json& v) {
  if (v.is_null()) return "null";
  return std::string(type_name(v)) + " " + shown(v);
}

// An integer in [lo, hi] from a JSON integer or an integral double (5e8).
std::int64_t read_integer(const std::string& path, const Json& v, std::int64_t lo, std::int64_t hi) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(hi))
      ZOE_THROW_CONFIG(path, "value ", shown(v), " is out of range (at most ", hi, ")");
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) {
    const auto i = v.get<std::int64_t>();
    if (i < lo || i > hi)
      ZOE_THROW_CONFIG(path, "value ", shown(v), " is out of range [", lo, ", ", hi, "]");
    return i;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d))
      ZOE_THROW_CONFIG(path, "expected an integer, got ", shown(v));
    // 2^63 is exactly representable; anything at or beyond it does not fit int64.
    if (d < static_cast<double>(lo) || d >= 9223372036854775808.0 || d > static_cast<double>(hi))
      ZOE_THROW_CONFIG(path, "value ", shown(v), " is out of range [", lo, ", ", hi, "]");
    return static_cast<std::int64_t>(d);
  }
  ZOE_THROW_CONFIG(path, "expected an integer, got ", described(v));
}
}  // namespace

std::string join_path(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  std::string p(parent);
  p += '.';
  p += key;
  return p;
}

JsonReader::JsonReader(const Json& root) {
  if (!root.is_object())
    ZOE_THROW_CONFIG("", "the configuration must be a JSON object, got ", type_name(root));
  records_.push_back({"", &root, {}});
}

JsonReader::Section JsonReader::root() {
  Section s(this, 0);
  return s;
}

const Json* JsonReader::Section::find(std::string_view key) {
  auto& rec = reader_->records_[index_];
  rec.known.emplace_back(key);
  if (!rec.object) return nullptr;
  auto it = rec.object->find(std::string(key));
  return it == rec.object->end() ? nullptr : &*it;
}

bool JsonReader::Section::has(std::string_view key) const {
  const auto& rec = reader_->records_[index_];
  return rec.object && rec.object->contains(std::string(key));
}

const Json* JsonReader::Section::value(std::string_view key, Auto a) {
  const Json* v = find(key);
  if (!v || !v->is_string() || v->get_ref<const std::string&>() != "auto") return v;
  if (a == Auto::no) ZOE_THROW_CONFIG(path(key), "\"auto\" is not accepted for this key (give a value)");
  const std::string p = path(key);
  for (const auto& f : reader_->autos_) {
    if (f.path != p) continue;
    if (!f.value)
      ZOE_THROW_CONFIG(p, "\"auto\" takes the trainer's value (Hugging Face's meaning) and none was given: set ",
                       "Config::AutoValues::", f.field, " for from_json, or write a value");
    return &*f.value;
  }
  ZOE_THROW_CONFIG(p, "\"auto\" has no trainer value for this key (give a value)");
}

void JsonReader::Section::boolean(std::string_view key, bool& out, Auto a) {
  guarded([&] {
    const Json* v = value(key, a);
    if (!v) return;
    if (!v->is_boolean()) ZOE_THROW_CONFIG(path(key), "expected true or false, got ", described(*v));
    out = v->get<bool>();
  });
}

void JsonReader::Section::integer(std::string_view key, int& out, Auto a) {
  guarded([&] {
    const Json* v = value(key, a);
    if (!v) return;
    out = static_cast<int>(read_integer(path(key), *v, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
  });
}

void JsonReader::Section::integer(std::string_view key, std::int64_t& out, Auto a) {
  guarded([&] {
    const Json* v = value(key, a);
    if (!v) return;
    out = read_integer(path(key), *v, std::numeric_limits<std::int64_t>::min(),
                       std::numeric_limits<std::int64_t>::max());
  });
}

void JsonReader::Section::integer_or_word(std::string_view key, std::int64_t& out, std::string_view word,
                                          std::int64_t word_value) {
  guarded([&] {
    const Json* v = find(key);
    if (!v) return;
    if (v->is_string()) {
      if (v->get_ref<const std::string&>() != word)
        ZOE_THROW_CONFIG(path(key), "expected an integer or \"", word, "\", got ", shown(*v));
      out = word_value;
      return;
    }
    out = read_integer(path(key), *v, std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max());
  });
}

void JsonReader::Section::number(std::string_view key, double& out, Auto a) {
  guarded([&] {
    const Json* v = value(key, a);
    if (!v) return;
    if (!v->is_number()) ZOE_THROW_CONFIG(path(key), "expected a number, got ", described(*v));
    out = v->get<double>();
  });
}

void JsonReader::Section::number_pair(std::string_view key, std::array<double, 2>& out, Auto a) {
  guarded([&] {
    const Json* v = value(key, a);
    if (!v) return;
    if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number() || !(*v)[1].is_number())
      ZOE_THROW_CONFIG(path(key), "expected an array of two numbers, got ", shown(*v));
    out = {(*v)[0].get<double>(), (*v)[1].get<double>()};
  });
}

void JsonReader::Section::string(std::string_view key, std::string& out) {
  guarded([&] {
    const Json* v = find(key);
    if (!v) return;
    if (!v->is_string()) ZOE_THROW_CONFIG(path(key), "expected a string, got ", described(*v));
    const auto& s = v->get_ref<const std::string&>();
    // A path or name with \u0000 would be cut short by every OS call that takes it.
    if (const auto nul = s.find('\0'); nul != std::string::npos)
      ZOE_THROW_CONFIG(path(key), "contains a NUL character (\\u0000) at offset ", nul, ": ", shown(*v));
    out = s;
  });
}

std::string JsonReader::Section::choice_error(std::string_view key, const Json& v,
                                              const std::vector<std::string>& names) const {
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : "|") + n;
  std::string msg = shown(v) + " is not one of " + list;
  if (v.is_string())
    if (auto near = nearest(v.get_ref<const std::string&>(), names)) msg += "; did you mean '" + *near + "'?";
  return msg;
}

JsonReader::Section JsonReader::Section::section(std::string_view key) {
  const Json* v = find(key);
  const std::string p = path(key);
  if (v && !v->is_null() && !v->is_object())
    reader_->add_problem(p, "expected an object, got " + described(*v));
  reader_->records_.push_back({p, (v && v->is_object()) ? v : nullptr, {}});
  Section s(reader_, reader_->records_.size() - 1);
  s.path_ = p;
  return s;
}

void JsonReader::Section::unsupported(std::string_view key, std::string_view why) {
  guarded([&] {
    const Json* v = find(key);
    if (v) ZOE_THROW_CONFIG(path(key), "DeepSpeed key not supported by zoe (value ", shown(*v), "): ", why);
  });
}

void JsonReader::Section::disabled_only(std::string_view key, std::string_view why) {
  guarded([&] {
    const Json* v = find(key);
    if (!v) return;
    if (v->is_object()) {
      // Absent "enabled" is DeepSpeed's default, false, for every such section.
      const auto enabled = v->find("enabled");
      if (enabled == v->end() || *enabled == false) return;
    }
    ZOE_THROW_CONFIG(path(key), "DeepSpeed key not supported by zoe (value ", shown(*v), "): ", why,
                     "; accepted only with \"enabled\": false (or no \"enabled\")");
  });
}

void JsonReader::Section::problem(std::string_view key, std::string reason) {
  reader_->add_problem(path(key), std::move(reason));
}

void JsonReader::Section::fixed(std::string_view key, const Json& only_value, std::string_view why) {
  guarded([&] {
    const Json* v = find(key);
    if (v && *v != only_value)
      ZOE_THROW_CONFIG(path(key), "zoe supports only ", shown(only_value), " here, got ", shown(*v), ": ", why);
  });
}

void JsonReader::reject_unknown_keys() {
  for (const auto& rec : records_) {
    if (!rec.object) continue;
    for (const auto& [key, value] : rec.object->items()) {
      if (std::find(rec.known.begin(), rec.known.end(), key) != rec.known.end()) continue;
      std::string hint;
      if (key.size() > 64) {
        // No real key is this long: no suggestion (and no quadratic edit distance on it).
      } else if (auto near = nearest(key, rec.known)) {
        hint = "; did you mean '" + *near + "'?";
      } else {
        for (const auto& other : records_) {
          for (const auto& k : other.known)
            if (edit_distance(k, key) == 0) hint = "; did you mean '" + join_path(other.path, k) + "'?";
          if (!hint.empty()) break;
        }
      }
      add_problem(join_path(rec.path, detail::excerpt(key, 48)), "unknown key (value " + shown(value) + ")" + hint);
    }
  }
}

}  // namespace zoe::config_detail
