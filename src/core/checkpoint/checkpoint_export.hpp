// A checkpoint's parameters as one safetensors file, offline (zoe-ckpt export): the bytes
// Engine::export_safetensors writes for the engine state the checkpoint holds, whatever world
// size and stage saved it. Tensors are the manifest's parameters in its order (group by group,
// then the group's parameters: the engine's storage order), named and shaped as saved, their
// fp32 master weights (state 0) read from the rank files that hold them (a frozen parameter:
// its compute-dtype values widened exactly, as the live export widens them) and rounded exactly
// as the live export rounds (safetensors_rounding.hpp).
//
// Streams: host memory holds one piece of `piece_elements` fp32 elements plus its rounded copy,
// whatever the model's size; the checkpoint is verified (every CRC32C) before the output is
// created, and the file appears only when complete (SafetensorsWriter: `out`.tmp, fsync,
// rename), so a failure leaves `out` as it was.
//
// Thread-safety: one thread. Errors: as verify_checkpoint / CheckpointReader (CorruptionError,
// SystemError, IoError naming the rank file), SafetensorsWriter (SystemError naming `out`.tmp
// when it cannot be created, IoError ENOSPC), UsageError for a dtype other than f32 / bf16 / f16,
// piece_elements < 1, or an `out` (or `out`.tmp) that is `dir` or inside it
// (check_export_output: one of its rank files, its manifest), refused before anything is written.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "src/core/checkpoint/checkpoint_manifest.hpp"
#include "src/core/checkpoint/checkpoint_reshard.hpp"
#include "zoe/dtype.hpp"

namespace zoe::ckpt {

/// fp32 elements per piece by default: 4 MiB of fp32 (plus 2 MiB rounded).
inline constexpr std::int64_t kExportPieceElements = std::int64_t{1} << 20;

/// Writes the parameters of the checkpoint in `dir` (manifest `m`) to the safetensors file
/// `out` as `dtype`, with `metadata` as its "__metadata__". `verify_progress` sees the
/// verification (bytes of the rank files checked), then `export_progress` the export (bytes of
/// fp32 values read); either may be empty.
void export_safetensors(const std::string& dir, const Manifest& m, const std::string& out, DType dtype,
                        const std::map<std::string, std::string>& metadata = {},
                        std::int64_t piece_elements = kExportPieceElements, const Progress& verify_progress = {},
                        const Progress& export_progress = {});

}  // namespace zoe::ckpt
