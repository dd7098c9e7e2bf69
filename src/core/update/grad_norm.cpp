// The step's gradient statistics: the global sum of squares and the count of non-finite
// pieces, from the reduced gradients (device sub-groups on the device, offloaded ones as the
// gradient sink recorded them), with one small fp64 all-reduce.
//
// The device's gradients are read once, for the sum of squares, which is also their finite
// check: a square is never negative and, taken in fp64, never overflows (an fp32 value's
// square is at most 1.2e77, and 2^63 of them sum to at most 1.1e96), so the sum is finite
// exactly when every element is; step() tests both the count and the sum.
//
// Bitwise agreement between stages: each rank's shard of each group is summed in pieces of
// sub_group_size elements (the sub-groups), in fp64, and the pieces are added in order: the
// same in every stage (stage 0 forms all ranks' partials itself) and added in rank order, as
// the communicator's all-reduce does.
#include "src/core/update/grad_norm.hpp"

#include <algorithm>
#include <span>

namespace zoe::core {

GradStats measure_gradients(EngineContext& cx, const Model& model, Updater& updater, OffloadTiers& tiers) {
  const StagePolicy& policy = cx.policy;
  const int world = cx.world;
  Device& device = cx.device;
  Stream& s = *cx.side;
  const DType gdt = cx.grad_dtype();
  const std::vector<Group>& groups = model.groups;
  auto sub_group_numel = [&cx] { return cx.sub_group_numel(); };
  auto grad_of = [&policy](const Group& g) -> const void* {
    return policy.shards_optimizer ? g.grad_shard.data() : g.grad_full.data();
  };
  // ---- sums of squares (and so finite checks, above). Each rank's shard of each group is summed in
  // pieces of sub_group_size elements (the sub-groups), in fp64, and the pieces are added in
  // order: the same in every stage (stage 0 forms all ranks' partials itself) whether a
  // piece's gradient is on the device or offloaded (whose sum add_grad recorded).
  struct Piece {
    int rank;
    std::int64_t begin, numel;  // in the rank's shard
    int offload_id;             // >= 0: an offloaded sub-group
    const Group* group;
  };
  const int parts = policy.shards_optimizer ? 1 : world;
  std::vector<Piece> pieces;
  for (const Group& g : groups) {
    if (g.frozen) continue;
    const std::int64_t S = g.layout->shard_numel();
    // (Asked of the Updater's byte per group: most groups have no offloaded sub-group, and
    // their sub-group vectors need not be read.)
    const bool any_offloaded = policy.shards_optimizer && updater.has_offloaded_sub_groups(g);
    for (int r = 0; r < parts; ++r) {
      for (std::int64_t c = 0; c < S; c += sub_group_numel()) {
        const std::int64_t n = std::min(sub_group_numel(), S - c);
        int id = -1;
        if (any_offloaded) {
          const SubGroup& sg = g.subgroups[static_cast<std::size_t>(c / sub_group_numel())];
          id = sg.offload_id;
        }
        pieces.push_back(Piece{r, c, n, id, &g});
      }
    }
  }
  // The device's pieces, reduced by one batched operation (one queued operation for the step,
  // not one per group).
  std::vector<TensorRegion> piece_regions;
  std::vector<std::size_t> piece_at;  // piece_regions[j] is pieces[piece_at[j]]
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    if (p.offload_id >= 0) continue;
    const std::int64_t at = p.rank * p.group->layout->shard_numel() + p.begin;
    piece_regions.push_back({static_cast<const char*>(grad_of(*p.group)) + at * dtype_size(gdt), static_cast<std::size_t>(p.numel)});
    piece_at.push_back(i);
  }
  const std::size_t P = piece_regions.size();
  DeviceBuffer sums = cx.alloc(MemKind::buffer, DType::f32, static_cast<std::int64_t>(2 * std::max<std::size_t>(P, 1)));
  // The step's read-backs (sums, the all-reduced pair) land in registered host memory: no
  // pageable copy on the hot path. Layout: [P doubles | 2 doubles].
  std::byte* area = cx.readback.get(P * sizeof(double) + 2 * sizeof(double));
  auto* device_sums = reinterpret_cast<double*>(area);
  double* local = reinterpret_cast<double*>(area) + P;
  device.sum_squares_batch(piece_regions, gdt, static_cast<double*>(sums.data()), s);
  device.copy(device_sums, sums.data(), P * sizeof(double), s);
  device.synchronize(s);
  updater.drain_gradients();  // the offloaded gradients' add_grad (their sums of squares)
  std::vector<double> host_sums(pieces.size(), 0.0);
  for (std::size_t j = 0; j < P; ++j) host_sums[piece_at[j]] = device_sums[j];
  double total = 0.0, nonfinite = 0.0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].offload_id < 0) continue;
    host_sums[i] = tiers.states->grad_sum_squares(pieces[i].offload_id);
    nonfinite += tiers.states->grad_finite(pieces[i].offload_id) ? 0.0 : 1.0;
  }
  if (!policy.shards_optimizer) {
    for (int r = 0; r < parts; ++r) {
      double partial = 0.0;
      for (std::size_t i = 0; i < pieces.size(); ++i)
        if (pieces[i].rank == r) partial += host_sums[i];
      total += partial;
    }
  } else {
    local[0] = 0.0;
    local[1] = nonfinite;
    for (double x : host_sums) local[0] += x;
    DeviceBuffer red = cx.alloc(MemKind::buffer, DType::f32, 4);
    device.copy(red.data(), local, 2 * sizeof(double), s);
    cx.comm.all_reduce_f64(static_cast<double*>(red.data()), 2, s);
    device.copy(local, red.data(), 2 * sizeof(double), s);
    device.synchronize(s);
    total = local[0];
    nonfinite = local[1];
  }

  return GradStats{total, nonfinite};
}

}  // namespace zoe::core
