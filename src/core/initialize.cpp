// Initial values at the first forward (the engine's counterpart of DeepSpeed's zero.Init):
// each group's fp32 values are produced by its parameters' initializers chunk by chunk, only
// over the part of the flat buffer this rank keeps (stage 3: its shard; stages 0-2: the whole
// buffer, whose full compute-dtype copy every rank holds), and each chunk goes straight to
// its homes: the sub-group's master weights (device memory or the offload tier, moments
// zero) and the compute-dtype parameters (device memory or the parameter tier). Chunks are
// at most sub_group_size elements and, inside the optimizer range, exactly the sub-groups, so
// host memory holds one chunk (plus the tiers' staging buffers) however large the model.
// Padding is zero. The values and roundings are those of a whole-buffer copy, element by
// element, so the result is bitwise the same whatever the chunking.
#include <algorithm>
#include <exception>
#include <new>
#include <vector>

#include "src/common/check.hpp"
#include "src/core/engine_impl.hpp"
#include "src/device/host_elementwise.hpp"

namespace zoe::core {

void EngineImpl::fill_initial(const Group& g, std::int64_t begin, std::span<float> out) {
  std::fill(out.begin(), out.end(), 0.0f);  // padding
  const FlatLayout& L = *g.layout;
  const std::int64_t end = begin + static_cast<std::int64_t>(out.size());
  for (std::size_t i = 0; i < g.params.size(); ++i) {
    const std::int64_t p0 = L.offset(i), a = std::max(begin, p0), b = std::min(end, p0 + L.numel(i));
    if (a >= b) continue;
    const ParamInfo& p = params[g.params[i]];
    try {
      p.init(a - p0, out.subspan(static_cast<std::size_t>(a - begin), static_cast<std::size_t>(b - a)));
    } catch (const std::bad_alloc& e) {
      ZOE_THROW(OutOfMemoryError, "parameter '", p.name, "': its initializer ran out of memory on elements [", a - p0,
                ", ", b - p0, "): ", e.what());
    } catch (const OutOfMemoryError& e) {
      ZOE_THROW(OutOfMemoryError, "parameter '", p.name, "': its initializer ran out of memory on elements [", a - p0,
                ", ", b - p0, "): ", e.what());
    } catch (const std::exception& e) {
      ZOE_THROW(Error, "parameter '", p.name, "': its initializer failed on elements [", a - p0, ", ", b - p0,
                "): ", e.what());
    } catch (...) {
      ZOE_THROW(Error, "parameter '", p.name, "': its initializer threw a non-standard exception on elements [",
                a - p0, ", ", b - p0, ")");
    }
  }
}

void EngineImpl::write_initial_values() {
  write_values([this](const Group& g, std::int64_t begin, std::span<float> master, std::span<float>) {
    fill_initial(g, begin, master);
  }, false);
}

void EngineImpl::write_values(const ChunkSource& source, bool with_moments) {
  const std::int64_t sub = sub_group_numel();
  const std::size_t esz = dtype_size(dtype);
  Stream& s = *side;
  std::int64_t largest = 0;  // elements of the longest chunk
  for (const Group& g : groups)
    largest = std::max(largest, std::min(sub, policy.shards_params ? g.layout->shard_numel() : g.layout->padded_numel()));
  // [master | exp_avg | exp_avg_sq] of one chunk (the moments only `with_moments`).
  std::vector<float> chunk(static_cast<std::size_t>(largest) * (with_moments ? 3 : 1));
  // Device parameters in a 16-bit dtype are cast on the device from an fp32 copy (the same
  // rounding as the device's casts everywhere else).
  DeviceBuffer staging;
  if (!param_store && dtype != DType::f32) staging = alloc(MemKind::buffer, DType::f32, largest);

  for (Group& g : groups) {
    const FlatLayout& L = *g.layout;
    // This rank's part of the flat buffer, [base, base + len): what its parameters hold.
    const std::int64_t base = policy.shards_params ? L.shard_begin(rank) : 0;
    const std::int64_t len = policy.shards_params ? L.shard_numel() : L.padded_numel();
    const std::int64_t opt_end = g.opt_begin + g.opt_numel;  // inside [base, base + len)
    // Chunks: the sub-groups inside the optimizer range, sub_group_size pieces outside it.
    std::vector<std::pair<std::int64_t, std::int64_t>> chunks;
    auto cut = [&](std::int64_t a, std::int64_t b) {
      for (std::int64_t x = a; x < b; x += sub) chunks.emplace_back(x, std::min(b, x + sub));
    };
    cut(base, g.opt_begin);
    cut(g.opt_begin, opt_end);
    cut(opt_end, base + len);

    void* home = param_store ? param_store->write_buffer(g.param_id) : nullptr;  // the whole shard
    try {
      for (auto [a, b] : chunks) {
        const auto n = static_cast<std::size_t>(b - a);
        std::span<float> values(chunk.data(), n);
        const bool in_range = a >= g.opt_begin && a < opt_end;
        source(g, a, values, in_range && with_moments ? std::span<float>(chunk.data() + n, 2 * n) : std::span<float>());
        if (in_range) {
          const SubGroup& sg = g.subgroups[static_cast<std::size_t>((a - g.opt_begin) / sub)];
          if (with_moments && sg.offloaded()) {
            states->write_all(sg.offload_id, chunk.data());
          } else if (with_moments) {
            device.copy(sg.master(), chunk.data(), 3 * n * sizeof(float), s);
          } else if (sg.offloaded()) {
            states->write_initial(sg.offload_id, values);
          } else {
            device.copy(sg.master(), values.data(), n * sizeof(float), s);
            device.fill(sg.master() + n, DType::f32, 2 * n, 0.0f, s);
          }
        }
        const std::int64_t at = a - base;  // in the rank's parameters
        if (param_store) {
          host_ops::cast(values.data(), DType::f32, static_cast<char*>(home) + static_cast<std::size_t>(at) * esz,
                         dtype, n);
        } else {
          const DeviceBuffer& dst = policy.shards_params ? g.param_shard : g.param_full;
          if (dtype == DType::f32) {
            device.copy(dst.at(at), values.data(), n * sizeof(float), s);
          } else {
            device.copy(staging.data(), values.data(), n * sizeof(float), s);
            device.cast(staging.data(), DType::f32, dst.at(at), dtype, n, s);
          }
        }
        device.synchronize(s);  // the device copies have read `chunk`
      }
    } catch (...) {
      if (param_store) param_store->abort_write();
      throw;
    }
    if (param_store) param_store->commit(g.param_id);
  }
  if (states && !with_moments) states->finish_initial();
}

}  // namespace zoe::core
