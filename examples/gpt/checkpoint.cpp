#include "examples/gpt/checkpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "examples/gpt/error.hpp"

namespace gpt {
namespace fs = std::filesystem;
namespace {

constexpr int kStateVersion = 1;
constexpr const char* kPrefix = "trainer-";
constexpr const char* kSuffix = ".json";

fs::path state_path(const std::string& dir, int step) {
  return fs::path(dir) / (kPrefix + std::to_string(step) + kSuffix);
}

// The step of a file named trainer-<S>.json, or -1 for any other name.
int step_of(const fs::path& file) {
  const std::string name = file.filename().string();
  const std::size_t p = std::strlen(kPrefix), s = std::strlen(kSuffix);
  if (name.size() <= p + s || name.compare(0, p, kPrefix) != 0 ||
      name.compare(name.size() - s, s, kSuffix) != 0)
    return -1;
  const std::string digits = name.substr(p, name.size() - p - s);
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) return -1;
  return std::stoi(digits);
}

// JSON has no NaN: a missing validation loss is null.
nlohmann::json number_or_null(double v) { return std::isnan(v) ? nlohmann::json() : nlohmann::json(v); }
double number_or_nan(const nlohmann::json& j) {
  return j.is_null() ? std::numeric_limits<double>::quiet_NaN() : j.get<double>();
}

nlohmann::json to_json(const TrainerState& s) {
  return {{"version", kStateVersion},  {"step", s.step},
          {"engine_step", s.engine_step}, {"engine_lr", s.engine_lr},
          {"tokens", s.tokens},          {"elapsed_s", s.elapsed_s},
          {"first_loss", s.first_loss},  {"last_val_loss", number_or_null(s.last_val_loss)},
          {"losses", s.losses},          {"run", s.run}};
}

// Field `key` of the state in `file`: present and of its type, integers in [0, max] (a plain
// get<int> turned a step of 2^62 into 0), each error naming the file and the field.
const nlohmann::json& field(const nlohmann::json& j, const char* key, const fs::path& file) {
  GPT_CHECK(j.contains(key), "corrupt trainer state '", file.string(), "': no field '", key, "'");
  return j.at(key);
}
std::int64_t count_field(const nlohmann::json& j, const char* key, std::int64_t max, const fs::path& file) {
  const nlohmann::json& v = field(j, key, file);
  GPT_CHECK(v.is_number_integer() && (v.is_number_unsigned() ? v.get<std::uint64_t>() <= static_cast<std::uint64_t>(max)
                                                               : v.get<std::int64_t>() >= 0 && v.get<std::int64_t>() <= max),
            "corrupt trainer state '", file.string(), "': field '", key, "' must be an integer in [0, ", max, "], got ",
            v.dump().substr(0, 40));
  return v.get<std::int64_t>();
}
double number_field(const nlohmann::json& j, const char* key, const fs::path& file) {
  const nlohmann::json& v = field(j, key, file);
  GPT_CHECK(v.is_number(), "corrupt trainer state '", file.string(), "': field '", key, "' must be a number, got ",
            v.dump().substr(0, 40));
  return v.get<double>();
}

TrainerState from_json(const nlohmann::json& j, const fs::path& file) {
  GPT_CHECK(j.is_object() && j.value("version", 0) == kStateVersion, "'", file.string(),
            "' is not a zoe-gpt trainer state of version ", kStateVersion);
  TrainerState s;
  s.step = static_cast<int>(count_field(j, "step", std::numeric_limits<int>::max(), file));
  s.engine_step = count_field(j, "engine_step", std::numeric_limits<std::int64_t>::max(), file);
  s.engine_lr = number_field(j, "engine_lr", file);
  s.tokens = number_field(j, "tokens", file);
  s.elapsed_s = number_field(j, "elapsed_s", file);
  s.first_loss = number_field(j, "first_loss", file);
  const nlohmann::json& val = field(j, "last_val_loss", file);
  GPT_CHECK(val.is_null() || val.is_number(), "corrupt trainer state '", file.string(),
            "': field 'last_val_loss' must be a number or null, got ", val.dump().substr(0, 40));
  s.last_val_loss = number_or_nan(val);
  const nlohmann::json& losses = field(j, "losses", file);
  GPT_CHECK(losses.is_array() && std::all_of(losses.begin(), losses.end(), [](const auto& x) { return x.is_number(); }),
            "corrupt trainer state '", file.string(), "': field 'losses' must be an array of numbers");
  s.losses = losses.get<std::vector<double>>();
  s.run = field(j, "run", file);
  GPT_CHECK(s.run.is_object(), "corrupt trainer state '", file.string(), "': field 'run' must be an object");
  GPT_CHECK(s.losses.size() == static_cast<std::size_t>(s.step), "'", file.string(), "' holds ",
            s.losses.size(), " losses for step ", s.step);
  return s;
}

// nlohmann keeps the last of two equal keys; a trainer state with two "step"s is corrupt.
nlohmann::json parse_without_duplicate_keys(std::istream& in, const fs::path& file) {
  std::vector<std::vector<std::string>> keys;  // of each open object
  return nlohmann::json::parse(in, [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::object_start) keys.emplace_back();
    else if (event == nlohmann::json::parse_event_t::object_end) keys.pop_back();
    else if (event == nlohmann::json::parse_event_t::key) {
      const std::string& k = parsed.get_ref<const std::string&>();
      GPT_CHECK(std::find(keys.back().begin(), keys.back().end(), k) == keys.back().end(), "corrupt trainer state '",
                file.string(), "': duplicate key '", k.substr(0, 40), "'");
      keys.back().push_back(k);
    }
    return true;
  });
}

