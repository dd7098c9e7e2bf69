// The Engine at its edges:
//  - names (parameters, modules, param groups) are checked at registration: empty, NUL and
//    invalid UTF-8 are refused with a UsageError naming the kind and index, the name escaped;
//    every error that quotes a name or a path shows it escaped and shortened;
//  - only zoe's error types (include/zoe/error.hpp) leave a public call of engine.hpp and
//    safetensors.hpp, whatever library failed underneath (nlohmann::json, std::filesystem,
//    std::system_error, std::bad_alloc) and whatever a callback threw;
//  - what a gradient view holds at begin_backward (the ModuleTensors comment): a shared
//    parameter's earlier uses in the micro-batch, and at stages 0-1 the step's earlier
//    micro-batches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <system_error>
#include <typeinfo>
#include <vector>

#include "zoe/engine.hpp"
#include "zoe/safetensors.hpp"

using namespace zoe;
using namespace std::string_literals;
namespace fs = std::filesystem;

namespace {

Config small_config(int stage = 3) {
  Config c;
  c.zero_optimization.stage = stage;
  c.optimizer.lr = 1e-2;
  c.zero_optimization.stage3_param_persistence_threshold = 0;
  c.zoe.optimizer_threads = 1;
  c.zoe.comm_timeout_s = 5.0;
  return c;
}

RankContext one_rank() { return make_local_ranks(1, 5.0).front(); }

auto filled(float v) {
  return [v](std::int64_t, std::span<float> out) { std::fill(out.begin(), out.end(), v); };
}

// Runs `f`, which must throw; fails the test unless what it throws is a zoe::Error. Returns
// the message ("" when it did not throw or threw something else).
template <class F>
std::string zoe_error_of(const std::string& what, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": a non-zoe exception left the call (" << typeid(e).name() << "): " << e.what();
    return "";
  } catch (...) {
    ADD_FAILURE() << what << ": an exception that is not a std::exception left the call";
    return "";
  }
  ADD_FAILURE() << what << ": did not throw";
  return "";
}
template <class E, class F>
std::string expect_error(const std::string& what, F&& f) {
  std::string msg;
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception&) {
    msg = zoe_error_of(what, f);  // reports the type
    ADD_FAILURE() << what << ": expected " << typeid(E).name() << ", got: " << msg;
    return msg;
  }
  ADD_FAILURE() << what << ": did not throw";
  return "";
}

// A scratch directory removed at the end.
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("zoe_edges_" + std::to_string(::getpid()) + "_" +
                                               std::to_string(reinterpret_cast<std::uintptr_t>(this)));
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// One trained step of a two-module model: a, b (module "A"), c (module "B").
struct Small {
  Engine e;
  ParamId a, b, c;
  ModuleId ma, mb;
  explicit Small(const Config& cfg = small_config()) : e(cfg, one_rank()) {
    a = e.add_parameter("a", {4}, filled(0.5f));
    b = e.add_parameter("b", {3}, filled(-0.25f));
    c = e.add_parameter("c", {5}, filled(1.0f));
    ma = e.add_module("A", {a, b});
    mb = e.add_module("B", {c});
  }
  void train_step() {
    for (ModuleId m : {ma, mb}) {
      ForwardScope f(e, m);
    }
    for (ModuleId m : {mb, ma}) {
      BackwardScope bw(e, m);
      for (const TensorView& g : bw.tensors().grads)
        for (std::int64_t i = 0; i < g.numel(); ++i) g.as<float>()[i] += 0.125f;
    }
    e.step();
  }
};

}  // namespace

// ---------------------------------------------------------------------------------- names

