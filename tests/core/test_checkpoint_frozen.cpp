// Checkpoints of engines with frozen parameters (ParamOptions::frozen: compute-dtype values, no
// master weights or moments; docs/checkpoints.md, manifest version 3).
//  - Save at one stage / world size, load at another (0/1 -> 3/2, 1/1 -> 3/2, 3/2 -> 1/1, the
//    same setting, ...), with the trainable part's optimizer states on the CPU or NVMe and the
//    parameters in the parameter tier: the load is exact (every parameter bit for bit as saved)
//    and the continued run equals the uninterrupted one bit for bit. The gradients are the same
//    on every rank and multiples of 1/64, so every sum the reduction forms is exact and a run is
//    the same bits at every world size and stage: a resumed run at another world size has an
//    uninterrupted run to equal.
//  - The frozen values the run wrote before training (write_parameter; the loaded engine's
//    initializers give other values) come back bitwise: from the checkpoint, not re-initialized.
//  - A load into another compute dtype rounds the frozen values once (bf16 -> fp32 exact).
//  - The manifest's version and records, the rank files' exact sizes; a corrupted frozen record
//    is refused (CRC32C) naming the file on every rank; a checkpoint whose frozen set is not the
//    engine's is refused naming the parameter; zoe-ckpt verify / reshard / export / inspect.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kernels/half.hpp"
#include "src/core/checkpoint/checkpoint_export.hpp"
#include "src/core/checkpoint/checkpoint_reshard.hpp"
#include "tests/core/test_net.hpp"
#include "tests/core/shell.hpp"
#include "zoe/safetensors.hpp"

using namespace zoe;
namespace fs = std::filesystem;

