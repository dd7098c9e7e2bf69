// Engine::export_safetensors and zoe::SafetensorsFile through live engines: the exported file
// holds every parameter's master value bit for bit (fp32) or rounded to nearest even (bf16,
// fp16) at every stage, world size and offload tier; tied weights are stored once; importing it
// into engines of another stage and world size reproduces the parameters bitwise, each rank
// reading only its part; bad files and shapes fail naming the tensor; a failed export leaves
// nothing behind on any rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "io/safetensors.hpp"
#include "kernels/half.hpp"
#include "tests/core/test_net.hpp"
#include "zoe/safetensors.hpp"

using namespace zoe;
using zoe::test::NetSpec;
using zoe::test::TestNet;

namespace {
namespace fs = std::filesystem;

const NetSpec kTied{{8, 8, 8}, true, 11};  // l0.weight 8x8 is shared by the head module

Config config(int stage, OffloadDevice offload, const std::string& dir, int sub_group = 24) {
  Config c;
  c.zero_optimization.stage = stage;
  c.optimizer.lr = 1e-2;
  c.zoe.optimizer_threads = 1;
  c.zero_optimization.sub_group_size = sub_group;  // several sub-groups per shard, some partial
  c.zero_optimization.offload_optimizer.device = offload;
  c.zero_optimization.offload_optimizer.nvme_path = dir + "/nvme";
  return c;
}

struct Exported {
  std::vector<std::string> names;           // registration order
  std::vector<std::vector<float>> masters;  // gather_parameter after the export
};

// Trains `steps` steps of the tied net on `world` ranks, exports to `path`, gathers every master.
Exported train_and_export(const Config& c, int world, int steps, const std::string& path, DType dtype) {
  Exported out;
  auto ranks = make_local_ranks(world, 60.0);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    TestNet net(e, kTied);
    for (int s = 0; s < steps; ++s) {
      net.micro_batch(s * 16 + ctx.rank * (16 / world), 16 / world);
      e.step();
    }
    e.export_safetensors(path, dtype, {{"format", "pt"}});
    std::vector<std::vector<float>> m;
    for (ParamId id : net.params()) m.push_back(e.gather_parameter(id));
    if (ctx.rank == 0) out.masters = std::move(m);
  });
  out.names = {"l0.weight", "l0.bias", "l1.weight", "l1.bias", "head.bias"};
  return out;
}

std::uint16_t round_to(DType t, float v) { return t == DType::bf16 ? kernels::f32_to_bf16(v) : kernels::f32_to_f16(v); }

void expect_file_holds(const std::string& path, const Exported& x, DType dtype, const std::string& what) {
  const io::SafetensorsReader r(path);
  const io::SafetensorsHeader& h = r.header();
  EXPECT_EQ(h.metadata.at("format"), "pt");
  // The tied l0.weight once; file order = storage order (by owning module: l0, l1, head).
  ASSERT_EQ(h.tensors.size(), x.names.size()) << what;
  for (std::size_t i = 0; i < x.names.size(); ++i) {
    const io::SafetensorsEntry& t = h.tensors[i];
    EXPECT_EQ(t.name, x.names[i]) << what;
    EXPECT_EQ(t.dtype, dtype == DType::f32 ? "F32" : dtype == DType::bf16 ? "BF16" : "F16") << what;
    const std::vector<float>& m = x.masters[i];
    ASSERT_EQ(t.numel, static_cast<std::int64_t>(m.size())) << what << " " << t.name;
    if (dtype == DType::f32) {
      std::vector<float> v(m.size());
      r.read(t, 0, v.data(), v.size() * 4);
      EXPECT_EQ(std::memcmp(v.data(), m.data(), v.size() * 4), 0) << what << " " << t.name;
    } else {
      std::vector<std::uint16_t> v(m.size());
      r.read(t, 0, v.data(), v.size() * 2);
      for (std::size_t k = 0; k < m.size(); ++k)
        ASSERT_EQ(v[k], round_to(dtype, m[k])) << what << " " << t.name << "[" << k << "]";
    }
  }
  EXPECT_EQ(h.find("l0.weight")->shape, (std::vector<std::int64_t>{8, 8}));
  EXPECT_EQ(h.find("l1.bias")->shape, (std::vector<std::int64_t>{8}));
}