TEST(Names, BadParameterNamesAreRefusedAtRegistration) {
  Engine e(small_config(), one_rank());
  e.add_parameter("fine", {2}, filled(0.0f));
  std::string m = expect_error<UsageError>("non-UTF-8", [&] { e.add_parameter("bad\xff\xfe", {2}, filled(0.0f)); });
  EXPECT_NE(m.find("parameter 1: the name 'bad\\xff\\xfe' is not valid UTF-8 (byte 3 is 0xff)"), std::string::npos) << m;
  m = expect_error<UsageError>("empty", [&] { e.add_parameter("", {2}, filled(0.0f)); });
  EXPECT_NE(m.find("parameter 1: the name is empty"), std::string::npos) << m;
  m = expect_error<UsageError>("NUL", [&] { e.add_parameter("a\0b"s, {2}, filled(0.0f)); });
  EXPECT_NE(m.find("parameter 1: the name 'a\\x00b' has a NUL byte at byte 1"), std::string::npos) << m;
  EXPECT_NE(std::string(m.c_str()).find("[at "), std::string::npos) << "what() must not be cut at the NUL";
  // The span overload checks the same way.
  const std::vector<float> v(2, 0.0f);
  m = expect_error<UsageError>("span, non-UTF-8", [&] { e.add_parameter("\xc0\xaf", {2}, v); });
  EXPECT_NE(m.find("parameter 1: the name '\\xc0\\xaf' is not valid UTF-8 (byte 0 is 0xc0)"), std::string::npos) << m;
  EXPECT_EQ(e.parameter_count(), 1u) << "nothing refused was registered";
}

TEST(Names, BadModuleAndGroupNamesAreRefusedAtRegistration) {
  Engine e(small_config(), one_rank());
  const ParamId p = e.add_parameter("p", {2}, filled(0.0f));
  e.add_module("first", {p});
  std::string m = expect_error<UsageError>("module", [&] { e.add_module("m\xff", {p}); });
  EXPECT_NE(m.find("module 1: the name 'm\\xff' is not valid UTF-8 (byte 1 is 0xff)"), std::string::npos) << m;
  m = expect_error<UsageError>("module empty", [&] { e.add_module("", {p}); });
  EXPECT_NE(m.find("module 1: the name is empty"), std::string::npos) << m;
  m = expect_error<UsageError>("module NUL", [&] { e.add_module("x\0"s, {p}); });
  EXPECT_NE(m.find("module 1: the name 'x\\x00' has a NUL byte at byte 1"), std::string::npos) << m;
  m = expect_error<UsageError>("group", [&] { e.add_param_group({"g\xfe", [](const std::string&) { return true; }, {}}); });
  EXPECT_NE(m.find("param group 0: the name 'g\\xfe' is not valid UTF-8 (byte 1 is 0xfe)"), std::string::npos) << m;
  m = expect_error<UsageError>("group empty", [&] { e.add_param_group({"", [](const std::string&) { return true; }, {}}); });
  EXPECT_NE(m.find("param group 0: the name is empty"), std::string::npos) << m;
}

TEST(Names, LongNamesAreShownShortInEveryError) {
  Engine e(small_config(), one_rank());
  const std::string long_name(10000, 'x');
  const ParamId p = e.add_parameter(long_name, {2}, filled(0.0f));  // valid: accepted
  const std::string cut = std::string(64, 'x') + "...' (1000";  // 10000 or 10001 characters
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"twice", [&] { e.add_parameter(long_name, {2}, filled(0.0f)); }},
      {"negative", [&] { e.add_parameter(long_name + "y", {-1}, filled(0.0f)); }},
      {"module lists twice", [&] { e.add_module(long_name, {p, p}); }},
      {"lookup", [&] { (void)e.parameter(long_name + "z"); }},
      {"group", [&] { e.add_param_group({long_name, [](const std::string&) { return false; }, {}}); }},
      {"weight decay", [&] { e.add_parameter(long_name + "w", {2}, filled(0.0f), ParamOptions{-1.0, 1.0, false}); }},
  };
  for (const auto& [what, call] : calls) {
    const std::string m = zoe_error_of(what, call);
    EXPECT_LT(m.size(), 800u) << what << ": " << m.substr(0, 300);
    EXPECT_NE(m.find(cut), std::string::npos) << what << ": " << m.substr(0, 300);
  }
}

