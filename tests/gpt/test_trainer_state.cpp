// zoe-gpt's trainer state (DIR/trainer-<S>.json) as a damaged or hostile file: every problem is
// a zoe::Error naming the file and the field (a probe: a step of 2^62 was read as step 0, a
// duplicate "step" was last-wins, a type error named no field, a directory named like the file
// said "basic_filebuf::underflow error reading the file: Is a directory").
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "examples/gpt/checkpoint.hpp"
#include "zoe/error.hpp"

namespace gpt {
namespace {
namespace fs = std::filesystem;

class TrainerStateFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zoe-trainer-state-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    TrainerState s;
    s.step = 2;
    s.engine_step = 2;
    s.engine_lr = 0.001;
    s.losses = {10.5, 9.25};
    s.run = nlohmann::json::object({{"seed", 1}});
    save_trainer_state(dir_.string(), s);
    path_ = dir_ / "trainer-2.json";
    std::ifstream in(path_);
    text_.assign(std::istreambuf_iterator<char>(in), {});
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainerState load() const { return load_trainer_state(dir_.string(), 2, 0.001, nlohmann::json::object({{"seed", 1}})); }
  // Replaces the first `from` of the saved text with `to`.
  void edit(const std::string& from, const std::string& to) const {
    std::string t = text_;
    const auto at = t.find(from);
    ASSERT_NE(at, std::string::npos) << from << " not in " << t;
    t.replace(at, from.size(), to);
    std::ofstream(path_) << t;
  }
  void expect_error(const std::string& text) const {
    try {
      load();
      ADD_FAILURE() << "no error; wanted: " << text;
    } catch (const zoe::Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path_.string()), std::string::npos) << e.what();
    }
  }
  fs::path dir_, path_;
  std::string text_;
};

TEST_F(TrainerStateFile, TheSavedStateLoads) {
  const TrainerState s = load();
  EXPECT_EQ(s.step, 2);
  EXPECT_EQ(s.losses, (std::vector<double>{10.5, 9.25}));
}

TEST_F(TrainerStateFile, AStepPastIntIsRefusedNotWrapped) {
  edit("\"step\": 2", "\"step\": 4611686018427387904");
  expect_error("field 'step' must be an integer in [0, 2147483647], got 4611686018427387904");
}

TEST_F(TrainerStateFile, ATypeErrorNamesTheField) {
  edit("\"tokens\":", "\"tokens\": \"many\", \"x\":");
  expect_error("field 'tokens' must be a number, got \"many\"");
}

TEST_F(TrainerStateFile, ADuplicateKeyIsRefused) {
  edit("{", "{\"step\": 999999,");
  expect_error("duplicate key 'step'");
}

TEST_F(TrainerStateFile, ADirectoryNamedLikeTheFileIsRefused) {
  fs::remove(path_);
  fs::create_directories(path_);
  expect_error("is not a regular file");
}
}  // namespace
}  // namespace gpt