TEST(SafetensorsExport, HoldsTheMasterWeightsAtEveryStageWorldAndTier) {
  const std::string dir = zoe::test::temp_dir("st-export");
  int cases = 0;
  for (int stage : {0, 1, 2, 3})
    for (int world : {1, 2})
      for (OffloadDevice d : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme}) {
        if (stage == 0 && d != OffloadDevice::none) continue;  // offload needs a sharded optimizer
        const std::string what = "stage " + std::to_string(stage) + ", world " + std::to_string(world) + ", offload " +
                                 std::to_string(static_cast<int>(d));
        const std::string path = dir + "/m.safetensors";
        const Exported x = train_and_export(config(stage, d, dir), world, 3, path, DType::f32);
        expect_file_holds(path, x, DType::f32, what);
        ++cases;
      }
  EXPECT_EQ(cases, 20);
  // Parameter offload (stage 3): the master weights are still the optimizer tier's.
  for (OffloadDevice p : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    Config c = config(3, OffloadDevice::nvme, dir);
    c.zero_optimization.offload_param.device = p;
    c.zero_optimization.offload_param.nvme_path = dir + "/nvme";
    c.zero_optimization.offload_param.buffer_size = 1024;  // elements: small pinned buffers
    c.zero_optimization.offload_param.buffer_count = 2;
    const std::string path = dir + "/p.safetensors";
    const Exported x = train_and_export(c, 2, 3, path, DType::f32);
    expect_file_holds(path, x, DType::f32, "param offload " + std::to_string(static_cast<int>(p)));
  }
  fs::remove_all(dir);
}

TEST(SafetensorsExport, Bf16AndFp16AreTheMasterRoundedToNearestEven) {
  const std::string dir = zoe::test::temp_dir("st-export16");
  for (DType t : {DType::bf16, DType::f16}) {
    const std::string path = dir + "/h.safetensors";
    const Exported x = train_and_export(config(3, OffloadDevice::nvme, dir), 2, 3, path, t);
    expect_file_holds(path, x, t, std::string(dtype_name(t)));
  }
  fs::remove_all(dir);
}

// With bf16 compute, the bf16 export is the engine's compute copy bit for bit.
TEST(SafetensorsExport, Bf16ExportEqualsTheBf16ComputeCopy) {
  const std::string dir = zoe::test::temp_dir("st-compute");
  const std::string path = dir + "/c.safetensors";
  Config c = config(3, OffloadDevice::cpu, dir);
  c.bf16.enabled = true;
  auto ranks = make_local_ranks(2, 60.0);
  std::vector<std::uint16_t> compute;
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    std::vector<float> w(50), b(7);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = test::hashed_uniform(1, static_cast<std::int64_t>(i), 3.0f);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = test::hashed_uniform(2, static_cast<std::int64_t>(i), 3.0f);
    ParamId W = e.add_parameter("w", {5, 10}, w), B = e.add_parameter("b", {7}, b);
    ModuleId m = e.add_module("m", {W, B});
    {
      ForwardScope f(e, m);  // the gathered compute-dtype parameters
      if (ctx.rank == 0)
        for (const TensorView& v : f.tensors().params) {
          EXPECT_EQ(v.dtype, DType::bf16);
          const auto* p = v.as<std::uint16_t>();
          compute.insert(compute.end(), p, p + v.numel());
        }
    }
    e.export_safetensors(path, DType::bf16);
  });
  const io::SafetensorsReader r(path);
  std::vector<std::uint16_t> file(57);
  r.read(r.header().tensors.at(0), 0, file.data(), 100);
  r.read(r.header().tensors.at(1), 0, file.data() + 50, 14);
  EXPECT_EQ(file, compute);
  fs::remove_all(dir);
}

