#include "src/comm/communicator.hpp"

#include "src/common/check.hpp"

namespace zoe {
namespace {
// Bytes a rank moves for a collective over a buffer of `full` bytes: full*(N-1)/N.
std::int64_t bus_share(std::size_t full, int world) {
  return world <= 1 ? 0 : static_cast<std::int64_t>(full / static_cast<std::size_t>(world) *
                                                    static_cast<std::size_t>(world - 1) +
                                                    full % static_cast<std::size_t>(world) *
                                                    static_cast<std::size_t>(world - 1) /
                                                    static_cast<std::size_t>(world));
}
}  // namespace

std::string CollectiveTag::describe() const {
  if (kind == Kind::untagged) return "";
  static constexpr const char* kNames[] = {"untagged", "parameters", "gradients", "step agreement", "parameter value",
                                            "trainer's all-reduce"};
  std::string s = ", " + (label.empty() ? std::string(kNames[static_cast<int>(kind)]) +
                                              (group >= 0 ? detail::concat(" of group ", group) : std::string())
                                        : label);
  if (step >= 0) s += detail::concat(", step ", step);
  if (micro_batch >= 0) s += detail::concat(", micro-batch ", micro_batch);
  return s;
}

void Communicator::all_gather_grouped(std::span<const GroupedPart> parts, DType dtype, Stream& stream) {
  const CollectiveTag tag = take_tag();
  for (const GroupedPart& p : parts) {
    tag_next(tag);
    all_gather(p.send, p.recv, p.count, dtype, stream);
  }
}

void Communicator::reduce_scatter_grouped(std::span<const GroupedPart> parts, DType dtype, ReduceOp op,
                                          Stream& stream) {
  const CollectiveTag tag = take_tag();
  for (const GroupedPart& p : parts) {
    tag_next(tag);
    reduce_scatter(p.send, p.recv, p.count, dtype, op, stream);
  }
}

CommStats Communicator::stats() const {
  CommStats s;
  s.all_gather_bytes = ag_.load(std::memory_order_relaxed);
  s.reduce_scatter_bytes = rs_.load(std::memory_order_relaxed);
  s.all_reduce_bytes = ar_.load(std::memory_order_relaxed);
  s.broadcast_bytes = bc_.load(std::memory_order_relaxed);
  s.calls = calls_.load(std::memory_order_relaxed);
  return s;
}

void Communicator::reset_stats() {
  ag_ = 0;
  rs_ = 0;
  ar_ = 0;
  bc_ = 0;
  calls_ = 0;
}

void Communicator::count_all_gather(std::size_t full_bytes) {
  ag_ += bus_share(full_bytes, world_size());
  ++calls_;
}

void Communicator::count_reduce_scatter(std::size_t full_bytes) {
  rs_ += bus_share(full_bytes, world_size());
  ++calls_;
}

void Communicator::count_all_reduce(std::size_t bytes) {
  ar_ += bus_share(2 * bytes, world_size());
  ++calls_;
}

void Communicator::count_broadcast(std::size_t bytes) {
  bc_ += static_cast<std::int64_t>(bytes);
  ++calls_;
}

}  // namespace zoe