namespace {

// The model: three modules, two frozen parameters (one spans several sub_group_size pieces).
//  A: A.w [8, 9] (decay 0.1), A.b [5] (no decay)
//  B: B.w [33] (decay 0.05, lr x 0.5), B.ln [7] (frozen), B.b [3] (no decay, lr x 2)
//  C: C.emb [150] (frozen), and A.w again (tied: its gradient adds from both modules)
// Groups: A, B, "B (frozen)", C (empty), "C (frozen)".
struct Spec {
  std::string name;
  std::vector<std::int64_t> shape;
  ParamOptions options;
};
std::vector<Spec> standard_specs() {
  return {{"A.w", {8, 9}, {0.1, 1.0, false}},        {"A.b", {5}, {0.0, 1.0, false}},
          {"B.w", {33}, {0.05, 0.5, false}},         {"B.ln", {7}, {std::nullopt, 1.0, true}},
          {"B.b", {3}, {0.0, 2.0, false}},           {"C.emb", {150}, {std::nullopt, 1.0, true}}};
}
// The same model with another frozen set: `frozen[p]` for parameter p.
std::vector<Spec> specs_with(std::vector<bool> frozen) {
  std::vector<Spec> s = standard_specs();
  for (std::size_t p = 0; p < s.size(); ++p) s[p].options.frozen = frozen[p];
  return s;
}
const std::vector<std::vector<int>> kModules = {{0, 1}, {2, 3, 4}, {5, 0}};
const char* kModuleNames[] = {"A", "B", "C"};

std::int64_t numel(const Spec& s) {
  std::int64_t n = 1;
  for (std::int64_t d : s.shape) n *= d;
  return n;
}
float initial(int p, std::int64_t i) { return zoe::test::hashed_uniform(300 + p, i, 1.0f); }
// What every run writes into the frozen parameters before its first step: a loaded engine's
// initializers give `initial`, so it has these only from the checkpoint.
float written(int p, std::int64_t i) { return zoe::test::hashed_uniform(500 + p, i, 0.75f); }
// The gradient of element i of parameter p in module m at step s, the same on every rank: a
// multiple of 1/64 in [-1, 1] (exact in bf16; A.w's two modules and the mean over 1 or 2
// ranks stay exact), so a run gives the same bits at every world size and stage.
float grad_value(int s, int m, int p, std::int64_t i) {
  const float u = zoe::test::hashed_uniform(1000 * (s + 1) + 10 * m + p, i, 1.0f);
  return std::round(u * 64.0f) / 64.0f;
}

struct Setting {
  int stage, world;
  OffloadDevice optimizer = OffloadDevice::none;
  OffloadDevice param = OffloadDevice::none;  // stage 3 only
};
std::string name(const Setting& s) {
  return "stage " + std::to_string(s.stage) + " world " + std::to_string(s.world) + " optimizer offload " +
         std::to_string(static_cast<int>(s.optimizer)) + " param offload " + std::to_string(static_cast<int>(s.param));
}

Config config(const Setting& s, DType dtype, const std::string& dir) {
  Config c;
  c.zero_optimization.stage = s.stage;
  c.bf16.enabled = dtype == DType::bf16;
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.02;
  c.zero_optimization.sub_group_size = 16;  // several sub-groups, and pieces of the frozen shards
  c.zero_optimization.stage3_param_persistence_threshold = 0;
  c.zero_optimization.stage3_max_reuse_distance = 0;
  c.zoe.optimizer_threads = 1;
  auto& oo = c.zero_optimization.offload_optimizer;
  oo.device = s.optimizer;
  oo.nvme_path = dir + "/nvme";
  oo.buffer_count = 3;
  c.zero_optimization.offload_param.device = s.param;
  c.zero_optimization.offload_param.nvme_path = dir + "/nvme";
  c.zero_optimization.offload_param.buffer_size = 4096;
  return c;
}

using Params = std::vector<std::vector<float>>;

struct RunOptions {
  int from = 0, to = 0;
  std::string load, save;
  std::vector<Spec> specs = standard_specs();
  // Called on every rank after the steps and before the save (a live export).
  std::function<void(Engine&)> after;
};

// Trains steps [from, to) on `world` ranks (loading o.load first, else writing `written` into
// the frozen parameters), saves o.save if asked; returns every parameter's value (rank 0's
// gather_parameter) after the steps.
Params run(const Config& c, int world, const RunOptions& o) {
  Params out;
  run_ranks(make_local_ranks(world, 60.0), [&](RankContext& ctx) {
    Engine e(c, ctx);
    std::vector<ParamId> ids;
    for (std::size_t p = 0; p < o.specs.size(); ++p) {
      const int pi = static_cast<int>(p);
      ids.push_back(e.add_parameter(
          o.specs[p].name, o.specs[p].shape,
          [pi](std::int64_t offset, std::span<float> v) {
            for (std::size_t i = 0; i < v.size(); ++i) v[i] = initial(pi, offset + static_cast<std::int64_t>(i));
          },
          o.specs[p].options));
    }
    std::vector<ModuleId> modules;
    for (std::size_t k = 0; k < kModules.size(); ++k) {
      std::vector<ParamId> mine;
      for (int p : kModules[k]) mine.push_back(ids[static_cast<std::size_t>(p)]);
      modules.push_back(e.add_module(kModuleNames[k], mine));
    }
    if (!o.load.empty()) {
      e.load_checkpoint(o.load);
    } else {
      for (std::size_t p = 0; p < o.specs.size(); ++p) {
        if (!o.specs[p].options.frozen) continue;
        std::vector<float> v(static_cast<std::size_t>(numel(o.specs[p])));
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = written(static_cast<int>(p), static_cast<std::int64_t>(i));
        e.write_parameter(ids[p], v);
      }
    }
    EXPECT_EQ(e.global_step(), o.from);
    for (int s = o.from; s < o.to; ++s) {
      for (ModuleId m : modules) {
        ForwardScope f(e, m);
      }
      for (int k = static_cast<int>(modules.size()) - 1; k >= 0; --k) {
        BackwardScope b(e, modules[static_cast<std::size_t>(k)]);
        for (std::size_t j = 0; j < kModules[static_cast<std::size_t>(k)].size(); ++j) {
          const int p = kModules[static_cast<std::size_t>(k)][j];
          const TensorView& g = b.tensors().grads[j];
          ASSERT_EQ(g.data == nullptr, o.specs[static_cast<std::size_t>(p)].options.frozen);
          if (!g.data) continue;
          for (std::int64_t i = 0; i < g.numel(); ++i) zoe::test::add(g, i, grad_value(s, k, p, i));
        }
      }
      e.step();
    }
    if (o.after) o.after(e);
    if (!o.save.empty()) e.save_checkpoint(o.save);
    Params values;
    for (ParamId id : ids) values.push_back(e.gather_parameter(id));
    if (ctx.rank == 0) out = std::move(values);
  });
  return out;
}

void expect_bitwise(const Params& a, const Params& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  const std::vector<Spec> specs = standard_specs();
  for (std::size_t p = 0; p < a.size(); ++p) {
    ASSERT_EQ(a[p].size(), b[p].size()) << what;
    EXPECT_EQ(0, std::memcmp(a[p].data(), b[p].data(), a[p].size() * sizeof(float)))
        << what << ": parameter " << specs[p].name;
  }
}

// The frozen parameters hold `written` in the compute dtype, bit for bit.
void expect_frozen_written(const Params& v, DType dtype, const std::string& what) {
  const std::vector<Spec> specs = standard_specs();
  for (std::size_t p = 0; p < specs.size(); ++p) {
    if (!specs[p].options.frozen) continue;
    for (std::size_t i = 0; i < v[p].size(); ++i) {
      float w = written(static_cast<int>(p), static_cast<std::int64_t>(i));
      if (dtype == DType::bf16) w = kernels::bf16_to_f32(kernels::f32_to_bf16(w));
      ASSERT_EQ(std::bit_cast<std::uint32_t>(v[p][i]), std::bit_cast<std::uint32_t>(w))
          << what << ": " << specs[p].name << "[" << i << "]";
    }
  }
}

// Saves after 3 steps at `from`, loads at `to`: the load is exact and 3 more steps equal the
// uninterrupted 6 steps at `to` (and at `from`) bit for bit.
void save_load_continue(const Setting& from, const Setting& to, DType dtype, const std::string& dir) {
  const std::string what = std::string(dtype_name(dtype)) + ", saved at " + name(from) + ", loaded at " + name(to);
  const std::string ckpt = dir + "/ckpt";
  const Params straight = run(config(to, dtype, dir), to.world, {.from = 0, .to = 6});
  const Params straight_from = run(config(from, dtype, dir), from.world, {.from = 0, .to = 6});
  expect_bitwise(straight, straight_from, what + " (the two uninterrupted runs)");
  const Params saved = run(config(from, dtype, dir), from.world, {.from = 0, .to = 3, .save = ckpt});
  const Params loaded = run(config(to, dtype, dir), to.world, {.from = 3, .to = 3, .load = ckpt});
  expect_bitwise(saved, loaded, what + " (the load)");
  const Params resumed = run(config(to, dtype, dir), to.world, {.from = 3, .to = 6, .load = ckpt});
  expect_bitwise(straight, resumed, what + " (3 steps after the load)");
  expect_frozen_written(resumed, dtype, what);
  // Training moved the trainable parameters: the comparison is not of untouched values.
  const std::vector<Spec> specs = standard_specs();
  EXPECT_NE(saved[0], straight[0]) << what;
  EXPECT_NE(std::bit_cast<std::uint32_t>(saved[0][0]), std::bit_cast<std::uint32_t>(initial(0, 0))) << what;
  fs::remove_all(ckpt);
}

std::string text_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void flip_byte(const std::string& path, std::uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char x = 0;
  f.read(&x, 1);
  x = static_cast<char>(x ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&x, 1);
}

// Loads `ckpt` into a fresh engine of `specs` on `world` ranks of `c`; returns each rank's
// error kind and message ("" if it loaded), and whether the engine kept its values and step.
struct Outcome {
  std::vector<std::string> kinds, errors;
  std::vector<char> unchanged;
};
Outcome try_load(const Config& c, int world, const std::string& ckpt, const std::vector<Spec>& specs) {
  Outcome o;
  o.kinds.resize(static_cast<std::size_t>(world));
  o.errors.resize(static_cast<std::size_t>(world));
  o.unchanged.resize(static_cast<std::size_t>(world));
  run_ranks(make_local_ranks(world, 60.0), [&](RankContext& ctx) {
    Engine e(c, ctx);
    std::vector<ParamId> ids;
    for (std::size_t p = 0; p < specs.size(); ++p) {
      const int pi = static_cast<int>(p);
      ids.push_back(e.add_parameter(
          specs[p].name, specs[p].shape,
          [pi](std::int64_t offset, std::span<float> v) {
            for (std::size_t i = 0; i < v.size(); ++i) v[i] = initial(pi, offset + static_cast<std::int64_t>(i));
          },
          specs[p].options));
    }
    for (std::size_t k = 0; k < kModules.size(); ++k) {
      std::vector<ParamId> mine;
      for (int p : kModules[k]) mine.push_back(ids[static_cast<std::size_t>(p)]);
      e.add_module(kModuleNames[k], mine);
    }
    Params before, after;
    for (ParamId id : ids) before.push_back(e.gather_parameter(id));
    const auto r = static_cast<std::size_t>(ctx.rank);
    try {
      e.load_checkpoint(ckpt);
    } catch (const CorruptionError& x) {
      o.kinds[r] = "corruption", o.errors[r] = x.what();
    } catch (const UsageError& x) {
      o.kinds[r] = "usage", o.errors[r] = x.what();
    } catch (const Error& x) {
      o.kinds[r] = "other", o.errors[r] = x.what();
    }
    for (ParamId id : ids) after.push_back(e.gather_parameter(id));
    o.unchanged[r] = before == after && e.global_step() == 0;
  });
  return o;
}

const ckpt::GroupEntry& group_named(const ckpt::Manifest& m, const std::string& name) {
  for (const ckpt::GroupEntry& g : m.groups)
    if (g.name == name) return g;
  ADD_FAILURE() << "no group '" << name << "'";
  return m.groups.front();
}

using test::shell;
}  // namespace