// Registers every tensor of the file as a parameter (one module), optionally counting what each
// rank's initializers read, and returns rank 0's gathered masters.
std::vector<std::vector<float>> import_all(const std::string& path, const Config& c, int world,
                                           std::vector<std::int64_t>* read_per_rank = nullptr,
                                           std::int64_t* largest_call = nullptr) {
  auto file = SafetensorsFile::open(path);
  auto ranks = make_local_ranks(world, 60.0);
  std::vector<std::vector<float>> out;
  std::mutex mu;
  if (read_per_rank) read_per_rank->assign(world, 0);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(c, ctx);
    std::vector<ParamId> ids;
    for (const SafetensorsTensor& t : file->tensors()) {
      ParamInitializer init = file->initializer(t.name, t.shape);
      ids.push_back(e.add_parameter(t.name, t.shape, [&, init, rank = ctx.rank](std::int64_t off, std::span<float> o) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (read_per_rank) (*read_per_rank)[rank] += static_cast<std::int64_t>(o.size());
          if (largest_call) *largest_call = std::max(*largest_call, static_cast<std::int64_t>(o.size()));
        }
        init(off, o);
      }));
    }
    e.add_module("all", ids);
    std::vector<std::vector<float>> m;
    for (ParamId id : ids) m.push_back(e.gather_parameter(id));
    if (ctx.rank == 0) out = std::move(m);
  });
  return out;
}

TEST(SafetensorsImport, ReproducesTheParametersBitwiseAtAnotherStageAndWorldSize) {
  const std::string dir = zoe::test::temp_dir("st-import");
  const std::string path = dir + "/m.safetensors";
  const Exported x = train_and_export(config(3, OffloadDevice::nvme, dir), 2, 4, path, DType::f32);
  struct Target {
    int stage, world;
    OffloadDevice d;
  };
  for (Target t : {Target{0, 1, OffloadDevice::none}, Target{2, 2, OffloadDevice::cpu}, Target{3, 2, OffloadDevice::nvme},
                   Target{3, 3, OffloadDevice::none}}) {
    std::vector<std::int64_t> read;
    std::int64_t largest = 0;
    const auto back = import_all(path, config(t.stage, t.d, dir), t.world, &read, &largest);
    const std::string what = "stage " + std::to_string(t.stage) + ", world " + std::to_string(t.world);
    ASSERT_EQ(back.size(), x.masters.size()) << what;
    std::int64_t total = 0;
    for (std::size_t i = 0; i < back.size(); ++i) {
      total += static_cast<std::int64_t>(back[i].size());
      EXPECT_EQ(0, std::memcmp(back[i].data(), x.masters[i].data(), back[i].size() * 4)) << what << " " << x.names[i];
    }
    EXPECT_LE(largest, 24) << what << ": an initializer call read more than a sub-group";
    std::int64_t read_total = 0;
    for (std::int64_t r : read) read_total += r;
    if (t.stage == 3) {
      EXPECT_EQ(read_total, total) << what << ": each element read once, by the rank keeping it";
      for (std::int64_t r : read) EXPECT_LT(r, total) << what << ": a rank read more than its shard";
    } else {
      EXPECT_EQ(read_total, total * t.world) << what << ": stages 0-2 keep the whole parameters on every rank";
    }
  }
  fs::remove_all(dir);
}

TEST(SafetensorsImport, Bf16FileWidensExactly) {
  const std::string dir = zoe::test::temp_dir("st-import16");
  const std::string path = dir + "/h.safetensors";
  const Exported x = train_and_export(config(2, OffloadDevice::none, dir), 2, 2, path, DType::bf16);
  const auto back = import_all(path, config(3, OffloadDevice::none, dir), 2);
  for (std::size_t i = 0; i < back.size(); ++i)
    for (std::size_t k = 0; k < back[i].size(); ++k)
      ASSERT_EQ(back[i][k], kernels::bf16_to_f32(kernels::f32_to_bf16(x.masters[i][k]))) << x.names[i] << "[" << k << "]";
  fs::remove_all(dir);
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SafetensorsImport, WrongNameShapeOrDtypeFailsNamingTheTensor) {
  const std::string dir = zoe::test::temp_dir("st-bad");
  const std::string path = dir + "/x.safetensors";
  {
    io::SafetensorsWriter w(path, {{"w", "F32", {2, 3}}, {"ids", "I64", {2}}});
    const char zeros[40] = {};
    w.write(zeros, 40);
    w.commit();
  }
  auto f = SafetensorsFile::open(path);
  std::string m = message_of([&] { f->initializer("v", {2, 3}); });
  EXPECT_NE(m.find("has no tensor 'v'"), std::string::npos) << m;
  EXPECT_NE(m.find(path), std::string::npos) << m;
  m = message_of([&] { f->initializer("w", {3, 2}); });
  EXPECT_NE(m.find("tensor 'w' has shape [2, 3], the parameter [3, 2]"), std::string::npos) << m;
  m = message_of([&] { f->initializer("ids", {2}); });
  EXPECT_NE(m.find("tensor 'ids' is I64"), std::string::npos) << m;
  std::vector<float> three(3);
  EXPECT_THROW(f->initializer("w", {2, 3})(4, std::span<float>(three)), UsageError);  // past the end

  // A file cut short after it was opened: the engine's first forward names the parameter.
  auto init = f->initializer("w", {2, 3});
  fs::resize_file(path, fs::file_size(path) - 30);
  auto ranks = make_local_ranks(1, 60.0);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(config(0, OffloadDevice::none, dir), ctx);
    ParamId w = e.add_parameter("layer.w", {2, 3}, init);
    ModuleId mod = e.add_module("m", {w});
    const std::string msg = message_of([&] { e.begin_forward(mod); });
    EXPECT_NE(msg.find("parameter 'layer.w'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("shrank"), std::string::npos) << msg;
  });
  fs::remove_all(dir);
}

