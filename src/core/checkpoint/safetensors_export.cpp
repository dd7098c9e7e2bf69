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
#include "src/core/checkpoint/engine_checkpoint.hpp"
#include "src/core/state_access.hpp"
#include "src/core/names.hpp"
#include "src/core/checkpoint/safetensors_rounding.hpp"

namespace zoe {

// safetensors is little-endian; zoe reads and writes the host's bytes as they are.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");
namespace {

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

void core::export_engine_safetensors(StateAccess& S, const std::string& path, DType dtype,
                                     const std::map<std::string, std::string>& metadata) {
  ZOE_CHECK_USAGE(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
                  "export_safetensors: unknown dtype ", static_cast<int>(dtype));
  ZOE_CHECK_USAGE(!path.empty(), "export_safetensors: empty path");
  for (const auto& [key, value] : metadata) {
    core::check_utf8("export_safetensors: the metadata key", key);
    core::check_utf8("export_safetensors: the metadata value", value);
  }
  // DeepSpeed's save_16bit_model saves nothing at stage 3 unless the key allows consolidation.
  ZOE_CHECK_USAGE(S.config().zero_optimization.stage != 3 || S.config().zero_optimization.gather_16bit_weights_on_model_save,
                  "export_safetensors(", detail::quoted_path(path), "): zero_optimization.stage3_gather_16bit_weights_on_model_save is "
                  "false, which forbids consolidating a stage-3 model into whole parameters (DeepSpeed's "
                  "save_16bit_model then saves nothing); set it true, or save a sharded checkpoint "
                  "(save_checkpoint) and export that with zoe-ckpt export");
  S.settle_for_export(detail::concat("export_safetensors(", detail::quoted_path(path), ")"));

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
  if (S.rank() == 0) {
    attempt([&] {
      std::vector<io::SafetensorsTensorSpec> specs;
      for (const core::Group& g : S.model().groups)
        for (std::uint32_t p : g.params)
          specs.push_back({S.model().params[p].name, core::safetensors_dtype_name(dtype), S.model().params[p].shape});
      writer = std::make_unique<io::SafetensorsWriter>(path, std::move(specs), metadata);
      appender = std::make_unique<FlatAppender>(*writer, dtype);
    });
  }
  auto emit = [&](const core::Group& g, std::int64_t flat_begin, std::span<const float> values) {
    if (appender) attempt([&] { appender->append(*g.layout, flat_begin, values); });
  };

  // A frozen group has no master weights (no sub-groups): its compute-dtype values, widened to
  // fp32, gathered from every rank (StateAccess::gather_group), are what is exported.
  auto export_frozen = [&](std::size_t gi) {
    CollectiveTag tag;
    tag.kind = CollectiveTag::Kind::params;
    tag.group = static_cast<std::int32_t>(gi);
    tag.label = detail::concat("exporting the frozen parameters of ", detail::quoted(S.model().groups[gi].name));
    const std::vector<float> full = S.gather_group(gi, tag);
    emit(S.model().groups[gi], 0, std::span<const float>(full.data(), full.size()));
  };

  std::int64_t largest = 0;
  for (const core::Group& g : S.model().groups)
    for (const core::SubGroup& sg : g.subgroups) largest = std::max(largest, sg.numel);
  std::vector<float> host(static_cast<std::size_t>(largest));
  const std::vector<core::Group>& groups = S.model().groups;

  if (!S.policy().shards_optimizer) {
    // Stage 0: every rank holds every state; rank 0 writes its own.
    if (S.rank() == 0)
      for (std::size_t gi = 0; gi < groups.size(); ++gi) {
        const core::Group& g = groups[gi];
        if (g.frozen) {
          export_frozen(gi);
          continue;
        }
        for (std::size_t k = 0; k < g.subgroups.size(); ++k) {
          const auto n = static_cast<std::size_t>(g.subgroups[k].numel);
          attempt([&] { S.read_master(gi, k, host.data()); });
          emit(g, g.opt_begin + g.subgroups[k].begin, std::span<const float>(host.data(), n));
        }
      }
  } else {
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      const core::Group& g = groups[gi];
      if (g.frozen) {
        export_frozen(gi);  // a collective at stage 3: every rank joins
        continue;
      }
      // Every rank's optimizer range of g has the same size and the same sub-groups. A rank
      // whose read failed still joins the broadcast (with whatever `host` holds).
      for (int r = 0; r < S.world(); ++r) {
        for (std::size_t k = 0; k < g.subgroups.size(); ++k) {
          const auto n = static_cast<std::size_t>(g.subgroups[k].numel);
          if (S.rank() == r) attempt([&] { S.read_master(gi, k, host.data()); });
          S.broadcast(r, std::span<float>(host.data(), n));
          if (S.rank() == 0) emit(g, g.layout->shard_begin(r) + g.subgroups[k].begin, std::span<const float>(host.data(), n));
        }
      }
    }
  }

  // Publish only what every rank streamed completely.
  std::string bad = S.ranks_with(error != nullptr);
  if (bad.empty() && writer) attempt([&] { writer->commit(); });
  if (bad.empty()) bad = S.ranks_with(error != nullptr);
  writer.reset();  // not committed: its temporary file is removed
  if (error) std::rethrow_exception(error);
  if (!bad.empty())
    ZOE_THROW(Error, "safetensors export to ", detail::quoted_path(path), " failed on rank(s) ", bad, " (see their error); ", detail::quoted_path(path),
              " is unchanged");
}


}  // namespace zoe