TEST(CheckpointFrozen, ReshardOnLoadContinuesBitwise) {
  const std::string dir = zoe::test::temp_dir("ckpt-frozen-reshard");
  for (const auto& [from, to] : {std::pair{Setting{0, 1}, Setting{3, 2}}, std::pair{Setting{1, 1}, Setting{3, 2}},
                                 std::pair{Setting{3, 2}, Setting{1, 1}}, std::pair{Setting{3, 2}, Setting{3, 2}},
                                 std::pair{Setting{0, 2}, Setting{0, 2}}, std::pair{Setting{2, 2}, Setting{0, 1}}})
    save_load_continue(from, to, DType::bf16, dir);
  // fp32 compute: the frozen values are stored as 4-byte values.
  save_load_continue({3, 2}, {0, 1}, DType::f32, dir);
  save_load_continue({1, 1}, {3, 2}, DType::f32, dir);
  fs::remove_all(dir);
}

TEST(CheckpointFrozen, OffloadedTrainablePartContinuesBitwise) {
  const std::string dir = zoe::test::temp_dir("ckpt-frozen-offload");
  const auto none = OffloadDevice::none, cpu = OffloadDevice::cpu, nvme = OffloadDevice::nvme;
  for (const auto& [from, to] : {std::pair{Setting{3, 2, nvme, cpu}, Setting{1, 2, cpu, none}},
                                 std::pair{Setting{2, 2, cpu, none}, Setting{3, 2, nvme, nvme}},
                                 std::pair{Setting{3, 2, cpu, nvme}, Setting{3, 1, none, none}},
                                 std::pair{Setting{1, 1, nvme, none}, Setting{3, 2, cpu, cpu}}})
    save_load_continue(from, to, DType::bf16, dir);
  fs::remove_all(dir);
}

