// Engine::export_safetensors: every parameter's fp32 master value to one safetensors file,
// streamed. The file's tensors are the groups' parameters in flat-buffer order (group by group,
// then the layout's slots), so the file is written front to back while the states arrive in
// flat order: stages 1-3 hold rank r's shard of each group as its optimizer range, so for each
// group, rank by rank, sub-group by sub-group, the owner reads one sub-group's master weights
// (device memory or the offload tier) and broadcasts it; rank 0 keeps the live elements (the
// padding between parameters and at the shard's end is dropped), rounds them to the export
// dtype and appends them. Stage 0 keeps every state on every rank: rank 0 reads its own. Host
// memory: one sub-group of fp32 plus its rounded copy; device memory: one sub-group.
//
// Failures: a rank whose read or write fails keeps joining the broadcasts (with whatever its
// buffer holds) so no rank waits on a collective a failed rank never issues; the ranks agree on
// the outcome (one small all-reduce) before rank 0 publishes the file, and again after.
#include <algorithm>
#include <bit>
#include <exception>
#include <memory>

#include "io/safetensors.hpp"
#include "src/common/check.hpp"
#include "src/common/quote.hpp"
#include "src/core/engine_impl.hpp"
#include "src/core/names.hpp"
#include "src/core/checkpoint/safetensors_rounding.hpp"

namespace zoe {

// safetensors is little-endian; zoe reads and writes the host's bytes as they are.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");
namespace {

// The ranks whose `failed` is set, as "0, 2" (empty if none), known to every rank.
std::string agree_on_failures(core::EngineImpl& I, bool failed) {
  std::vector<double> flags(static_cast<std::size_t>(I.cx.world), 0.0);
  flags[static_cast<std::size_t>(I.cx.rank)] = failed ? 1.0 : 0.0;
  core::DeviceBuffer buf = I.cx.alloc(core::MemKind::buffer, DType::f32, 2 * I.cx.world);  // world doubles
  I.cx.device.copy(buf.data(), flags.data(), flags.size() * sizeof(double), *I.cx.side);
  I.cx.comm.all_reduce_f64(static_cast<double*>(buf.data()), flags.size(), *I.cx.side);
  I.cx.device.copy(flags.data(), buf.data(), flags.size() * sizeof(double), *I.cx.side);
  I.cx.device.synchronize(*I.cx.side);
  std::string bad;
  for (int r = 0; r < I.cx.world; ++r)
    if (flags[static_cast<std::size_t>(r)] != 0.0) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
  return bad;
}

// Rank 0's side: appends the live elements of flat ranges of a group, in ascending order, to the
// file (rounded to the export dtype: SafetensorsRounder, as zoe-ckpt export).
class FlatAppender {
 public:
  FlatAppender(io::SafetensorsWriter& out, DType dtype) : rounder_(out, dtype) {}

  /// values = the group's flat elements [begin, begin + values.size()).
  void append(const core::FlatLayout& L, std::int64_t begin, std::span<const float> values) {
    const std::int64_t end = begin + static_cast<std::int64_t>(values.size());
    for (std::size_t i = 0; i < L.param_count(); ++i) {
      const std::int64_t a = std::max(begin, L.offset(i)), b = std::min(end, L.offset(i) + L.numel(i));
      if (a >= b) continue;
      rounder_.append(values.subspan(static_cast<std::size_t>(a - begin), static_cast<std::size_t>(b - a)));
    }
  }

