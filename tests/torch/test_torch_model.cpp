// zoe::TorchModel: a small libtorch model trained through zoe (stages 0-3, 1 and 2 ranks as
// threads, fp32) ends where plain libtorch with torch::optim::AdamW ends (1e-5 relative after 10
// steps), bitwise equal across stages; frozen parts stay bitwise unchanged; no gathered parameter
// outlives step(); activation checkpointing changes no bit; a tensor shared by two parts (tied
// weights) trains as in libtorch; misuse is refused naming the part; fp16 with the engine's
// dynamic loss scale trains close to fp32 and skips the steps whose gradients overflowed.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <map>

#include "zoe/engine.hpp"
#include "zoe/torch.hpp"

using namespace zoe;

namespace {

constexpr int kIn = 8, kWidth = 16, kOut = 4, kBlocks = 3, kBatch = 16, kSteps = 10;
constexpr double kLr = 1e-2, kDecay = 0.01;

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int d)
      : fc1(register_module("fc1", torch::nn::Linear(d, 2 * d))), fc2(register_module("fc2", torch::nn::Linear(2 * d, d))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

// in -> blocks (block 1 frozen) -> head, times `scale` (a parameter of the root: the "<rest>").
struct NetImpl : torch::nn::Module {
  NetImpl() {
    in = register_module("in", torch::nn::Linear(kIn, kWidth));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < kBlocks; ++i) blocks->push_back(Block(kWidth));
    head = register_module("head", torch::nn::Linear(kWidth, kOut));
    scale = register_parameter("scale", torch::linspace(0.5, 1.5, kOut));
    for (auto& p : blocks[1]->parameters()) p.set_requires_grad(false);
  }
  torch::nn::Linear in{nullptr}, head{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::Tensor scale;
};
TORCH_MODULE(Net);

Net make_net() {
  torch::manual_seed(42);
  return Net();
}

struct Batch {
  torch::Tensor x, y;
};
std::vector<Batch> make_data() {
  torch::manual_seed(7);
  std::vector<Batch> data;
  for (int s = 0; s < kSteps; ++s) data.push_back({torch::randn({kBatch, kIn}), torch::randn({kBatch, kOut})});
  return data;
}

using Values = std::map<std::string, torch::Tensor>;

Values initial_values() {
  Values v;
  for (const auto& p : make_net()->named_parameters()) v[p.key()] = p.value().detach().clone();
  return v;
}

// The reference: plain libtorch, full batch, torch::optim::AdamW.
Values train_plain(const std::vector<Batch>& data) {
  Net net = make_net();
  std::vector<torch::Tensor> trainable;
  for (auto& p : net->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  torch::optim::AdamW opt(trainable, torch::optim::AdamWOptions(kLr).weight_decay(kDecay).eps(1e-8));
  for (const auto& b : data) {
    opt.zero_grad();
    torch::Tensor h = net->in(b.x);
    for (int i = 0; i < kBlocks; ++i) h = net->blocks[i]->as<Block>()->forward(h);
    torch::Tensor y = net->head(h) * net->scale;
    torch::mse_loss(y, b.y).backward();
    opt.step();
  }
  Values v;
  for (const auto& p : net->named_parameters()) v[p.key()] = p.value().detach().clone();
  return v;
}

Config config(int stage) {
  Config c;
  c.zero_optimization.stage = stage;
  c.optimizer.lr = kLr;
  c.optimizer.weight_decay = kDecay;
  c.zero_optimization.stage3_param_persistence_threshold = 0;
  c.zero_optimization.stage3_max_reuse_distance = 0;
  c.zoe.optimizer_threads = 1;
  return c;
}

struct Options {
  int stage = 0;
  int world = 1;
  bool checkpoint = false;
};

struct Result {
  Values values;
  std::vector<std::int64_t> device_buffers_after_step;  // rank 0, after each step
};

// One forward + backward of the wrapped net on rows [first, first + n) of `b`.
torch::Tensor zoe_loss(TorchModel& model, Net& net, const Batch& b, std::int64_t first, std::int64_t n) {
  torch::Tensor x = b.x.narrow(0, first, n), target = b.y.narrow(0, first, n);
  torch::Tensor h = model.run(model.part("in"), [&](const torch::Tensor& v) { return net->in(v); }, x);
  for (int i = 0; i < kBlocks; ++i) {
    auto block = net->blocks[i]->as<Block>();
    h = model.run(model.part("blocks." + std::to_string(i)), [block](const torch::Tensor& v) { return block->forward(v); }, h);
  }
  h = model.run(model.part("head"), [&](const torch::Tensor& v) { return net->head(v); }, h);
  h = model.run(model.part("<rest>"), [&](const torch::Tensor& v) { return v * net->scale; }, h);
  return torch::mse_loss(h, target);
}

Result train_zoe(const std::vector<Batch>& data, const Options& o) {
  std::vector<Net> nets;
  for (int r = 0; r < o.world; ++r) nets.push_back(make_net());  // one thread seeds torch's generator
  Result result;
  std::vector<Values> finals(o.world);
  run_ranks(make_local_ranks(o.world, 60.0), [&](RankContext& ctx) {
    torch::set_num_threads(1);  // OpenMP's thread count is per thread: fix it in each rank
    Engine engine(config(o.stage), ctx);
    Net& net = nets[ctx.rank];
    std::vector<TorchPart> parts{{"in", o.checkpoint}};
    for (const auto& name : TorchModel::children_of(*net, "blocks")) parts.push_back({name, o.checkpoint});
    parts.push_back({"head", o.checkpoint});
    TorchModel model(engine, net.ptr(), parts);
    const std::int64_t micro = kBatch / o.world;
    for (const auto& b : data) {
      zoe_loss(model, net, b, ctx.rank * micro, micro).backward();
      engine.step();
      if (ctx.rank == 0) result.device_buffers_after_step.push_back(engine.memory_report().device_buffers);
    }
    for (auto& [name, value] : model.parameter_values()) finals[ctx.rank][name] = value;
  });
  result.values = finals[0];
  return result;
}

double max_rel_diff(const Values& a, const Values& b) {
  double num = 0, den = 0;
  for (const auto& [name, t] : b) {
    num = std::max(num, (a.at(name) - t).abs().max().item<double>());
    den = std::max(den, t.abs().max().item<double>());
  }
  return num / den;
}

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0;
}
bool bitwise_equal(const Values& a, const Values& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a)
    if (!b.count(name) || !bitwise_equal(t, b.at(name))) return false;
  return true;
}

class TorchModelTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

}  // namespace

TEST_F(TorchModelTest, StagesAndWorldSizesMatchPlainLibtorchAdamW) {
  auto data = make_data();
  Values plain = train_plain(data);
  Values init = initial_values();
  ASSERT_EQ(plain.size(), 4u * kBlocks + 5);  // in, blocks (fc1, fc2), head: weight + bias; scale
  ASSERT_GT(max_rel_diff(plain, init), 1e-3) << "the reference did not move";
  for (int world : {1, 2}) {
    Result stage0;
    for (int stage = 0; stage <= 3; ++stage) {
      Result r = train_zoe(data, {stage, world});
      ASSERT_EQ(r.values.size(), plain.size());
      double diff = max_rel_diff(r.values, plain);
      EXPECT_LE(diff, 1e-5) << "stage " << stage << " world " << world;
      std::cout << "stage " << stage << " world " << world << ": max rel diff to libtorch AdamW " << diff << "\n";
      for (const auto& [name, v] : init)
        if (name.rfind("blocks.1.", 0) == 0)
          EXPECT_TRUE(bitwise_equal(r.values.at(name), v)) << "frozen " << name << " changed at stage " << stage;
      if (stage == 0)
        stage0 = r;
      else
        EXPECT_TRUE(bitwise_equal(r.values, stage0.values)) << "stage " << stage << " differs from stage 0 at world " << world;
      if (stage == 3)
        for (std::int64_t bytes : r.device_buffers_after_step) EXPECT_EQ(bytes, 0) << "gathered buffers held after step()";
    }
  }
}

TEST_F(TorchModelTest, ActivationCheckpointingChangesNoBit) {
  auto data = make_data();
  for (int stage : {0, 2}) {
    Result plain = train_zoe(data, {stage, 2, false});
    Result ckpt = train_zoe(data, {stage, 2, true});
    EXPECT_TRUE(bitwise_equal(ckpt.values, plain.values)) << "stage " << stage;
  }
}