TEST(CheckpointFrozen, EveryParameterFrozen) {
  // No optimizer state at all (every trainable group empty): the values and the step count
  // come back.
  const std::string dir = zoe::test::temp_dir("ckpt-frozen-all");
  const std::vector<Spec> all = specs_with({true, true, true, true, true, true});
  const Params saved = run(config({3, 2}, DType::bf16, dir), 2, {.from = 0, .to = 2, .save = dir + "/ckpt", .specs = all});
  EXPECT_EQ(ckpt::read_manifest_file(dir + "/ckpt").version, 3);
  for (const Setting& to : {Setting{0, 1}, Setting{3, 2}, Setting{2, 2}}) {
    const Params loaded = run(config(to, DType::bf16, dir), to.world, {.from = 2, .to = 3, .load = dir + "/ckpt", .specs = all});
    expect_bitwise(saved, loaded, "every parameter frozen, loaded at " + name(to));
    for (std::size_t p = 0; p < all.size(); ++p)
      for (std::size_t i = 0; i < loaded[p].size(); ++i)
        ASSERT_EQ(loaded[p][i], kernels::bf16_to_f32(kernels::f32_to_bf16(written(static_cast<int>(p), static_cast<std::int64_t>(i)))))
            << all[p].name << "[" << i << "]";
  }
  fs::remove_all(dir);
}

