// zoe-gpt's --export, --init-from and --eval-only: the exported file has Hugging Face GPT-2's
// tensor names and shapes for the model (built here independently from HF's GPT2Model: wte, wpe,
// h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj} with Conv1D's [in, out]
// weights, ln_f; no lm_head, which is tied to wte); starting from it reproduces the parameters
// bitwise and the same validation loss; HF's variants (the "transformer." prefix, the attention
// mask buffers, lm_head stored equal to wte) load; anything else fails naming the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "examples/gpt/hf_weights.hpp"
#include "examples/gpt/options.hpp"
#include "io/safetensors.hpp"
#include "tests/gpt/tiny_run.hpp"
#include "zoe/error.hpp"

namespace gpt {
namespace {

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// HF GPT2Model's state dict for (V, T, L, C), in HF's module order.
std::vector<std::pair<std::string, std::vector<std::int64_t>>> hf_gpt2_tensors(int V, int T, int L, int C) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> t = {{"wte.weight", {V, C}}, {"wpe.weight", {T, C}}};
  for (int l = 0; l < L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    t.push_back({h + "ln_1.weight", {C}});
    t.push_back({h + "ln_1.bias", {C}});
    t.push_back({h + "attn.c_attn.weight", {C, 3 * C}});  // Conv1D(3C, C): weight [nx = C, nf = 3C]
    t.push_back({h + "attn.c_attn.bias", {3 * C}});
    t.push_back({h + "attn.c_proj.weight", {C, C}});
    t.push_back({h + "attn.c_proj.bias", {C}});
    t.push_back({h + "ln_2.weight", {C}});
    t.push_back({h + "ln_2.bias", {C}});
    t.push_back({h + "mlp.c_fc.weight", {C, 4 * C}});
    t.push_back({h + "mlp.c_fc.bias", {4 * C}});
    t.push_back({h + "mlp.c_proj.weight", {4 * C, C}});
    t.push_back({h + "mlp.c_proj.bias", {C}});
  }
  t.push_back({"ln_f.weight", {C}});
  t.push_back({"ln_f.bias", {C}});
  return t;
}

TEST(GptExport, NamesAndShapesAreHuggingFaceGpt2s) {
  const TokenSplit data = test::synthetic_tokens();
  const Tokenizer no_tokenizer;
  const test::TempDir dir("st_names");
  for (zoe::DType dt : {zoe::DType::f32, zoe::DType::bf16}) {
    TrainOptions o = test::tiny(3, zoe::OffloadDevice::none, dir / "nvme", 2);
    o.export_path = dir / "model.safetensors";
    o.export_dtype = dt;
    train(o, data, no_tokenizer, false);
    const zoe::io::SafetensorsReader r(o.export_path);
    const auto want = hf_gpt2_tensors(64, 16, 2, 16);
    ASSERT_EQ(r.header().tensors.size(), want.size());
    for (const auto& [name, shape] : want) {
      const zoe::io::SafetensorsEntry* t = r.header().find(name);
      ASSERT_TRUE(t) << name;
      EXPECT_EQ(t->shape, shape) << name;
      EXPECT_EQ(t->dtype, dt == zoe::DType::f32 ? "F32" : "BF16") << name;
    }
    EXPECT_EQ(r.header().find("lm_head.weight"), nullptr);  // tied: wte only, as HF stores GPT-2
    EXPECT_EQ(r.header().metadata.at("format"), "pt");
    EXPECT_EQ(r.header().metadata.at("n_layer"), "2");
    EXPECT_EQ(r.header().metadata.at("n_embd"), "16");
  }
}

TEST(GptExport, InitFromTheExportReproducesParametersAndValidationLossBitwise) {
  const TokenSplit data = test::synthetic_tokens();
  const Tokenizer no_tokenizer;
  const test::TempDir dir("st_init");
  std::filesystem::create_directories(dir / "nvme");
  TrainOptions o = test::tiny(3, zoe::OffloadDevice::nvme, dir / "nvme", 4);
  o.export_path = dir / "trained.safetensors";
  const TrainSummary trained = train(o, data, no_tokenizer, false, true);
  ASSERT_EQ(trained.losses.size(), 4u);

  // Evaluate the file at another stage and tier, without training.
  TrainOptions e = test::tiny(2, zoe::OffloadDevice::cpu, dir / "nvme", 4);
  e.init_from = o.export_path;
  e.eval_only = true;
  e.export_path = dir / "again.safetensors";  // exporting what was imported gives the same file
  const TrainSummary evaluated = train(e, data, no_tokenizer, false, true);
  EXPECT_TRUE(evaluated.losses.empty()) << "--eval-only trained";
  EXPECT_TRUE(same_bits(evaluated.final_val_loss, trained.final_val_loss))
      << evaluated.final_val_loss << " vs " << trained.final_val_loss;
  ASSERT_EQ(evaluated.parameters.size(), trained.parameters.size());
  for (const auto& [name, value] : trained.parameters) {
    const auto& back = evaluated.parameters.at(name);
    ASSERT_EQ(back.size(), value.size()) << name;
    EXPECT_EQ(std::memcmp(back.data(), value.data(), value.size() * 4), 0) << name;
  }
  std::ifstream a(o.export_path, std::ios::binary), b(e.export_path, std::ios::binary);
  EXPECT_TRUE(std::equal(std::istreambuf_iterator<char>(a), {}, std::istreambuf_iterator<char>(b)));

  // Fine-tuning from the file trains (from its parameters: the first loss is that model's).
  TrainOptions f = test::tiny(3, zoe::OffloadDevice::none, dir / "nvme", 2);
  f.init_from = o.export_path;
  const TrainSummary tuned = train(f, data, no_tokenizer, false);
  EXPECT_LT(tuned.first_loss, trained.first_loss) << "did not start from the trained parameters";
}

// Rewrites `from` with each tensor renamed by `rename` (empty: dropped), plus `extra` tensors
// (their bytes from `extra_from`'s named tensor, or zeros).
void rewrite(const std::string& from, const std::string& to, const std::function<std::string(const std::string&)>& rename,
             const std::vector<std::pair<zoe::io::SafetensorsTensorSpec, std::string>>& extra = {}) {
  const zoe::io::SafetensorsReader r(from);
  std::vector<zoe::io::SafetensorsTensorSpec> specs;
  std::vector<const zoe::io::SafetensorsEntry*> sources;
  for (const auto& t : r.header().tensors) {
    const std::string n = rename(t.name);
    if (n.empty()) continue;
    specs.push_back({n, t.dtype, t.shape});
    sources.push_back(&t);
  }
  for (const auto& [spec, src] : extra) {
    specs.push_back(spec);
    sources.push_back(src.empty() ? nullptr : r.header().find(src));
  }
  zoe::io::SafetensorsWriter w(to, specs);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::size_t bytes = zoe::io::safetensors_dtype_size(specs[i].dtype);
    for (auto d : specs[i].shape) bytes *= static_cast<std::size_t>(d);
    std::vector<char> buf(bytes);
    if (sources[i]) r.read(*sources[i], 0, buf.data(), bytes);
    w.write(buf.data(), bytes);
  }
  w.commit();
}

