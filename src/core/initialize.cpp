// Initial values at the first forward (the engine's counterpart of DeepSpeed's zero.Init):
// each group's fp32 values are produced by its parameters' initializers chunk by chunk, only
// over the part of the flat buffer this rank keeps (stage 3: its shard; stages 0-2: the whole
// buffer, whose full compute-dtype copy every rank holds), and each chunk goes straight to
// its homes: the sub-group's master weights (device memory or the offload tier, moments
// zero) and the compute-dtype parameters (device memory or the parameter tier). Chunks are
// at most sub_group_size elements and, inside the optimizer range, exactly the sub-groups, so
// host memory holds two chunks (plus the tiers' staging buffers) however large the 
// The chunks are pipelined (ChunkPipeline): this thread computes chunk k+1 (the initializers,
// or a checkpoint's reads) while a writer thread stores chunk k (the tiers' writes, the casts,
// the device copies), so construction takes the larger of the two, not their sum.
// Padding is zero. The values and roundings are those of a whole-buffer copy, element by
// element, so the result is bitwise the same whatever the chunking.
#include <algorithm>
#include <exception>
#include <functional>
#include <new>
#include <vector>

#include "src/common/check.hpp"
#include "src/common/quote.hpp"
#include "src/core/chunk_pipeline.hpp"
#include "src/core/engine_impl.hpp"
#include "src/device/host_elementwise.hpp"

