// The trainer's command line (CLI11) and how it becomes a zoe::Config.
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>

#include "examples/gpt/lm_head.hpp"
#include "examples/gpt/model_spec.hpp"
#include "zoe/config.hpp"

namespace gpt {

struct TrainOptions {
  GptConfig model;               // --layers --heads --width --context
  int steps = 300;               // optimizer steps
  double lr = 3e-3;              // peak learning rate
  double min_lr_ratio = 0.1;     // cosine floor = lr * ratio
  int warmup = 30;               // warmup steps
  int world_size = 2;            // ranks as threads (ignored under a launcher)
  int threads_per_rank = 0;      // OpenMP threads per rank; 0 = cores / world_size
  std::uint64_t seed = 1234;
  std::string data_dir;          // fetched data (scripts/fetch-data.sh)
  std::string cache_dir;         // token cache; default <data_dir>/tokens
  double val_fraction = 0.05;
  std::string metrics_file;      // .csv or JSON Lines
  int eval_interval = 50;        // steps between validation losses (0 = only at the end)
  int eval_batches = 8;          // micro-batches of validation per evaluation (all ranks)
  bool activation_checkpointing = false;
  int sample_length = 64;        // tokens generated at the end (0 = none)
  int top_k = 40;                // 1 = greedy
  std::string prompt = "\n";
  int log_every = 10;            // progress lines when stderr is not a terminal
  int head_chunk = 256;          // rows per chunk of the fused lm_head + cross-entropy
  HeadPrecision head_precision = HeadPrecision::bf16;  // training head matmuls (lm_head.hpp)
  // Compute backend of a rank on the host device: the CPU ops (Eigen, oneDNN), or the CUDA
  // backend's kernels run on the host (KernelOps: slow; checks the GPU path's math without a
  // GPU). A rank on a GPU always computes with CudaOps.
  enum class HostOps { cpu, kernels };
  HostOps host_ops = HostOps::cpu;
  bool from_environment = false; // one process per rank under torchrun / mpirun / srun
  std::string checkpoint_dir;    // where checkpoints go (empty = none); see checkpoint.hpp
  int checkpoint_interval = 100; // steps between checkpoints (0 = only at the end)
  bool resume = false;           // continue the run checkpointed in checkpoint_dir
  int stop_after = 0;            // stop (and checkpoint) after this step; 0 = run to `steps`
  bool profile = false;          // print where each rank's step time goes (step_profile.hpp)
  /// Per step (rank 0): wall time, the trainer's compute time, NVMe bytes read / written
  /// (/proc/self/io); at the end the construction time, VmHWM and the pinned staging (scale-demo.sh).
  bool step_report = false;
  std::string init_from;         // initial parameters from this safetensors file (hf_weights.hpp)
  std::string export_path;       // write the final parameters here as safetensors (HF GPT-2 names)
  zoe::DType export_dtype = zoe::DType::f32;  // f32 (the master weights) or bf16
  bool eval_only = false;        // no training: validation loss and the sample only

  zoe::Config engine;            // the merged engine configuration (--config + flags)
};

/// Parses argv. --help prints usage and exits 0 through CLI11; a bad flag throws CLI::ParseError
/// (handled by main). The engine config starts from --config FILE (Config::from_json_file) or,
/// without one, from the trainer's defaults (stage 3, optimizer on NVMe, fp32 compute; --precision
/// bf16|fp16 sets bf16.enabled / fp16.enabled, over the file's); every flag given
/// explicitly overrides the matching key; a flag given twice takes the last value. Throws
/// zoe::ConfigError for invalid values, zoe::Error for --resume or --stop-after without
/// --checkpoint-dir, --init-from with --resume (the checkpoint holds the parameters), and
/// --eval-only with --stop-after.
TrainOptions parse_options(int argc, char** argv);

}  // namespace gpt