TEST(CheckpointFrozen, AnotherComputeDtypeRoundsTheFrozenValuesOnce) {
  // bf16 -> fp32: the values widened, exact; fp32 -> bf16: rounded to bf16 once, as an
  // initializer's values are. The master weights are the saved ones either way.
  const std::string dir = zoe::test::temp_dir("ckpt-frozen-dtype");
  for (const auto& [saved_as, loaded_as] : {std::pair{DType::bf16, DType::f32}, std::pair{DType::f32, DType::bf16}}) {
    const std::string what = std::string(dtype_name(saved_as)) + " -> " + std::string(dtype_name(loaded_as));
    const Params saved = run(config({3, 2}, saved_as, dir), 2, {.from = 0, .to = 2, .save = dir + "/ckpt"});
    const Params loaded = run(config({1, 1}, loaded_as, dir), 1, {.from = 2, .to = 2, .load = dir + "/ckpt"});
    expect_frozen_written(loaded, DType::bf16, what);
    const std::vector<Spec> specs = standard_specs();
    for (std::size_t p = 0; p < specs.size(); ++p)
      if (!specs[p].options.frozen) EXPECT_EQ(saved[p], loaded[p]) << what << ": " << specs[p].name;
    fs::remove_all(dir + "/ckpt");
  }
  fs::remove_all(dir);
}

TEST(CheckpointFrozen, ManifestRecordsTheFrozenGroupsAndTheirExactBytes) {
  const std::string dir = zoe::test::temp_dir("ckpt-frozen-manifest");
  // With frozen parameters: version 3, the frozen groups marked, their values 2 bytes each
  // (bf16), each rank its shard, at stage 0 too (stored once, not per rank).
  for (int stage : {0, 3}) {
    const std::string ckpt = dir + "/frozen" + std::to_string(stage);
    run(config({stage, 2}, DType::bf16, dir), 2, {.from = 0, .to = 1, .save = ckpt});
    const ckpt::Manifest m = ckpt::read_manifest_file(ckpt);
    EXPECT_EQ(m.version, 3);
    EXPECT_NE(text_of(ckpt + "/manifest.json").find("\"version\": 3"), std::string::npos);
    std::uint64_t expect[2] = {ckpt::kHeaderBytes, ckpt::kHeaderBytes};
    for (const ckpt::GroupEntry& g : m.groups) {
      EXPECT_EQ(g.frozen, g.name.find("(frozen)") != std::string::npos) << g.name;
      const std::int64_t shard = g.padded_numel / 2;
      for (int r = 0; r < 2; ++r) {
        const ckpt::RankRange& rr = g.ranks[static_cast<std::size_t>(r)];
        if (g.frozen || stage > 0) {
          EXPECT_EQ(rr.begin, r * shard) << g.name;
          EXPECT_EQ(rr.numel, shard) << g.name;
        } else {
          EXPECT_EQ(rr.numel, g.padded_numel) << g.name;
        }
        expect[r] += static_cast<std::uint64_t>(rr.numel) * (g.frozen ? 2 : 12);
      }
    }
    EXPECT_TRUE(group_named(m, "B (frozen)").frozen);
    EXPECT_EQ(group_named(m, "C (frozen)").params.at(0).name, "C.emb");
    EXPECT_EQ(group_named(m, "C (frozen)").padded_numel, 160);  // 150 padded to 16 x 2
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(m.files[static_cast<std::size_t>(r)].bytes, expect[r]) << "stage " << stage << " rank " << r;
      EXPECT_EQ(fs::file_size(ckpt + "/rank" + std::to_string(r) + ".zoe"), expect[r]);
    }
  }
  // Without frozen parameters a save writes version 2, with no "frozen" key: what zoe before
  // frozen records reads.
  const std::string plain = dir + "/plain";
  run(config({3, 2}, DType::bf16, dir), 2,
      {.from = 0, .to = 1, .save = plain, .specs = specs_with({false, false, false, false, false, false})});
  EXPECT_EQ(ckpt::read_manifest_file(plain).version, 2);
  const std::string text = text_of(plain + "/manifest.json");
  EXPECT_NE(text.find("\"version\": 2"), std::string::npos);
  EXPECT_EQ(text.find("frozen"), std::string::npos);
  fs::remove_all(dir);
}