// --------------------------------------------------------------------- only zoe's errors

TEST(ErrorTypes, RegistrationAndCallRules) {
  zoe_error_of("Engine without a device", [] { Engine e(small_config(), RankContext{}); });
  zoe_error_of("Engine with a bad config", [] {
    Config c = small_config();
    c.zero_optimization.stage = 7;
    Engine e(c, one_rank());
  });
  zoe_error_of("make_local_ranks(0)", [] { make_local_ranks(0); });
  zoe_error_of("make_local_ranks NaN timeout", [] { make_local_ranks(1, std::nan("")); });

  Small s;
  zoe_error_of("negative dimension", [&] { s.e.add_parameter("n", {-2}, filled(0.0f)); });
  zoe_error_of("empty initializer", [&] { s.e.add_parameter("n", {2}, ParamInitializer{}); });
  zoe_error_of("span size", [&] { s.e.add_parameter("n", {3}, std::vector<float>(2)); });
  zoe_error_of("empty matcher", [&] { s.e.add_param_group({"g", nullptr, {}}); });
  zoe_error_of("matcher throws", [&] {
    s.e.add_param_group({"g", [](const std::string&) -> bool { throw std::out_of_range("the trainer's matcher"); }, {}});
  });
  zoe_error_of("matcher matches nothing", [&] { s.e.add_param_group({"g", [](const std::string&) { return false; }, {}}); });
  zoe_error_of("param_options", [&] { (void)s.e.param_options(ParamId{99}); });
  zoe_error_of("parameter", [&] { (void)s.e.parameter("nope"); });
  zoe_error_of("parameter_name", [&] { (void)s.e.parameter_name(ParamId{99}); });
  zoe_error_of("parameter_shape", [&] { (void)s.e.parameter_shape(ParamId{99}); });
  zoe_error_of("add_module unknown", [&] { s.e.add_module("m", {ParamId{99}}); });
  EXPECT_NE(zoe_error_of("begin_forward unknown", [&] { s.e.begin_forward(ModuleId{99}); })
                .find("begin_forward: unknown module id 99"),
            std::string::npos);
  EXPECT_NE(zoe_error_of("end_backward unknown", [&] { s.e.end_backward(ModuleId{99}); }).find("end_backward: unknown module id 99"),
            std::string::npos);
  zoe_error_of("end_forward without begin", [&] { s.e.end_forward(s.ma); });
  zoe_error_of("begin_backward without forward", [&] { s.e.begin_backward(s.ma); });
  zoe_error_of("end_backward without begin", [&] { s.e.end_backward(s.ma); });
  zoe_error_of("step without backward", [&] { s.e.step(); });
  zoe_error_of("set_lr negative", [&] { s.e.set_lr(-1.0); });
  zoe_error_of("set_lr NaN", [&] { s.e.set_lr(std::nan("")); });
  zoe_error_of("gather_parameter unknown", [&] { s.e.gather_parameter(ParamId{99}); });
  std::vector<float> two(2);
  zoe_error_of("read_parameter size", [&] { s.e.read_parameter(s.a, two); });
  zoe_error_of("write_parameter size", [&] { s.e.write_parameter(s.a, two); });
  std::vector<float> nan4(4, std::nanf(""));
  zoe_error_of("write_parameter NaN", [&] { s.e.write_parameter(s.a, nan4); });
  zoe_error_of("all_reduce empty name", [&] { s.e.all_reduce(1.0, ScalarReduce::sum, ""); });
  zoe_error_of("add_parameter after forward", [&] { s.e.add_parameter("late", {1}, filled(0.0f)); });
  zoe_error_of("add_module after forward", [&] { s.e.add_module("late", {s.a}); });
}

