// Offline checkpoint tools over format 2 (and format 1 where the model is known): verify
// every rank file against the manifest, and rewrite a checkpoint for another world size or
// stage (zoe-ckpt reshard). Both stream: host memory holds one chunk of `chunk_elements`
// elements (12 bytes each; a frozen group's: its stored values, 2 or 4 bytes, copied as they
// are) and a 1 MiB read buffer, whatever the model's size.
//
// Thread-safety: plain functions, one thread. Errors: as CheckpointReader (CorruptionError,
// SystemError, IoError naming the file) and FileWriter (IoError ENOSPC, ...).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "src/core/checkpoint/checkpoint_manifest.hpp"
#include "src/core/checkpoint/checkpoint_output.hpp"

namespace zoe::ckpt {

/// Called with (bytes done, bytes in all) as work proceeds (a progress bar); may be empty.
using Progress = std::function<void(std::uint64_t done, std::uint64_t total)>;

/// Reads and parses `dir`/manifest.json (or `dir`.old's when `dir` is incomplete, as a load
/// does: see choose_for_load). Throws CorruptionError / SystemError naming the file.
Manifest read_manifest_file(const std::string& dir);

/// Checks every rank file of the checkpoint in `dir` (header, rank, save id, size, every
/// group's CRC32C). Throws on the first problem, naming the file and what is wrong.
void verify_checkpoint(const std::string& dir, const Manifest& m, const Progress& progress = {});

/// Writes the checkpoint in `in` (manifest `m`, verified first) as a new checkpoint `out` for
/// `world_size` ranks at `stage` (chunks of `chunk_elements`), through `out`.tmp and the
/// directory protocol (checkpoint_dir.hpp). Counters, loss scaler and client state are kept.
/// Loading `out` at `world_size` gives exactly the values loading `in` there gives. Before
/// anything is written, check_reshard_output(in, out, overwrite) (checkpoint_output.hpp): an
/// output that is a file, a directory zoe did not write, or overlaps `in` is a UsageError
/// naming it, as is an existing checkpoint there unless `overwrite` is replace_checkpoint.
/// Throws UsageError for world_size outside [1, 65536], stage outside [0, 3] or
/// chunk_elements < 1, and as verify_checkpoint / FileWriter otherwise.
void reshard_checkpoint(const std::string& in, const Manifest& m, const std::string& out, int world_size, int stage,
                        std::int64_t chunk_elements, const Progress& progress = {},
                        Overwrite overwrite = Overwrite::refuse);

}  // namespace zoe::ckpt