// Written, flushed to the disk, then renamed over `path`: readers see the old file or the new.
void write_file_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  GPT_CHECK(f, "cannot create '", tmp.string(), "': ", std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() &&
                  std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  const int err = errno;
  std::fclose(f);
  std::error_code ec;
  if (!ok) fs::remove(tmp, ec);  // a partial file helps nobody (a full disk: ENOSPC)
  GPT_CHECK(ok, "cannot write ", text.size(), " bytes to '", tmp.string(), "': ",
            std::strerror(err));
  fs::rename(tmp, path, ec);
  GPT_CHECK(!ec, "cannot rename '", tmp.string(), "' to '", path.string(), "': ", ec.message());
}

}  // namespace

std::string engine_checkpoint_dir(const std::string& dir) { return (fs::path(dir) / "engine").string(); }

void save_trainer_state(const std::string& dir, const TrainerState& state) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  GPT_CHECK(!ec, "cannot create the checkpoint directory '", dir, "': ", ec.message());
  write_file_atomically(state_path(dir, state.step), to_json(state).dump(1));
}

void remove_other_trainer_states(const std::string& dir, int keep_step) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int s = step_of(e.path());
    if (s >= 0 && s != keep_step) fs::remove(e.path(), ec);  // a leftover is harmless
  }
}

namespace {
// DIR's trainer files, newest first.
std::vector<fs::path> trainer_files(const std::string& dir) {
  GPT_CHECK(fs::is_directory(dir), "no checkpoint directory '", dir, "'");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (step_of(e.path()) >= 0) files.push_back(e.path());
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return step_of(a) > step_of(b); });
  return files;
}

TrainerState read_trainer_state(const fs::path& file) {
  GPT_CHECK(fs::is_regular_file(file), "trainer state '", file.string(), "' is not a regular file");
  std::ifstream in(file);
  GPT_CHECK(in, "cannot open '", file.string(), "'");
  nlohmann::json j;
  try {
    j = parse_without_duplicate_keys(in, file);
  } catch (const nlohmann::json::exception& e) {
    GPT_THROW("corrupt trainer state '", file.string(), "': ", e.what());
  }
  try {
    return from_json(j, file);
  } catch (const nlohmann::json::exception& e) {
    GPT_THROW("corrupt trainer state '", file.string(), "': ", e.what());
  }
}
}  // namespace

nlohmann::json saved_run_identity(const std::string& dir) {
  const std::vector<fs::path> files = trainer_files(dir);
  GPT_CHECK(!files.empty(), "checkpoint '", dir, "' has no trainer state (trainer-<step>.json)");
  return read_trainer_state(files.front()).run;
}

TrainerState load_trainer_state(const std::string& dir, std::int64_t engine_step, double engine_lr,
                                const nlohmann::json& run) {
  const std::vector<fs::path> files = trainer_files(dir);
  for (const fs::path& file : files) {
    TrainerState s = read_trainer_state(file);
    if (s.engine_step != engine_step || std::memcmp(&s.engine_lr, &engine_lr, sizeof(double)) != 0)
      continue;  // written before an engine save that did not complete
    for (const auto& [key, value] : run.items()) {
      const auto found = s.run.find(key);
      GPT_CHECK(found != s.run.end() && *found == value, "checkpoint '", dir, "' was written by a run with ",
                key, " = ", found == s.run.end() ? std::string("(missing)") : found->dump(),
                "; this run has ", key, " = ", value.dump());
    }
    return s;
  }
  GPT_THROW("checkpoint '", dir, "' has no trainer state (trainer-<step>.json) matching its engine files (",
            files.size(), " trainer files; engine at optimizer step ", engine_step, ")");
}

}  // namespace gpt
