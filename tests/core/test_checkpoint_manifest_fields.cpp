// The manifest's parse checks what the writer guarantees, not only types: a parameter's
// `dtype` and `ranks` (derived from its group's ranges), `lr` finite >= 0, `step` =
// step_calls - skipped_steps, and no key twice in one object. Each edit below comes with its
// checksum recomputed (a deliberate edit, or a buggy writer) and is a CorruptionError naming
// the field and the value (cut to a short excerpt).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/crc32c.hpp"
#include "src/core/checkpoint/checkpoint_manifest.hpp"
#include "tests/core/checkpoint_runs.hpp"

using namespace zoe;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class ManifestFields : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = test::temp_dir("ckpt-manifest-fields");
    Config c = test::checkpoint_config(2, OffloadDevice::none, dir);
    c.zoe.small_module_threshold = 0;  // a group per module: the edits below address the second group
    test::checkpoint_run(c, 2, 0, 2, "", dir + "/ckpt");
    std::ifstream in(dir + "/ckpt/manifest.json", std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    text_ = new std::string(text.str());
    fs::remove_all(dir);
  }
  static void TearDownTestSuite() { delete text_; }

  // The manifest's text after `edit` of its inner object, with the checksum recomputed.
  static std::string edited(const std::function<void(json&)>& edit) {
    json outer = json::parse(*text_);
    edit(outer["manifest"]);
    const std::string inner = outer["manifest"].dump();
    outer["crc32c"] = ckpt::crc_hex(io::crc32c(inner.data(), inner.size()));
    return outer.dump(1);
  }
  // The message of the CorruptionError parsing `text` throws ("" if none, or another error).
  static std::string refusal(const std::string& text) {
    try {
      ckpt::parse_manifest(text, "m.json");
    } catch (const CorruptionError& e) {
      return e.message();
    } catch (const Error& e) {
      return "not a CorruptionError: " + e.message();
    }
    return "";
  }
  static void expect_refused(const std::function<void(json&)>& edit, const std::string& field,
                             const std::string& value) {
    const std::string msg = refusal(edited(edit));
    EXPECT_NE(msg.find("field '" + field + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(value), std::string::npos) << "'" << value << "' not in: " << msg;
    EXPECT_LT(msg.size(), 600u) << msg;
  }
  static std::string* text_;
};
std::string* ManifestFields::text_ = nullptr;

const std::string kP1 = "manifest.groups[0].params[1]";

TEST_F(ManifestFields, TheSavedManifestAndAnUnchangedRewriteParse) {
  EXPECT_EQ(refusal(*text_), "");
  EXPECT_EQ(refusal(edited([](json&) {})), "");
}

TEST_F(ManifestFields, ParamDtypeIsTheStoredOne) {
  auto dtype = [](json v) { return [v](json& m) { m["groups"][0]["params"][1]["dtype"] = v; }; };
  expect_refused(dtype("xxx"), kP1 + ".dtype", "expected \"fp32\"");
  expect_refused(dtype("xxx"), kP1 + ".dtype", "got \"xxx\"");
  expect_refused(dtype(-1), kP1 + ".dtype", "got -1");
  expect_refused(dtype(nullptr), kP1 + ".dtype", "got null");
  expect_refused(dtype(json::array()), kP1 + ".dtype", "got []");
  expect_refused(dtype("bf16"), kP1 + ".dtype", "got \"bf16\"");  // a known name, not this one's
  expect_refused(dtype(std::string(100000, 'x')), kP1 + ".dtype", "(100000 characters)");
  expect_refused([](json& m) { m["groups"][0]["params"][1].erase("dtype"); }, kP1 + ".dtype", "missing");
}

TEST_F(ManifestFields, ParamRanksAreThePiecesOfTheGroupsRanges) {
  auto ranks = [](json v) { return [v](json& m) { m["groups"][0]["params"][1]["ranks"] = v; }; };
  expect_refused(ranks(nullptr), kP1 + ".ranks", "expected an array, got null");
  expect_refused(ranks(json::array()), kP1 + ".ranks", "0 pieces, the group's ranges give");
  expect_refused(ranks(json::parse(R"([{"begin":-5,"end":9223372036854775807,"rank":77}])")), kP1 + ".ranks[0]",
                 R"({"begin":-5,"end":9223372036854775807,"rank":77})");
  // One piece more than the ranges give, and two swapped (out of rank order).
  expect_refused([](json& m) { auto& r = m["groups"][0]["params"][0]["ranks"]; r.push_back(r.back()); },
                 "manifest.groups[0].params[0].ranks[2]", "beyond the 2 pieces");
  expect_refused([](json& m) {
    auto& r = m["groups"][0]["params"][0]["ranks"];
    std::swap(r[0], r[1]);
  }, "manifest.groups[0].params[0].ranks[0]", "\"rank\":1");
}

TEST_F(ManifestFields, LrIsFiniteAndNotNegative) {
  expect_refused([](json& m) { m["lr"] = -1; }, "manifest.lr", "must be finite and >= 0, got -1");
  expect_refused([](json& m) { m["lr"] = -1e-30; }, "manifest.lr", "got -1e-30");
  expect_refused([](json& m) { m["lr"] = nullptr; }, "manifest.lr", "expected a number, got null");  // NaN's JSON
  EXPECT_EQ(refusal(edited([](json& m) { m["lr"] = 0; })), "");  // a warmup's first lr
}

TEST_F(ManifestFields, StepIsStepCallsMinusSkippedSteps) {
  expect_refused([](json& m) { m["step"] = 0; }, "manifest.step", "0, but step_calls 2 - skipped_steps 0 = 2");
  expect_refused([](json& m) { m["skipped_steps"] = 1; }, "manifest.step", "2, but step_calls 2 - skipped_steps 1 = 1");
  EXPECT_EQ(refusal(edited([](json& m) {
              m["step_calls"] = 5;
              m["skipped_steps"] = 3;
            })),
            "");
}

// A repeated key: the checksum is over what nlohmann keeps (the last), so without the check the
// first value would be read silently as absent.
TEST_F(ManifestFields, DuplicateKeysAreRefusedNamingThePath) {
  const std::string text = json::parse(*text_).dump();
  const std::string at_top = "\"manifest\":{";
  std::string top = text;
  top.insert(top.find(at_top) + at_top.size(), "\"step\":0,");
  EXPECT_EQ(json::parse(top)["manifest"]["step"], 2);  // what a plain parse reads: the checksum matches
  std::string msg = refusal(top);
  EXPECT_NE(msg.find("field 'manifest.step': duplicate key"), std::string::npos) << msg;

  const std::string name = json::parse(text)["manifest"]["groups"][0]["params"][1]["name"];
  const std::string param = "{\"dtype\":\"fp32\",\"name\":" + json(name).dump();
  ASSERT_NE(text.find(param), std::string::npos) << text.substr(0, 400);
  std::string deep = text;
  deep.replace(deep.find(param), param.size(), "{\"dtype\":\"xxx\",\"dtype\":\"fp32\",\"name\":" + json(name).dump());
  msg = refusal(deep);
  EXPECT_NE(msg.find("field '" + kP1 + ".dtype': duplicate key"), std::string::npos) << msg;

  std::string outer = text;
  outer.insert(1, "\"format\":\"zoe-checkpoint\",");
  msg = refusal(outer);
  EXPECT_NE(msg.find("field 'format': duplicate key"), std::string::npos) << msg;
}

}  // namespace
