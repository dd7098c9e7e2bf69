// Strict, path-aware reading of a nlohmann::json document into typed fields: the building
// block of Config::from_json. Every read records the key as known in its section; after all
// reads, reject_unknown_keys() reports any key nobody read, with a "did you mean".
// Problems are collected, not thrown: every read that fails records a ConfigError::Problem
// (its key is the JSON path, "zero_optimization.stage", and its reason holds the offending
// value as JSON) and leaves the field as it was, so one pass finds every problem of a file;
// problems() returns them in reading order. Not thread-safe (one parse, one thread).
#pragma once

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "zoe/error.hpp"

namespace zoe::config_detail {

using Json = nlohmann::json;

/// Whether a key accepts Hugging Face's "auto": the key's value then comes from the trainer
/// (JsonReader::set_auto), or, when the trainer gave none, "auto" is a problem.
enum class Auto { no, yes };

/// "a.b" for parent "a" and key "b"; "b" for the root.
std::string join_path(std::string_view parent, std::string_view key);

class JsonReader {
 public:
  /// `root` must outlive the reader. Throws ConfigError (key "") unless it is an object.
  explicit JsonReader(const Json& root);

  /// One JSON object (or an absent / null one, read as empty).
  class Section {
   public:
    /// JSON true/false.
    void boolean(std::string_view key, bool& out, Auto a = Auto::no);
    /// A JSON integer, or a double that is an exact integer (5e8), within the field's range.
    void integer(std::string_view key, int& out, Auto a = Auto::no);
    void integer(std::string_view key, std::int64_t& out, Auto a = Auto::no);
    /// integer(), or the string `word` exactly, read as `word_value` (zoe's own meaning of
    /// the word, resolved by zoe, not a trainer's value as Auto::yes).
    void integer_or_word(std::string_view key, std::int64_t& out, std::string_view word, std::int64_t word_value);
    /// Any finite JSON number.
    void number(std::string_view key, double& out, Auto a = Auto::no);
    /// A JSON array of exactly two finite numbers.
    void number_pair(std::string_view key, std::array<double, 2>& out, Auto a = Auto::no);
    void string(std::string_view key, std::string& out);
    /// A string matched case-insensitively against `names`; an error lists them.
    template <class E>
    void choice(std::string_view key, E& out, std::initializer_list<std::pair<std::string_view, E>> names);
    /// A nested object (absent or null: an empty section).
    Section section(std::string_view key);
    /// A DeepSpeed key zoe does not implement: its presence is an error saying so and why.
    void unsupported(std::string_view key, std::string_view why);
    /// A DeepSpeed feature zoe does not implement, given as an object with "enabled": accepted
    /// (its other members unread: DeepSpeed ignores them too) when "enabled" is false; refused
    /// with `why` otherwise (enabled, "enabled" absent, or not an object).
    void disabled_only(std::string_view key, std::string_view why);
    /// Marks `key` known without reading it or its members (whose problems another one covers).
    void skip(std::string_view key) { find(key); }
    /// Records a problem at this section's `key` (for checks the typed reads do not cover).
    void problem(std::string_view key, std::string reason);
    /// A DeepSpeed key accepted only with the value that is zoe's fixed behaviour.
    void fixed(std::string_view key, const Json& only_value, std::string_view why);
    bool has(std::string_view key) const;
    std::string path(std::string_view key) const { return join_path(path_, key); }

   private:
    friend class JsonReader;
    Section(JsonReader* reader, std::size_t index) : reader_(reader), index_(index) {}
    const Json* find(std::string_view key);  // marks key known; nullptr when absent
    // The value to read for `key`: the file's, or for "auto" the trainer's; nullptr when absent.
    // Throws ConfigError for "auto" where not accepted or not given by the trainer.
    const Json* value(std::string_view key, Auto a);
    // Runs `read`, recording a ConfigError it throws as a problem instead.
    template <class F>
    void guarded(F&& read);
    std::string choice_error(std::string_view key, const Json& v, const std::vector<std::string>& names) const;
    JsonReader* reader_;
    std::size_t index_;
    std::string path_;
  };

  Section root();
  /// The trainer's value for "auto" at `path`, and the name to give when it is missing (an
  /// AutoValues field). `value` null: no value given.
  void set_auto(std::string path, std::string field, std::optional<Json> value) {
    autos_.push_back({std::move(path), std::move(field), std::move(value)});
  }
  /// Records a problem for every key, in document order (sections in reading order), that no
  /// Section call named; suggests a near key of the same section or the same key elsewhere.
  void reject_unknown_keys();
  /// The problems recorded so far, in the order found.
  const std::vector<ConfigError::Problem>& problems() const { return problems_; }
  void add_problem(std::string key, std::string reason) { problems_.push_back({std::move(key), std::move(reason)}); }

 private:
  struct Record {
    std::string path;
    const Json* object;  // nullptr for an absent / null section
    std::vector<std::string> known;
  };
  std::deque<Record> records_;
  std::vector<ConfigError::Problem> problems_;
  struct AutoFill {
    std::string path, field;
    std::optional<Json> value;
  };
  std::vector<AutoFill> autos_;
};

template <class F>
void JsonReader::Section::guarded(F&& read) {
  try {
    read();
  } catch (const ConfigError& e) {
    for (const auto& p : e.problems()) reader_->add_problem(p.key, p.reason);
  }
}

template <class E>
void JsonReader::Section::choice(std::string_view key, E& out,
                                 std::initializer_list<std::pair<std::string_view, E>> names) {
  const Json* v = find(key);
  if (!v) return;
  std::vector<std::string> all;
  for (const auto& [name, value] : names) all.emplace_back(name);
  if (v->is_string()) {
    const std::string& s = v->get_ref<const std::string&>();
    for (const auto& [name, value] : names) {
      if (s.size() == name.size() &&
          std::equal(s.begin(), s.end(), name.begin(), [](char a, char b) {
            return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
          })) {
        out = value;
        return;
      }
    }
  }
  reader_->add_problem(path(key), choice_error(key, *v, all));
}

}  // namespace zoe::config_detail