TEST(SafetensorsExport, AFailedWriteFailsEveryRankAndLeavesNothing) {
  const std::string dir = zoe::test::temp_dir("st-fail");
  const std::string path = dir + "/missing-dir/m.safetensors";
  auto ranks = make_local_ranks(2, 30.0);
  std::vector<std::string> messages(2);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(config(3, OffloadDevice::none, dir), ctx);
    TestNet net(e, kTied);
    messages[ctx.rank] = message_of([&] { e.export_safetensors(path); });
    // The engine is still usable: a good export after the failed one.
    e.export_safetensors(dir + "/ok.safetensors");
  });
  EXPECT_NE(messages[0].find("missing-dir"), std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("failed on rank(s) 0"), std::string::npos) << messages[1];
  EXPECT_FALSE(fs::exists(dir + "/missing-dir"));
  EXPECT_EQ(io::SafetensorsReader(dir + "/ok.safetensors").header().tensors.size(), 5u);
  fs::remove_all(dir);
}

TEST(SafetensorsExport, RefusedWhileAModuleIsActive) {
  const std::string dir = zoe::test::temp_dir("st-active");
  auto ranks = make_local_ranks(1, 30.0);
  run_ranks(ranks, [&](RankContext& ctx) {
    Engine e(config(3, OffloadDevice::none, dir), ctx);
    std::vector<float> w(10, 0.5f);
    ModuleId m = e.add_module("m", {e.add_parameter("w", {10}, w)});
    {
      ForwardScope f(e, m);
      const std::string msg = message_of([&] { e.export_safetensors(dir + "/x.safetensors"); });
      EXPECT_NE(msg.find("while module 'm' is still in forward"), std::string::npos) << msg;
    }
    e.export_safetensors(dir + "/x.safetensors");  // after end_forward
  });
  EXPECT_TRUE(fs::exists(dir + "/x.safetensors"));
  fs::remove_all(dir);
}

// zero_optimization.gather_16bit_weights_on_model_save false: at stage 3 the export refuses
// before writing anything (DeepSpeed's save_16bit_model saves nothing then); at stage 2 the key
// has no effect, as in DeepSpeed.
TEST(SafetensorsExport, Stage3RefusesWhenGather16bitWeightsOnModelSaveIsFalse) {
  const std::string dir = zoe::test::temp_dir("st-gather16");
  for (int stage : {2, 3}) {
    auto ranks = make_local_ranks(2, 30.0);
    run_ranks(ranks, [&](RankContext& ctx) {
      Config c = config(stage, OffloadDevice::none, dir);
      c.zero_optimization.gather_16bit_weights_on_model_save = false;
      Engine e(c, ctx);
      std::vector<float> w(40, 0.5f);
      e.add_module("m", {e.add_parameter("w", {40}, w)});
      const std::string path = dir + "/s" + std::to_string(stage) + ".safetensors";
      if (stage == 3) {
        const std::string msg = message_of([&] { e.export_safetensors(path); });
        EXPECT_NE(msg.find("stage3_gather_16bit_weights_on_model_save is false"), std::string::npos) << msg;
      } else {
        e.export_safetensors(path);
      }
    });
  }
  EXPECT_TRUE(fs::exists(dir + "/s2.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/s3.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/s3.safetensors.tmp"));
  fs::remove_all(dir);
}

}  // namespace