TEST_F(TorchModelTest, MisuseIsRefusedNamingThePart) {
  auto data = make_data();
  run_ranks(make_local_ranks(1, 60.0), [&](RankContext& ctx) {
    Engine engine(config(3), ctx);
    Net net = make_net();
    TorchModel model(engine, net.ptr(), {{"in"}, {"blocks.0"}, {"blocks.1"}, {"blocks.2"}, {"head"}});
    auto in = model.part("in");
    auto fwd = [&](const torch::Tensor& v) { return net->in(v); };
    // Unknown part, unknown submodule.
    EXPECT_THROW(model.part("nope"), UsageError);
    try {
      Net other = make_net();
      Engine e2(config(0), make_local_ranks(1)[0]);
      TorchModel bad(e2, other.ptr(), {{"blocks.7"}});
      ADD_FAILURE() << "an unknown submodule was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("'blocks.7'"), std::string::npos) << e.what();
    }
    // Used twice in one forward (shared weights): refused at the second forward.
    torch::Tensor h = model.run(in, fwd, data[0].x);
    try {
      model.run(in, fwd, data[0].x);
      ADD_FAILURE() << "a second forward before the backward was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("'in'"), std::string::npos) << e.what();
    }
    // Nesting: a part run inside another part's function.
    try {
      model.run(model.part("head"), [&](const torch::Tensor& v) { return model.run(in, fwd, v); }, h);
      ADD_FAILURE() << "a nested part was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("inside part 'head'"), std::string::npos) << e.what();
    }
    // Calling a wrapped submodule directly: its parameters are released outside run(), and any
    // operator on them throws zoe's error naming the parameter, its part and the operator.
    try {
      net->in(data[0].x);
      ADD_FAILURE() << "a wrapped part called directly ran";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("parameter 'in."), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("of part 'in'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("outside TorchModel::run"), std::string::npos) << e.what();
    }
    // The same for any other use of module->parameters() outside run() (an optimizer's, say).
    for (const torch::Tensor& p : net->parameters()) EXPECT_THROW(p.sum(), UsageError);
    // A backward that never reaches a part that ran: its next forward says so.
    torch::Tensor unused = model.run(model.part("blocks.0"), [&](const torch::Tensor& v) {
      return net->blocks[0]->as<Block>()->forward(v); }, h);
    h.sum().backward();
    unused = torch::Tensor();  // torch drops the part's graph
    try {
      model.run(model.part("blocks.0"), [&](const torch::Tensor& v) { return net->blocks[0]->as<Block>()->forward(v); }, h.detach());
      ADD_FAILURE() << "a dropped forward went unnoticed";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("'blocks.0'"), std::string::npos) << e.what();
    }
  });
}

TEST_F(TorchModelTest, EvaluationUnderNoGradNeedsNoBackward) {
  auto data = make_data();
  Values plain_init = initial_values();
  run_ranks(make_local_ranks(1, 60.0), [&](RankContext& ctx) {
    Engine engine(config(3), ctx);
    Net net = make_net();
    TorchModel model(engine, net.ptr(), {{"in"}, {"blocks.0"}, {"blocks.1"}, {"blocks.2"}, {"head"}});
    Net ref = make_net();
    torch::NoGradGuard no_grad;
    torch::Tensor a = model.run(model.part("in"), [&](const torch::Tensor& v) { return net->in(v); }, data[0].x);
    torch::Tensor b = model.run(model.part("in"), [&](const torch::Tensor& v) { return net->in(v); }, data[0].x);
    EXPECT_TRUE(bitwise_equal(a, b));
    EXPECT_TRUE(bitwise_equal(a, ref->in(data[0].x)));
  });
}

namespace {

// y = x W^T with a weight tensor given from outside (shared between two parts: tied weights).
struct SharedLinearImpl : torch::nn::Module {
  explicit SharedLinearImpl(const torch::Tensor& w) { weight = register_parameter("weight", w); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(torch::matmul(x, weight.t())); }
  torch::Tensor weight;
};
TORCH_MODULE(SharedLinear);

struct TiedNetImpl : torch::nn::Module {
  TiedNetImpl() {
    in = register_module("in", torch::nn::Linear(kIn, kWidth));
    torch::Tensor w = torch::randn({kWidth, kWidth}) / 4.0;
    m1 = register_module("m1", SharedLinear(w));
    m2 = register_module("m2", SharedLinear(w));
    head = register_module("head", torch::nn::Linear(kWidth, kOut));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(m2(m1(in(x)))); }
  torch::nn::Linear in{nullptr}, head{nullptr};
  SharedLinear m1{nullptr}, m2{nullptr};
};
TORCH_MODULE(TiedNet);

TiedNet make_tied() {
  torch::manual_seed(5);
  return TiedNet();
}

}  // namespace