TEST(CheckpointFrozen, CorruptFrozenRecordIsRefusedNamingTheFile) {
  const std::string dir = zoe::test::temp_dir("ckpt-frozen-corrupt");
  const std::string ckpt = dir + "/ckpt";
  run(config({3, 2}, DType::bf16, dir), 2, {.from = 0, .to = 2, .save = ckpt});
  const ckpt::Manifest m = ckpt::read_manifest_file(ckpt);
  const ckpt::RankRange& rr = group_named(m, "C (frozen)").ranks[1];
  flip_byte(ckpt + "/rank1.zoe", rr.file_offset + 7);
  for (const Setting& at : {Setting{3, 2}, Setting{0, 2}, Setting{1, 1}}) {
    const Outcome o = try_load(config(at, DType::bf16, dir), at.world, ckpt, standard_specs());
    for (int r = 0; r < at.world; ++r) {
      const std::string& e = o.errors[static_cast<std::size_t>(r)];
      EXPECT_EQ(o.kinds[static_cast<std::size_t>(r)], "corruption") << name(at) << " rank " << r << ": " << e;
      EXPECT_NE(e.find("rank1.zoe"), std::string::npos) << e;
      EXPECT_NE(e.find("frozen group 'C (frozen)'"), std::string::npos) << e;
      EXPECT_TRUE(o.unchanged[static_cast<std::size_t>(r)]) << name(at) << " rank " << r;
    }
  }
  // zoe-ckpt's verify and export refuse it too, export leaving nothing behind.
  try {
    ckpt::verify_checkpoint(ckpt, m);
    ADD_FAILURE() << "verify accepted a corrupt frozen record";
  } catch (const CorruptionError& e) {
    EXPECT_NE(std::string(e.what()).find("rank1.zoe"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ckpt::export_safetensors(ckpt, m, dir + "/out.safetensors", DType::f32), CorruptionError);
  EXPECT_FALSE(fs::exists(dir + "/out.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/out.safetensors.tmp"));
  fs::remove_all(dir);
}

TEST(CheckpointFrozen, AnotherFrozenSetIsRefusedNamingTheParameter) {
  const std::string dir = zoe::test::temp_dir("ckpt-frozen-set");
  const Config c = config({3, 2}, DType::bf16, dir);
  const std::vector<Spec> standard = standard_specs();
  const std::vector<Spec> ln_trainable = specs_with({false, false, false, false, false, true});
  const std::vector<Spec> all_trainable = specs_with({false, false, false, false, false, false});
  run(c, 2, {.from = 0, .to = 1, .save = dir + "/frozen"});
  run(c, 2, {.from = 0, .to = 1, .save = dir + "/trainable", .specs = all_trainable});
  struct Case {
    std::string ckpt;
    std::vector<Spec> engine;
    std::string says;
  };
  for (const Case& k : {Case{dir + "/frozen", ln_trainable, "parameter 'B.ln' is frozen there and trainable here"},
                        Case{dir + "/trainable", standard, "parameter 'B.ln' is trainable there and frozen here"},
                        Case{dir + "/frozen", all_trainable, "parameter 'B.ln' is frozen there and trainable here"}}) {
    const Outcome o = try_load(c, 2, k.ckpt, k.engine);
    for (int r = 0; r < 2; ++r) {
      const std::string& e = o.errors[static_cast<std::size_t>(r)];
      EXPECT_EQ(o.kinds[static_cast<std::size_t>(r)], "usage") << e;
      EXPECT_NE(e.find(k.says), std::string::npos) << e;
      EXPECT_NE(e.find("ParamOptions::frozen"), std::string::npos) << e;
      EXPECT_TRUE(o.unchanged[static_cast<std::size_t>(r)]);
    }
  }
  // Format 1 stored every parameter trainable: refused the same way, before its files are read
  // (here only rank0.zoe's magic exists).
  fs::create_directories(dir + "/format1");
  {
    std::ofstream out(dir + "/format1/rank0.zoe", std::ios::binary);
    const std::uint64_t magic = 0x31504b43454f5aull;  // "ZOECKP1"
    out.write(reinterpret_cast<const char*>(&magic), sizeof magic);
  }
  const Outcome legacy = try_load(c, 2, dir + "/format1", standard);
  for (int r = 0; r < 2; ++r) {
    const std::string& e = legacy.errors[static_cast<std::size_t>(r)];
    EXPECT_EQ(legacy.kinds[static_cast<std::size_t>(r)], "usage") << e;
    EXPECT_NE(e.find("(format 1): parameter 'B.ln' is trainable there and frozen here"), std::string::npos) << e;
  }
  // The same frozen set loads (the refusal is about the set, not the file).
  EXPECT_EQ(try_load(c, 2, dir + "/frozen", standard).errors, std::vector<std::string>(2));
  fs::remove_all(dir);
}

TEST(CheckpointFrozen, ToolVerifiesReshardsAndExportsFrozenValues) {
  const std::string dir = zoe::test::temp_dir("ckpt-frozen-tool");
  const std::string ckpt = dir + "/ckpt";
  const Setting saved{3, 2};
  run(config(saved, DType::bf16, dir), 2,
      {.from = 0, .to = 3, .save = ckpt, .after = [&](Engine& e) {
         e.export_safetensors(dir + "/live.fp32", DType::f32);
         e.export_safetensors(dir + "/live.bf16", DType::bf16);
       }});
  const ckpt::Manifest m = ckpt::read_manifest_file(ckpt);
  ckpt::verify_checkpoint(ckpt, m);
  // export: the bytes the live export wrote, frozen values included.
  for (const auto& [dtype, tag] : {std::pair{DType::f32, "fp32"}, std::pair{DType::bf16, "bf16"}}) {
    const std::string out = dir + "/offline." + tag;
    ckpt::export_safetensors(ckpt, m, out, dtype);
    EXPECT_EQ(text_of(out), text_of(dir + "/live." + tag)) << tag;
  }
  auto file = zoe::SafetensorsFile::open(dir + "/offline.fp32");
  std::vector<float> emb(150);
  file->read_f32("C.emb", 0, emb);
  for (std::size_t i = 0; i < emb.size(); ++i)
    ASSERT_EQ(emb[i], kernels::bf16_to_f32(kernels::f32_to_bf16(written(5, static_cast<std::int64_t>(i))))) << i;

  // reshard to world 1 stage 0 and to world 2 stage 1: each loads as the original does there,
  // and exports the same bytes.
  for (const Setting& to : {Setting{0, 1}, Setting{1, 2}}) {
    const std::string out = dir + "/resharded" + std::to_string(to.stage);
    ckpt::reshard_checkpoint(ckpt, m, out, to.world, to.stage, 5);
    const ckpt::Manifest n = ckpt::read_manifest_file(out);
    EXPECT_EQ(n.version, 3);
    EXPECT_TRUE(group_named(n, "C (frozen)").frozen);
    ckpt::verify_checkpoint(out, n);
    const Params direct = run(config(to, DType::bf16, dir), to.world, {.from = 3, .to = 5, .load = ckpt});
    const Params via = run(config(to, DType::bf16, dir), to.world, {.from = 3, .to = 5, .load = out});
    expect_bitwise(direct, via, "resharded to " + name(to));
    ckpt::export_safetensors(out, n, out + ".fp32", DType::f32);
    EXPECT_EQ(text_of(out + ".fp32"), text_of(dir + "/live.fp32")) << name(to);
  }

  // The CLI: inspect names the frozen parameters, verify passes, reshard and export run.
  const std::string bin = ZOE_CKPT_BIN;
  auto [rc, text] = shell(bin + " inspect --params " + ckpt);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("(format 3"), std::string::npos) << text;
  EXPECT_NE(text.find("frozen: 2 parameters, 157 elements (values in bf16"), std::string::npos) << text;
  EXPECT_NE(text.find("group C (frozen) (160 elements padded, frozen)"), std::string::npos) << text;
  EXPECT_NE(text.find("C.emb [150] bf16 frozen at 0"), std::string::npos) << text;
  EXPECT_NE(text.find("A.w [8, 9] fp32 at 0"), std::string::npos) << text;
  std::tie(rc, text) = shell(bin + " verify " + ckpt);
  EXPECT_EQ(rc, 0) << text;
  std::tie(rc, text) = shell(bin + " reshard " + ckpt + " " + dir + "/cli -n 1 -s 2");
  EXPECT_EQ(rc, 0) << text;
  std::tie(rc, text) = shell(bin + " export " + dir + "/cli " + dir + "/cli.fp32");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_EQ(text_of(dir + "/cli.fp32"), text_of(dir + "/live.fp32"));
  fs::remove_all(dir);
}