 private:
  core::SafetensorsRounder rounder_;
};

}  // namespace

// Engine::export_safetensors without the boundary (see there).
static void export_safetensors_of(core::EngineImpl& I, const std::string& path, DType dtype,
                                  const std::map<std::string, std::string>& metadata) {
  ZOE_CHECK_USAGE(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
                  "export_safetensors: unknown dtype ", static_cast<int>(dtype));
  ZOE_CHECK_USAGE(!path.empty(), "export_safetensors: empty path");
  for (const auto& [key, value] : metadata) {
    core::check_utf8("export_safetensors: the metadata key", key);
    core::check_utf8("export_safetensors: the metadata value", value);
  }
  // DeepSpeed's save_16bit_model saves nothing at stage 3 unless the key allows consolidation.
  ZOE_CHECK_USAGE(I.cx.config.zero_optimization.stage != 3 || I.cx.config.zero_optimization.gather_16bit_weights_on_model_save,
                  "export_safetensors(", detail::quoted_path(path), "): zero_optimization.stage3_gather_16bit_weights_on_model_save is "
                  "false, which forbids consolidating a stage-3 model into whole parameters (DeepSpeed's "
                  "save_16bit_model then saves nothing); set it true, or save a sharded checkpoint "
                  "(save_checkpoint) and export that with zoe-ckpt export");
  // Between begin_* and end_* the gathered parameters are in use (and the trainer's thread is
  // inside a module): the same rule as step().
  for (std::size_t m = 0; m < I.model.modules.size(); ++m)
    ZOE_CHECK_USAGE(I.rules.phase(static_cast<int>(m)) == core::ModulePhase::idle, "export_safetensors(", detail::quoted_path(path),
                    ") while module ", detail::quoted(I.model.modules[m].name), " is still in ",
                    I.rules.phase(static_cast<int>(m)) == core::ModulePhase::forward ? "forward" : "backward",
                    ": end it first");
  I.updater.check_no_update_in_backward("export_safetensors");
  I.finalize();
  I.updater.finish_update();  // the master weights of the last step (as gather_parameter)
  Stream& s = *I.cx.side;

  std::exception_ptr error;  // this rank's first failure
  auto attempt = [&](auto&& fn) {
    if (error) return;
    try {
      fn();
    } catch (const CommError&) {
      throw;  // the collectives are broken: nothing left to agree with
    } catch (...) {
      error = std::current_exception();
    }
  };

  std::unique_ptr<io::SafetensorsWriter> writer;
  std::unique_ptr<FlatAppender> appender;
  if (I.cx.rank == 0) {
    attempt([&] {
      std::vector<io::SafetensorsTensorSpec> specs;
      for (const core::Group& g : I.model.groups)
        for (std::uint32_t p : g.params)
          specs.push_back({I.model.params[p].name, core::safetensors_dtype_name(dtype), I.model.params[p].shape});
      writer = std::make_unique<io::SafetensorsWriter>(path, std::move(specs), metadata);
      appender = std::make_unique<FlatAppender>(*writer, dtype);
    });
  }
  auto emit = [&](const core::Group& g, std::int64_t flat_begin, std::span<const float> values) {
    if (appender) attempt([&] { appender->append(*g.layout, flat_begin, values); });
  };

  // A frozen group has no master weights (no sub-groups): its compute-dtype values, widened to
  // fp32, gathered from every rank (EngineImpl::gather_group), are what is exported.
  auto export_frozen = [&](core::Group& g) {
    CollectiveTag tag;
    tag.kind = CollectiveTag::Kind::params;
    tag.group = static_cast<std::int32_t>(&g - I.model.groups.data());
    tag.label = detail::concat("exporting the frozen parameters of ", detail::quoted(g.name));
    const std::vector<float> full = I.gather_group(g, tag);
    emit(g, 0, std::span<const float>(full.data(), full.size()));
  };

  std::int64_t largest = 0;
  for (const core::Group& g : I.model.groups)
    for (const core::SubGroup& sg : g.subgroups) largest = std::max(largest, sg.numel);
  std::vector<float> host(static_cast<std::size_t>(largest));

  // This rank's sub-group `sg` into host memory.
  auto read_master = [&](const core::SubGroup& sg, float* dst) {
    if (sg.offloaded()) {
      I.tiers.states->read_master(sg.offload_id, dst);
    } else {
      I.cx.device.copy(dst, sg.master(), static_cast<std::size_t>(sg.numel) * sizeof(float), s);
      I.cx.device.synchronize(s);
    }
  };

  if (!I.cx.policy.shards_optimizer) {
    // Stage 0: every rank holds every state; rank 0 writes its own.
    if (I.cx.rank == 0)
      for (core::Group& g : I.model.groups) {
        if (g.frozen) {
          export_frozen(g);
          continue;
        }
        for (const core::SubGroup& sg : g.subgroups) {
          const auto n = static_cast<std::size_t>(sg.numel);
          attempt([&] { read_master(sg, host.data()); });
          emit(g, g.opt_begin + sg.begin, std::span<const float>(host.data(), n));
        }
      }
  } else {
    core::DeviceBuffer buf = I.cx.alloc(core::MemKind::buffer, DType::f32, std::max<std::int64_t>(largest, 1));
    for (core::Group& g : I.model.groups) {
      if (g.frozen) {
        export_frozen(g);  // a collective at stage 3: every rank joins
        continue;
      }
      // Every rank's optimizer range of g has the same size and the same sub-groups.
      for (int r = 0; r < I.cx.world; ++r) {
        for (const core::SubGroup& sg : g.subgroups) {
          const auto n = static_cast<std::size_t>(sg.numel);
          if (I.cx.rank == r) {
            attempt([&] {
              if (sg.offloaded()) {
                I.tiers.states->read_master(sg.offload_id, host.data());
                I.cx.device.copy(buf.data(), host.data(), n * sizeof(float), s);
              } else {
                I.cx.device.copy(buf.data(), sg.master(), n * sizeof(float), s);
              }
            });
          }
          I.cx.comm.broadcast(buf.data(), n, DType::f32, r, s);
          if (I.cx.rank == 0) {
            I.cx.device.copy(host.data(), buf.data(), n * sizeof(float), s);
            I.cx.device.synchronize(s);
            emit(g, g.layout->shard_begin(r) + sg.begin, std::span<const float>(host.data(), n));
          } else {
            I.cx.device.synchronize(s);  // `host` is reused by the next read
          }
        }
      }
    }
  }

  // Publish only what every rank streamed completely.
  std::string bad = agree_on_failures(I, error != nullptr);
  if (bad.empty() && writer) attempt([&] { writer->commit(); });
  if (bad.empty()) bad = agree_on_failures(I, error != nullptr);
  writer.reset();  // not committed: its temporary file is removed
  if (error) std::rethrow_exception(error);
  if (!bad.empty())
    ZOE_THROW(Error, "safetensors export to ", detail::quoted_path(path), " failed on rank(s) ", bad, " (see their error); ", detail::quoted_path(path),
              " is unchanged");
}

void Engine::export_safetensors(const std::string& path, DType dtype, const std::map<std::string, std::string>& metadata) {
  detail::at_public_boundary("export_safetensors", [&] { export_safetensors_of(*impl_, path, dtype, metadata); });
}

}  // namespace zoe