TEST_F(TorchModelTest, TiedWeightsInTwoPartsAddTheirGradients) {
  auto data = make_data();
  // Reference: plain libtorch; the shared tensor once in the optimizer (parameters() lists it twice).
  Values plain;
  {
    TiedNet net = make_tied();
    std::vector<torch::Tensor> params;
    for (const auto& p : net->named_parameters())
      if (p.key() != "m2.weight") params.push_back(p.value());
    torch::optim::AdamW opt(params, torch::optim::AdamWOptions(kLr).weight_decay(kDecay).eps(1e-8));
    for (const auto& b : data) {
      opt.zero_grad();
      torch::mse_loss(net->forward(b.x), b.y).backward();
      opt.step();
    }
    for (const auto& p : net->named_parameters())
      if (p.key() != "m2.weight") plain[p.key()] = p.value().detach().clone();
  }
  for (int stage : {0, 3}) {
    std::vector<TiedNet> nets{make_tied(), make_tied()};
    std::vector<Values> finals(2);
    run_ranks(make_local_ranks(2, 60.0), [&](RankContext& ctx) {
      torch::set_num_threads(1);
      Engine engine(config(stage), ctx);
      TiedNet& net = nets[ctx.rank];
      TorchModel model(engine, net.ptr(), {{"in"}, {"m1"}, {"m2"}, {"head"}});
      for (const auto& b : data) {
        torch::Tensor x = b.x.narrow(0, ctx.rank * kBatch / 2, kBatch / 2), y = b.y.narrow(0, ctx.rank * kBatch / 2, kBatch / 2);
        torch::Tensor h = model.run(model.part("in"), [&](const torch::Tensor& v) { return net->in(v); }, x);
        h = model.run(model.part("m1"), [&](const torch::Tensor& v) { return net->m1(v); }, h);
        h = model.run(model.part("m2"), [&](const torch::Tensor& v) { return net->m2(v); }, h);
        h = model.run(model.part("head"), [&](const torch::Tensor& v) { return net->head(v); }, h);
        torch::mse_loss(h, y).backward();
        engine.step();
      }
      for (auto& [name, value] : model.parameter_values()) finals[ctx.rank][name] = value;
    });
    ASSERT_EQ(finals[0].size(), plain.size()) << "the shared tensor is one zoe parameter";
    EXPECT_LE(max_rel_diff(finals[0], plain), 1e-5) << "stage " << stage;
  }
}