TEST(ErrorTypes, InitializersThatThrowAnything) {
  const std::vector<std::pair<std::string, std::function<void()>>> throwers = {
      {"runtime_error", [] { throw std::runtime_error("disk gone"); }},
      {"bad_alloc", [] { throw std::bad_alloc(); }},
      {"filesystem_error",
       [] { throw fs::filesystem_error("open", "/x", std::make_error_code(std::errc::no_such_file_or_directory)); }},
      {"int", [] { throw 42; }},
  };
  for (const auto& [what, thrower] : throwers) {
    Engine e(small_config(), one_rank());
    const ParamId p = e.add_parameter("p", {4}, [&](std::int64_t, std::span<float>) { thrower(); });
    const ModuleId m = e.add_module("m", {p});
    zoe_error_of("initializer throws " + what, [&] { e.begin_forward(m); });
    zoe_error_of("the call after, " + what, [&] { e.begin_forward(m); });
  }
}

TEST(ErrorTypes, CheckpointsAndExports) {
  TempDir tmp;
  Small s;
  s.train_step();
  const std::string too_long = tmp / std::string(300, 'n');  // one component over NAME_MAX
  const std::string very_long = "/" + std::string(5000, 'p');  // over PATH_MAX
  {
    std::ofstream(tmp / "a_file") << "x";
  }
  const std::string under_file = tmp / "a_file/sub";

  for (const std::string& dir : {too_long, very_long, under_file}) {
    const std::string m = zoe_error_of("save_checkpoint to " + dir.substr(0, 60), [&] { s.e.save_checkpoint(dir); });
    EXPECT_LT(m.size(), 2000u) << m.substr(0, 300);
    zoe_error_of("load_checkpoint from " + dir.substr(0, 60), [&] { s.e.load_checkpoint(dir); });
    zoe_error_of("export_safetensors to " + dir.substr(0, 60), [&] { s.e.export_safetensors(dir); });
  }
  expect_error<UsageError>("client_state not UTF-8", [&] { s.e.save_checkpoint(tmp / "ck", "state \xff"); });
  expect_error<UsageError>("metadata not UTF-8", [&] { s.e.export_safetensors(tmp / "m.safetensors", DType::f32, {{"k\xff", "v"}}); });
  expect_error<UsageError>("metadata value not UTF-8", [&] { s.e.export_safetensors(tmp / "m.safetensors", DType::f32, {{"k", "v\xfe"}}); });
  zoe_error_of("export empty path", [&] { s.e.export_safetensors(""); });
  zoe_error_of("export bad dtype", [&] { s.e.export_safetensors(tmp / "x", static_cast<DType>(77)); });
  zoe_error_of("export to a directory", [&] { s.e.export_safetensors(tmp.path.string()); });
  zoe_error_of("load a missing checkpoint", [&] { s.e.load_checkpoint(tmp / "none"); });

  // A saved checkpoint whose manifest is then damaged: garbage, bytes that are not UTF-8.
  s.e.save_checkpoint(tmp / "ck", "{\"step\": 1}");
  const std::string manifest = tmp / "ck/manifest.json";
  for (const std::string& text : {"not json at all"s, "{\"version\": \"\xff\xfe\"}"s, "{}"s, "[1, 2]"s}) {
    std::ofstream(manifest, std::ios::trunc) << text;
    zoe_error_of("load a manifest of " + text, [&] { s.e.load_checkpoint(tmp / "ck"); });
  }
  // The engine is still usable after all of these (every refusal above left it as it was).
  s.e.save_checkpoint(tmp / "ck2");
  EXPECT_EQ(s.e.load_checkpoint(tmp / "ck2"), "");
}