namespace zoe {
using namespace core;  // the engine's parts, in this file only

void core::EngineImpl::fill_initial(const Group& g, std::int64_t begin, std::span<float> out) {
  std::fill(out.begin(), out.end(), 0.0f);  // padding
  const FlatLayout& L = *g.layout;
  const std::int64_t end = begin + static_cast<std::int64_t>(out.size());
  for (std::size_t i = 0; i < g.params.size(); ++i) {
    const std::int64_t p0 = L.offset(i), a = std::max(begin, p0), b = std::min(end, p0 + L.numel(i));
    if (a >= b) continue;
    const ParamInfo& p = model.params[g.params[i]];
    try {
      p.init(a - p0, out.subspan(static_cast<std::size_t>(a - begin), static_cast<std::size_t>(b - a)));
    } catch (const std::bad_alloc& e) {
      ZOE_THROW(OutOfMemoryError, "parameter ", detail::quoted(p.name), ": its initializer ran out of memory on elements [", a - p0,
                ", ", b - p0, "): ", e.what());
    } catch (const OutOfMemoryError& e) {
      ZOE_THROW(OutOfMemoryError, "parameter ", detail::quoted(p.name), ": its initializer ran out of memory on elements [", a - p0,
                ", ", b - p0, "): ", e.what());
    } catch (const std::exception& e) {
      ZOE_THROW(Error, "parameter ", detail::quoted(p.name), ": its initializer failed on elements [", a - p0, ", ", b - p0,
                "): ", e.what());
    } catch (...) {
      ZOE_THROW(Error, "parameter ", detail::quoted(p.name), ": its initializer threw a non-standard exception on elements [",
                a - p0, ", ", b - p0, ")");
    }
  }
}

void core::EngineImpl::write_initial_values() {
  write_values([this](const Group& g, std::int64_t begin, std::span<float> master, std::span<float>) {
    fill_initial(g, begin, master);
  }, false);
}

void core::EngineImpl::write_values(const ChunkSource& source, bool with_moments) {
  const std::int64_t sub = cx.sub_group_numel();
  const std::size_t esz = dtype_size(cx.dtype);
  Stream& s = *cx.side;
  std::int64_t largest = 0;  // elements of the longest chunk
  for (const Group& g : model.groups)
    largest = std::max(largest, std::min(sub, cx.policy.shards_params ? g.layout->shard_numel() : g.layout->padded_numel()));
  // Device parameters in a 16-bit dtype are cast on the device from an fp32 copy (the same
  // rounding as the device's casts everywhere else); the writer's stores run one at a time.
  DeviceBuffer staging;
  if (!tiers.params && cx.dtype != DType::f32) staging = cx.alloc(MemKind::buffer, DType::f32, largest);
  // The parameter tier's write buffer of the group being stored: the whole shard (the writer's
  // alone: leased by write_buffer before the group's first chunk, stored by commit after its last).
  void* home = nullptr;
  // Stores chunk [a, b) of group g (see the file comment for its homes).
  auto store_chunk = [&](Group& g, std::int64_t base, std::int64_t a, std::int64_t b, const float* chunk) {
    const auto n = static_cast<std::size_t>(b - a);
    const std::int64_t opt_end = g.opt_begin + g.opt_numel;
    if (a >= g.opt_begin && a < opt_end) {
      const SubGroup& sg = g.subgroups[static_cast<std::size_t>((a - g.opt_begin) / sub)];
      if (with_moments && sg.offloaded()) {
        tiers.states->write_all(sg.offload_id, chunk);
      } else if (with_moments) {
        cx.device.copy(sg.master(), chunk, 3 * n * sizeof(float), s);
      } else if (sg.offloaded()) {
        tiers.states->write_initial(sg.offload_id, std::span<const float>(chunk, n));
      } else {
        cx.device.copy(sg.master(), chunk, n * sizeof(float), s);
        cx.device.fill(sg.master() + n, DType::f32, 2 * n, 0.0f, s);
      }
    }
    const std::int64_t at = a - base;  // in the rank's parameters
    if (tiers.params) {
      host_ops::cast(chunk, DType::f32, static_cast<char*>(home) + static_cast<std::size_t>(at) * esz, cx.dtype, n);
    } else {
      const DeviceBuffer& dst = cx.policy.shards_params ? g.param_shard : g.param_full;
      if (cx.dtype == DType::f32) {
        cx.device.copy(dst.at(at), chunk, n * sizeof(float), s);
      } else {
        cx.device.copy(staging.data(), chunk, n * sizeof(float), s);
        cx.device.cast(staging.data(), DType::f32, dst.at(at), cx.dtype, n, s);
      }
    }
    cx.device.synchronize(s);  // the device copies have read the chunk
  };

  // Two chunk buffers, each [master | exp_avg | exp_avg_sq] of one chunk (the moments only
  // `with_moments`): this thread fills one while the writer stores the other (chunk_pipeline.hpp);
  // declared after what its stores use, so it is drained before they go.
  ChunkPipeline pipeline(static_cast<std::size_t>(largest) * (with_moments ? 3 : 1));
  try {
    for (Group& g : model.groups) {
      const FlatLayout& L = *g.layout;
      // This rank's part of the flat buffer, [base, base + len): what its parameters hold.
      const std::int64_t base = cx.policy.shards_params ? L.shard_begin(cx.rank) : 0;
      const std::int64_t len = cx.policy.shards_params ? L.shard_numel() : L.padded_numel();
      const std::int64_t opt_end = g.opt_begin + g.opt_numel;  // inside [base, base + len)
      // Chunks: the sub-groups inside the optimizer range, sub_group_size pieces outside it.
      std::vector<std::pair<std::int64_t, std::int64_t>> chunks;
      auto cut = [&](std::int64_t a, std::int64_t b) {
        for (std::int64_t x = a; x < b; x += sub) chunks.emplace_back(x, std::min(b, x + sub));
      };
      cut(base, g.opt_begin);
      cut(g.opt_begin, opt_end);
      cut(opt_end, base + len);
      if (tiers.params) pipeline.run([this, &g, &home] { home = tiers.params->write_buffer(g.param_id); });
      for (auto [a, b] : chunks) {
        const auto n = static_cast<std::size_t>(b - a);
        std::span<float> chunk = pipeline.acquire();
        const bool in_range = a >= g.opt_begin && a < opt_end;
        source(g, a, chunk.first(n), in_range && with_moments ? chunk.subspan(n, 2 * n) : std::span<float>());
        pipeline.submit([&store_chunk, &g, base, a, b, data = chunk.data()] { store_chunk(g, base, a, b, data); });
      }
      if (tiers.params) pipeline.run([this, &g] { tiers.params->commit(g.param_id); });
    }
    if (tiers.states && !with_moments) pipeline.run([this] { tiers.states->finish_initial(); });
    pipeline.finish();
  } catch (...) {
    pipeline.abandon();  // nothing of this call outlives it
    if (tiers.params) tiers.params->abort_write();
    throw;
  }
}

}  // namespace zoe