namespace {
// fp16 compute with dynamic loss scaling, as a libtorch trainer uses it: the loss multiplied by
// engine.loss_scale() before backward; step() unscales, skips a step whose gradients overflowed
// and halves the scale. `initial_scale_power` 2^p; returns the final values and each step's result.
struct Fp16Run {
  Values values;
  std::vector<StepResult> steps;
  std::vector<Values> after;  // the values after each step
};
// Debian's CPU libtorch has no fp16 matrix multiply: each part widens its fp16 inputs and
// parameters to fp32, computes, and hands fp16 on (autograd casts the gradients back, so the
// parameters' gradients reach zoe's buffers in fp16, where the loss scale matters).
torch::Tensor linear32(const torch::nn::Linear& l, const torch::Tensor& x) {
  return torch::linear(x.to(torch::kFloat), l->weight.to(torch::kFloat), l->bias.to(torch::kFloat));
}
torch::Tensor fp16_loss(TorchModel& model, Net& net, const Batch& b) {
  auto half = [](const torch::Tensor& t) { return t.to(torch::kHalf); };
  torch::Tensor h = model.run(model.part("in"), [&](const torch::Tensor& v) { return half(linear32(net->in, v)); }, b.x.to(torch::kHalf));
  for (int i = 0; i < kBlocks; ++i) {
    auto block = net->blocks[i]->as<Block>();
    h = model.run(model.part("blocks." + std::to_string(i)), [&, block](const torch::Tensor& v) {
      return half(v.to(torch::kFloat) + linear32(block->fc2, torch::tanh(linear32(block->fc1, v))));
    }, h);
  }
  h = model.run(model.part("head"), [&](const torch::Tensor& v) { return half(linear32(net->head, v)); }, h);
  h = model.run(model.part("<rest>"), [&](const torch::Tensor& v) { return v.to(torch::kFloat) * net->scale.to(torch::kFloat); }, h);
  return torch::mse_loss(h, b.y);
}

Fp16Run train_fp16(const std::vector<Batch>& data, int stage, int initial_scale_power) {
  Net net = make_net();
  Fp16Run run;
  run_ranks(make_local_ranks(1, 60.0), [&](RankContext& ctx) {
    torch::set_num_threads(1);
    Config c = config(stage);
    c.fp16.enabled = true;
    c.fp16.initial_scale_power = initial_scale_power;
    c.fp16.hysteresis = 1;
    Engine engine(c, ctx);
    std::vector<TorchPart> parts{{"in"}};
    for (const auto& name : TorchModel::children_of(*net, "blocks")) parts.push_back({name});
    parts.push_back({"head"});
    TorchModel model(engine, net.ptr(), parts);
    for (const auto& b : data) {
      (fp16_loss(model, net, b) * engine.loss_scale()).backward();
      run.steps.push_back(engine.step());
      Values v;
      for (auto& [name, value] : model.parameter_values()) v[name] = value;
      run.after.push_back(std::move(v));
    }
    run.values = run.after.back();
  });
  return run;
}
}  // namespace

TEST_F(TorchModelTest, Fp16LossScalingTrainsAndSkipsOverflowedSteps) {
  auto data = make_data();
  Values plain = train_plain(data);  // fp32 libtorch AdamW
  Values init = initial_values();
  for (int stage : {0, 3}) {
    // A scale the fp16 gradients hold (2^8): every step taken, close to fp32 training (fp16's
    // 11-bit significand: about 1e-3 relative per value, grown over 10 steps).
    Fp16Run ok = train_fp16(data, stage, 8);
    for (const StepResult& r : ok.steps) {
      EXPECT_FALSE(r.skipped) << "stage " << stage;
      EXPECT_EQ(r.loss_scale, 256.0) << "stage " << stage;
    }
    const double diff = max_rel_diff(ok.values, plain), moved = max_rel_diff(plain, init);
    std::cout << "fp16 stage " << stage << ": max rel diff to fp32 libtorch AdamW " << diff << " (training moved "
              << moved << ")\n";
    EXPECT_LE(diff, 0.05 * moved) << "stage " << stage;
    // A scale that overflows fp16 (2^20 times gradients of about 0.1-1; 65504 is fp16's
    // largest value): the first steps are skipped, nothing changes, and the scale halves each
    // time until the gradients fit.
    Fp16Run over = train_fp16(data, stage, 20);
    ASSERT_TRUE(over.steps[0].skipped) << "stage " << stage;
    // Before any step: the fp32 master weights hold the initial values; a frozen part (block 1)
    // has no master, its values are the fp16 copies the engine was given.
    Values start = init;
    for (auto& [name, v] : start)
      if (name.rfind("blocks.1.", 0) == 0) v = v.to(torch::kHalf).to(torch::kFloat);
    EXPECT_TRUE(bitwise_equal(over.after[0], start)) << "a skipped step changed the parameters at stage " << stage;
    for (std::size_t s = 1; s < over.steps.size() && over.steps[s - 1].skipped; ++s)
      EXPECT_EQ(over.steps[s].loss_scale, over.steps[s - 1].loss_scale / 2) << "step " << s << " stage " << stage;
    EXPECT_FALSE(over.steps.back().skipped) << "the scale never came down at stage " << stage;
    const auto skipped = std::count_if(over.steps.begin(), over.steps.end(), [](const StepResult& r) { return r.skipped; });
    std::cout << "fp16 stage " << stage << ", initial scale 2^20: " << skipped << " steps skipped, final scale "
              << over.steps.back().loss_scale << "\n";
    EXPECT_LT(over.steps.back().loss_scale, std::ldexp(1.0, 20));
  }
}