TEST(ErrorTypes, SafetensorsFile) {
  TempDir tmp;
  zoe_error_of("open missing", [&] { SafetensorsFile::open(tmp / "missing"); });
  zoe_error_of("open a directory", [&] { SafetensorsFile::open(tmp.path.string()); });
  zoe_error_of("open a too long path", [&] { SafetensorsFile::open("/" + std::string(5000, 'p')); });
  auto write_header = [&](const std::string& name, const std::string& json) {
    std::ofstream f(tmp / name, std::ios::binary);
    const std::uint64_t n = json.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << json;
  };
  write_header("garbage", "{not json");
  zoe_error_of("open garbage", [&] { SafetensorsFile::open(tmp / "garbage"); });
  write_header("utf8", "{\"t\xff\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [0, 0]}}");
  zoe_error_of("open a name that is not UTF-8", [&] { SafetensorsFile::open(tmp / "utf8"); });
  write_header("array", "[1]");
  zoe_error_of("open an array", [&] { SafetensorsFile::open(tmp / "array"); });
  write_header("types", "{\"t\": {\"dtype\": 5, \"shape\": \"x\", \"data_offsets\": {}}}");
  zoe_error_of("open wrong types", [&] { SafetensorsFile::open(tmp / "types"); });

  // A good file: the export of a small engine.
  Small s;
  s.e.export_safetensors(tmp / "good.safetensors");
  auto f = SafetensorsFile::open(tmp / "good.safetensors");
  std::vector<float> out(10);
  zoe_error_of("read_f32 unknown", [&] { f->read_f32("nope", 0, out); });
  zoe_error_of("read_f32 outside", [&] { f->read_f32("a", 0, out); });
  zoe_error_of("initializer unknown", [&] { f->initializer("nope", {4}); });
  zoe_error_of("initializer shape", [&] { f->initializer("a", {5}); });
}

TEST(ErrorTypes, LaunchEnvironment) {
  // Garbage in the launcher's variables is an Error naming them, not std::stoi's exception.
  const char* names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"};
  for (const char* n : names) ::unsetenv(n);
  zoe_error_of("no launcher variables", [] { rank_from_environment(1.0); });
  ::setenv("RANK", "zero", 1);
  ::setenv("WORLD_SIZE", "99999999999999999999", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "http", 1);
  zoe_error_of("garbage launcher variables", [] { rank_from_environment(1.0); });
  for (const char* n : names) ::unsetenv(n);
  ::setenv("ZOE_HOST_MEMORY", "bogus", 1);
  zoe_error_of("ZOE_HOST_MEMORY=bogus", [] { make_host_device(); });
  ::unsetenv("ZOE_HOST_MEMORY");
}

// ------------------------------------------------------------------------ gradient views

// A parameter shared by two modules: at the second use's begin_backward its view holds what
// the first use added (stage 3, the buffer is per micro-batch) and, at stages 0-1, also what
// the step's earlier micro-batches added; each micro-batch starts at zero at stages 2-3.
TEST(GradientViews, HoldWhatWasAddedAndNotYetReduced) {
  for (int stage : {0, 1, 2, 3}) {
    Config c = small_config(stage);
    c.gradient_accumulation_steps = 2;
    Engine e(c, one_rank());
    const ParamId w = e.add_parameter("w", {3}, filled(0.5f));
    const ModuleId first = e.add_module("first", {w});
    const ModuleId second = e.add_module("second", {w});  // tied: w again
    std::vector<float> seen;  // each begin_backward's view of w, element 0
    for (int micro = 0; micro < 2; ++micro) {
      for (ModuleId m : {first, second}) {
        ForwardScope f(e, m);
      }
      for (ModuleId m : {second, first}) {
        BackwardScope b(e, m);
        const TensorView& g = b.tensors().grads.at(0);
        seen.push_back(g.as<float>()[0]);
        for (std::int64_t i = 0; i < g.numel(); ++i) g.as<float>()[i] += m.index == 1 ? 1.0f : 2.0f;
      }
    }
    e.step();
    // Micro-batch 0: second sees 0, first sees second's 1. Micro-batch 1: stages 2-3 start
    // again at 0; stages 0-1 hold micro-batch 0's sum 3.
    const float carried = stage <= 1 ? 3.0f : 0.0f;
    EXPECT_EQ(seen, (std::vector<float>{0.0f, 1.0f, carried, carried + 1.0f})) << "stage " << stage;
  }
}

