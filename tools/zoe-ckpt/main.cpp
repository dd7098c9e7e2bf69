// zoe-ckpt: inspect, verify, reshard and export (safetensors) zoe checkpoints (format 2:
// manifest.json + rank files, src/core/checkpoint/checkpoint_manifest.hpp) without an engine. The work
// lives in src/core/checkpoint/checkpoint_{manifest,reader,reshard,export}.* (tested in tests/core); this
// file is the CLI (export's options: export.hpp). Exit status 0 on success, 1 when a
// checkpoint is bad or a command fails (the message names the file and what is wrong), 2 on
// bad options (CLI11).
#include <CLI/CLI.hpp>

#include <limits>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "src/core/checkpoint/checkpoint_dir.hpp"
#include "src/core/checkpoint/checkpoint_manifest.hpp"
#include "src/core/checkpoint/checkpoint_reshard.hpp"
#include "tools/zoe-ckpt/export.hpp"
#include "tools/zoe-ckpt/locate.hpp"
#include "zoe/error.hpp"

namespace {
using namespace zoe::ckpt;

std::string mib(std::uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return b;
}

// A one-line progress bar on stderr when it is a terminal (quiet otherwise).
Progress bar(const std::string& what) {
  if (!::isatty(STDERR_FILENO)) return {};
  return [what, last = -1](std::uint64_t done, std::uint64_t total) mutable {
    const int pct = total ? static_cast<int>(100 * done / total) : 100;
    if (pct == last) return;
    last = pct;
    std::fprintf(stderr, "\r%s [%-40s] %3d%%", what.c_str(), std::string(static_cast<std::size_t>(pct * 40 / 100), '#').c_str(), pct);
    if (done >= total) std::fprintf(stderr, "\n");
  };
}

void inspect(const std::string& dir, bool params) {
  const Manifest m = read_manifest_file(dir);
  std::int64_t elements = 0, count = 0, frozen_elements = 0, frozen_count = 0;
  for (const GroupEntry& g : m.groups)
    for (const ParamEntry& p : g.params) {
      elements += p.numel, ++count;
      if (g.frozen) frozen_elements += p.numel, ++frozen_count;
    }
  std::uint64_t bytes = 0;
  for (const RankFileEntry& f : m.files) bytes += f.bytes;
  std::cout << "checkpoint " << dir << " (format " << m.version << ", id " << std::hex << m.id << std::dec << ")\n"
            << "  saved at world size " << m.world_size << ", ZeRO stage " << m.stage << ", compute dtype "
            << m.compute_dtype << ", chunks of " << m.chunk_elements << " elements\n"
            << "  step " << m.step << " (" << m.step_calls << " step() calls, " << m.skipped_steps << " skipped), lr "
            << m.lr << ", loss scale " << m.loss_scale << " (" << m.good_steps << " good steps, hysteresis "
            << m.hysteresis_left << ")\n"
            << "  " << m.groups.size() << " groups, " << count << " parameters, " << elements << " elements\n";
  if (frozen_count > 0)
    std::cout << "  frozen: " << frozen_count << " parameters, " << frozen_elements << " elements (values in "
              << m.compute_dtype << ", no optimizer states)\n";
  std::cout << "  " << m.files.size() << " rank files, " << mib(bytes) << " (fp32 master, exp_avg, exp_avg_sq"
            << (frozen_count > 0 ? "; frozen values" : "") << ")\n"
            << "  client state: " << (m.client_state.empty() ? "(none)" : std::to_string(m.client_state.size()) + " bytes")
            << "\n";
  if (!params) return;
  for (const GroupEntry& g : m.groups) {
    std::cout << "  group " << g.name << " (" << g.padded_numel << " elements padded" << (g.frozen ? ", frozen" : "")
              << ")\n";
    for (const ParamEntry& p : g.params) {
      std::cout << "    " << p.name << " [";
      for (std::size_t d = 0; d < p.shape.size(); ++d) std::cout << (d ? ", " : "") << p.shape[d];
      std::cout << "] " << (g.frozen ? m.compute_dtype + " frozen" : std::string("fp32")) << " at " << p.offset << "\n";
    }
  }
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zoe-ckpt: inspect, verify, reshard and export zoe checkpoints"};
  app.require_subcommand(1);
  std::string dir, out;
  bool params = false, force = false;
  int world = 0, stage = -1;
  std::int64_t chunk = 1 << 20;

  auto* c_inspect = app.add_subcommand("inspect", "print the manifest's summary (and --params: every parameter)");
  c_inspect->add_option("checkpoint", dir, "checkpoint directory")->required();
  c_inspect->add_flag("--params", params, "list every parameter with its shape and offset");

  auto* c_verify = app.add_subcommand("verify", "check every rank file: presence, header, size, checksums");
  c_verify->add_option("checkpoint", dir, "checkpoint directory")->required();

  auto* c_reshard = app.add_subcommand("reshard", "write the checkpoint for another world size (and stage)");
  c_reshard->add_option("checkpoint", dir, "checkpoint directory")->required();
  c_reshard->add_option("output", out, "new checkpoint directory (written through OUTPUT.tmp)")->required();
  c_reshard->add_option("-n,--world-size", world, "ranks of the new checkpoint")->required()->check(CLI::Range(1, 1 << 16));
  c_reshard->add_option("-s,--stage", stage, "ZeRO stage of the new checkpoint (default: the saved one)")->check(CLI::Range(0, 3));
  c_reshard->add_flag("--force", force,
                      "replace OUTPUT when it is a zoe checkpoint already (anything else there is always refused)");
  c_reshard->add_option("--chunk", chunk, "elements per chunk (host memory: 12 bytes each)")->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::numeric_limits<std::int64_t>::max()));  // PositiveNumber prints 309 digits

  auto* c_export = app.add_subcommand("export", "write the parameters (fp32 master weights; frozen: their values) as safetensors");
  zoe_ckpt::ExportOptions eo;
  c_export->add_option("checkpoint", eo.checkpoint, "checkpoint directory")->required();
  c_export->add_option("output", eo.output, "safetensors file (written through OUTPUT.tmp)")->required();
  c_export->add_option("--dtype", eo.dtype, "fp32, or bf16 / fp16 rounded to nearest even")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  c_export->add_option("--metadata", eo.metadata,
                       "KEY=VALUE for the header's __metadata__ (repeatable; Hugging Face expects format=pt)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a bad option: 2 (CLI11's message printed)
  }
  try {
    // A crash in a save's publish leaves DIR incomplete and DIR.old complete: read what a load
    // would read (the manifest and the rank files of one directory); a trainer's checkpoint
    // directory: its engine/ (locate.hpp).
    std::string& checkpoint = *c_export ? eo.checkpoint : dir;
    checkpoint = zoe_ckpt::directory_to_read(checkpoint, std::cerr);
    if (*c_inspect) {
      inspect(dir, params);
    } else if (*c_verify) {
      const Manifest m = read_manifest_file(dir);
      verify_checkpoint(dir, m, bar("verifying"));
      std::cout << "checkpoint " << dir << ": manifest and " << m.files.size()
                << " rank files complete, every checksum matches\n";
    } else if (*c_reshard) {
      const Manifest m = read_manifest_file(dir);
      const int to_stage = stage >= 0 ? stage : m.stage;
      reshard_checkpoint(dir, m, out, world, to_stage, chunk, bar("resharding"),
                         force ? Overwrite::replace_checkpoint : Overwrite::refuse);
      std::cout << "checkpoint " << dir << " (world size " << m.world_size << ", stage " << m.stage << ") written to "
                << out << " for world size " << world << ", stage " << to_stage << "\n";
    } else if (*c_export) {
      zoe_ckpt::export_checkpoint(eo, bar("verifying"), bar("exporting"));
    }
  } catch (const zoe::Error& e) {
    std::cerr << "zoe-ckpt: " << e.message() << "\n";
    return 1;
  }
  return 0;
}