std::string init_error(const std::string& path, const GptConfig& cfg) {
  try {
    InitFile f(path, make_model_spec(cfg));
  } catch (const zoe::Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(GptExport, InitFromAcceptsHuggingFaceVariantsAndRefusesTheRest) {
  const TokenSplit data = test::synthetic_tokens();
  const Tokenizer no_tokenizer;
  const test::TempDir dir("st_variants");
  TrainOptions o = test::tiny(2, zoe::OffloadDevice::none, dir / "nvme", 1);
  o.export_path = dir / "m.safetensors";
  const TrainSummary base = train(o, data, no_tokenizer, false, true);
  const GptConfig cfg = o.model;

  // GPT2LMHeadModel's names ("transformer." + lm_head tied, stored equal) and the mask buffers
  // older transformers saved.
  rewrite(o.export_path, dir / "hf.safetensors", [](const std::string& n) { return "transformer." + n; },
          {{{"lm_head.weight", "F32", {64, 16}}, "wte.weight"},
           {{"transformer.h.0.attn.bias", "F32", {1, 1, 16, 16}}, ""},
           {{"transformer.h.1.attn.masked_bias", "F32", {}}, ""}});
  EXPECT_EQ(init_error(dir / "hf.safetensors", cfg), "(accepted)");
  TrainOptions e = test::tiny(3, zoe::OffloadDevice::none, dir / "nvme", 1);
  e.init_from = dir / "hf.safetensors";
  e.eval_only = true;
  const TrainSummary hf = train(e, data, no_tokenizer, false, true);
  for (const auto& [name, value] : base.parameters)
    EXPECT_EQ(std::memcmp(hf.parameters.at(name).data(), value.data(), value.size() * 4), 0) << name;

  // lm_head that is not wte: the tie cannot hold it.
  rewrite(o.export_path, dir / "untied.safetensors", [](const std::string& n) { return n; },
          {{{"lm_head.weight", "F32", {64, 16}}, ""}});
  std::string m = init_error(dir / "untied.safetensors", cfg);
  EXPECT_NE(m.find("tensor 'lm_head.weight' differs from wte.weight"), std::string::npos) << m;
  // A tensor the model has no parameter for.
  rewrite(o.export_path, dir / "extra.safetensors", [](const std::string& n) { return n; },
          {{{"h.0.attn.rotary", "F32", {4}}, ""}});
  m = init_error(dir / "extra.safetensors", cfg);
  EXPECT_NE(m.find("tensor 'h.0.attn.rotary' [4] is not a parameter of this model"), std::string::npos) << m;
  // A missing one.
  rewrite(o.export_path, dir / "missing.safetensors",
          [](const std::string& n) { return n == "h.1.mlp.c_fc.bias" ? std::string() : n; });
  m = init_error(dir / "missing.safetensors", cfg);
  EXPECT_NE(m.find("no tensor 'h.1.mlp.c_fc.bias'"), std::string::npos) << m;
  // Another model shape.
  GptConfig wide = cfg;
  wide.n_embd = 32;
  m = init_error(o.export_path, wide);
  EXPECT_NE(m.find("tensor 'wte.weight' has shape [64, 16], the model's [64, 32]"), std::string::npos) << m;
  EXPECT_NE(m.find("--width"), std::string::npos) << m;
  // A damaged file: the reader's error, naming the file.
  std::filesystem::resize_file(dir / "extra.safetensors", 100);
  m = init_error(dir / "extra.safetensors", cfg);
  EXPECT_NE(m.find("safetensors file '" + (dir / "extra.safetensors") + "'"), std::string::npos) << m;
}

TrainOptions parse(std::vector<std::string> args) {
  args.insert(args.begin(), "zoe-gpt");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return parse_options(static_cast<int>(argv.size()), argv.data());
}

TEST(GptExport, Flags) {
  const test::TempDir dir("st_flags");
  { std::ofstream(dir / "w.safetensors") << "x"; }
  const TrainOptions o = parse({"--export", dir / "out.safetensors", "--export-dtype", "bf16", "--init-from",
                                dir / "w.safetensors", "--eval-only"});
  EXPECT_EQ(o.export_path, dir / "out.safetensors");
  EXPECT_EQ(o.export_dtype, zoe::DType::bf16);
  EXPECT_EQ(o.init_from, dir / "w.safetensors");
  EXPECT_TRUE(o.eval_only);
  EXPECT_EQ(parse({}).export_dtype, zoe::DType::f32);
  EXPECT_THROW(parse({"--init-from", dir / "w.safetensors", "--resume", "--checkpoint-dir", dir.str()}), zoe::Error);
  EXPECT_THROW(parse({"--eval-only", "--stop-after", "3", "--checkpoint-dir", dir.str()}), zoe::Error);
}

}  // namespace
}  // namespace gpt