// begin_forward / begin_backward hand out the engine's views of the module, refreshed in place
// at each call: the same object every time (no allocation per call), pointing at this call's
// gathered buffers and gradient buffers; a copy keeps what it was given.
TEST(ModuleViews, AreTheEnginesRefreshedInPlace) {
  Config c = small_config(3);
  c.optimizer.lr = 0.0;  // the values stay put
  Engine e(c, one_rank());
  const ParamId w = e.add_parameter("w", {2, 3}, filled(0.5f));
  const ParamId b = e.add_parameter("b", {3}, filled(0.25f));
  const ModuleId m = e.add_module("m", {w, b});
  const ModuleTensors* forward = nullptr;
  const ModuleTensors* backward = nullptr;
  for (int step = 0; step < 2; ++step) {
    const ModuleTensors& f = e.begin_forward(m);
    if (forward) EXPECT_EQ(&f, forward);
    forward = &f;
    ASSERT_EQ(f.params.size(), 2u);
    EXPECT_TRUE(f.grads.empty());
    EXPECT_EQ(f.params[0].shape, (std::vector<std::int64_t>{2, 3}));
    EXPECT_EQ(f.params[1].as<float>()[2], 0.25f);
    const ModuleTensors kept = f;  // a value copy
    e.end_forward(m);
    const ModuleTensors& g = e.begin_backward(m);
    if (backward) EXPECT_EQ(&g, backward);
    backward = &g;
    EXPECT_NE(&g, &f);
    ASSERT_EQ(g.grads.size(), 2u);
    EXPECT_EQ(g.grads[1].shape, (std::vector<std::int64_t>{3}));
    EXPECT_EQ(kept.params[0].shape, g.params[0].shape);
    EXPECT_EQ(g.params[0].as<float>()[5], 0.5f);  // this gather's values
    e.end_backward(m);
    e.step();
  }
}

// zoe/half.hpp, the trainer's 16-bit conversions (through zoe/engine.hpp): round to nearest
// even, ties included, NaN kept, fp16 overflow to inf and subnormals, exact widening; the span
// forms give the scalar forms' values and refuse a size mismatch or overlap with UsageError.
TEST(HalfConversions, RoundToNearestEvenAndWidenExactly) {
  auto bits = [](std::uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; };
  EXPECT_EQ(zoe::float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(zoe::float_to_bf16(bits(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(zoe::float_to_bf16(bits(0x3f818000u)), 0x3f82);  // tie, even above
  EXPECT_EQ(zoe::float_to_bf16(bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(zoe::float_to_bf16(-2.0f), 0xc000);
  EXPECT_TRUE(std::isnan(zoe::bf16_to_float(zoe::float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(zoe::bf16_to_float(0x3f81), bits(0x3f810000u));
  EXPECT_EQ(zoe::float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(zoe::float_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(zoe::float_to_fp16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(zoe::float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(zoe::fp16_to_float(0x3555), 0.333251953125f);
  std::vector<float> x = {0.1f, -3.5f, 1e-30f, 7e4f};
  std::vector<std::uint16_t> h(x.size());
  std::vector<float> back(x.size());
  zoe::float_to_bf16(x, h);
  zoe::bf16_to_float(h, back);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(back[i], zoe::bf16_to_float(zoe::float_to_bf16(x[i])));
  zoe::float_to_fp16(x, h);
  zoe::fp16_to_float(h, back);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(back[i], zoe::fp16_to_float(zoe::float_to_fp16(x[i])));
  std::vector<std::uint16_t> short_out(2);
  EXPECT_THROW(zoe::float_to_bf16(x, short_out), zoe::UsageError);
  std::vector<float> both(8);
  EXPECT_THROW(zoe::bf16_to_float(std::span<const std::uint16_t>(reinterpret_cast<const std::uint16_t*>(both.data()), 4),
                                  std::span<float>(both.data(), 4)),
               zoe::UsageError);
}
