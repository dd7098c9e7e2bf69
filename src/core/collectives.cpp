#include "src/core/collectives.hpp"

#include <algorithm>
#include <cstring>
#include <span>
#include <string>

#include "src/common/check.hpp"
#include "src/common/quote.hpp"

namespace zoe::core {

void Collectives::note(CollectiveTag&& tag) {
  rules_.note_collective(tag);
  cx_.comm.tag_next(std::move(tag));
}

void Collectives::all_gather(const void* send, void* recv, std::int64_t count, DType dt, CollectiveTag tag) {
  note(std::move(tag));
  cx_.comm.all_gather(send, recv, static_cast<std::size_t>(count), dt, *cx_.side);
  elements_sent_ += count * (cx_.world - 1);
  ++all_gather_calls_;
}

void Collectives::reduce_scatter(const void* send, void* recv, std::int64_t count, DType dt, CollectiveTag tag) {
  note(std::move(tag));
  cx_.comm.reduce_scatter(send, recv, static_cast<std::size_t>(count), dt, ReduceOp::sum, *cx_.side);
  elements_sent_ += count * (cx_.world - 1);
  ++reduce_scatter_calls_;
}

void Collectives::all_reduce(void* buf, std::int64_t count, DType dt, CollectiveTag tag) {
  note(std::move(tag));
  cx_.comm.all_reduce(buf, buf, static_cast<std::size_t>(count), dt, ReduceOp::sum, *cx_.side);
  elements_sent_ += cx_.world > 1 ? 2 * count * (cx_.world - 1) / cx_.world : 0;
  ++all_reduce_calls_;
}

namespace {
std::int64_t total_count(std::span<const GroupedPart> parts) {
  std::int64_t t = 0;
  for (const GroupedPart& p : parts) t += static_cast<std::int64_t>(p.count);
  return t;
}
}  // namespace

void Collectives::all_gather_grouped(std::span<const GroupedPart> parts, DType dt, CollectiveTag tag) {
  const std::int64_t T = total_count(parts);
  if (cx_.comm.gathers_parts_in_place()) {
    note(std::move(tag));
    cx_.comm.all_gather_grouped(parts, dt, *cx_.side);
    elements_sent_ += T * (cx_.world - 1);
    ++all_gather_calls_;
    return;
  }
  // Packed: send = [part 0 | part 1 | ...]; rank r's block of recv holds its parts in that
  // order, each copied to its place in its part's recv.
  const std::size_t esz = dtype_size(dt);
  auto at = [esz](void* base, std::int64_t elements) { return static_cast<char*>(base) + elements * static_cast<std::int64_t>(esz); };
  // Sends that lie side by side already (a parameter tier's staging) need no packing.
  bool packed = true;
  for (std::size_t k = 1; k < parts.size(); ++k)
    packed = packed && parts[k].send == static_cast<const char*>(parts[k - 1].send) + parts[k - 1].count * esz;
  DeviceBuffer send;
  std::vector<CopyRegion> regions;  // one queued copy each way
  std::int64_t off = 0;
  if (!packed) {
    send = cx_.alloc(MemKind::buffer, dt, T);
    for (const GroupedPart& p : parts) {
      regions.push_back({at(send.data(), off), p.send, p.count * esz});
      off += static_cast<std::int64_t>(p.count);
    }
    cx_.device.copy_batch(regions, CopyPlaces::within_device, *cx_.side);
    regions.clear();
  }
  DeviceBuffer recv = cx_.alloc(MemKind::buffer, dt, T * cx_.world);
  all_gather(packed ? parts.front().send : send.data(), recv.data(), T, dt, std::move(tag));
  off = 0;
  for (const GroupedPart& p : parts) {
    const auto S = static_cast<std::int64_t>(p.count);
    for (int r = 0; r < cx_.world; ++r) regions.push_back({at(p.recv, r * S), at(recv.data(), r * T + off), p.count * esz});
    off += S;
  }
  cx_.device.copy_batch(regions, CopyPlaces::within_device, *cx_.side);
  if (!packed) cx_.frees.after_side(std::move(send));
  cx_.frees.after_side(std::move(recv));
}

void Collectives::reduce_scatter_grouped(std::span<const GroupedPart> parts, DType dt, CollectiveTag tag) {
  const std::int64_t T = total_count(parts);
  if (cx_.comm.gathers_parts_in_place()) {
    note(std::move(tag));
    cx_.comm.reduce_scatter_grouped(parts, dt, ReduceOp::sum, *cx_.side);
    elements_sent_ += T * (cx_.world - 1);
    ++reduce_scatter_calls_;
    return;
  }
  // Packed rank-major: block r = [part 0's slice r | part 1's slice r | ...], so rank r
  // receives its slices of every part, contiguously, then copies each to its part's recv.
  const std::size_t esz = dtype_size(dt);
  auto at = [esz](void* base, std::int64_t elements) { return static_cast<char*>(base) + elements * static_cast<std::int64_t>(esz); };
  auto at_const = [esz](const void* base, std::int64_t elements) {
    return static_cast<const char*>(base) + elements * static_cast<std::int64_t>(esz);
  };
  DeviceBuffer send = cx_.alloc(MemKind::buffer, dt, T * cx_.world);
  std::vector<CopyRegion> regions;
  regions.reserve(parts.size() * static_cast<std::size_t>(cx_.world));
  for (int r = 0; r < cx_.world; ++r) {
    std::int64_t off = 0;
    for (const GroupedPart& p : parts) {
      const auto S = static_cast<std::int64_t>(p.count);
      regions.push_back({at(send.data(), r * T + off), at_const(p.send, r * S), p.count * esz});
      off += S;
    }
  }
  cx_.device.copy_batch(regions, CopyPlaces::within_device, *cx_.side);
  regions.clear();
  // Receives that lie side by side already (a bucket's shards waiting to be absorbed) take
  // the result in place.
  bool packed = true;
  for (std::size_t k = 1; k < parts.size(); ++k)
    packed = packed && parts[k].recv == at(parts[k - 1].recv, static_cast<std::int64_t>(parts[k - 1].count));
  DeviceBuffer out = packed ? DeviceBuffer{} : cx_.alloc(MemKind::buffer, dt, T);
  reduce_scatter(send.data(), packed ? parts.front().recv : out.data(), T, dt, std::move(tag));
  cx_.frees.after_side(std::move(send));
  if (packed) return;
  std::int64_t off = 0;
  for (const GroupedPart& p : parts) {
    regions.push_back({p.recv, at(out.data(), off), p.count * esz});
    off += static_cast<std::int64_t>(p.count);
  }
  cx_.device.copy_batch(regions, CopyPlaces::within_device, *cx_.side);
  cx_.frees.after_side(std::move(out));
}

CollectiveTag Collectives::group_tag(const Group& g, CollectiveTag::Kind kind) const {
  CollectiveTag t;
  t.kind = kind;
  t.group = model_.index_of(g);
  t.step = rules_.steps();
  if (kind == CollectiveTag::Kind::grads) t.micro_batch = g.micro_batches - 1;
  t.label = group_label(g, kind);
  return t;
}

// Names a label quotes of a list (modules of a group, groups of a bucket) before "and N more".
constexpr std::size_t kNamed = 4;

const std::string& Collectives::group_label(const Group& g, CollectiveTag::Kind kind) const {
  std::vector<std::string>& cache = labels_[kind == CollectiveTag::Kind::grads ? 1 : 0];
  const auto gi = static_cast<std::size_t>(model_.index_of(g));
  if (cache.size() <= gi) cache.resize(model_.groups.size());
  std::string& label = cache[gi];
  if (!label.empty()) return label;
  // Its modules, the first few (a group small modules share has hundreds; its name says so).
  std::string users;
  if (g.users.size() > 1) {
    for (std::size_t k = 0; k < std::min(kNamed, g.users.size()); ++k)
      users += (users.empty() ? " (modules " : ", ") + detail::quoted(model_.modules[static_cast<std::size_t>(g.users[k])].name);
    if (g.users.size() > kNamed) users += detail::concat(" and ", g.users.size() - kNamed, " more");
    users += ")";
  }
  label = detail::concat(kind == CollectiveTag::Kind::grads ? "gradients of " : "parameters of ", detail::quoted(g.name), users);
  return label;
}

CollectiveTag Collectives::params_tag(const Group& g) const { return group_tag(g, CollectiveTag::Kind::params); }
CollectiveTag Collectives::grads_tag(const Group& g) const { return group_tag(g, CollectiveTag::Kind::grads); }

CollectiveTag Collectives::coalesced_tag(const std::vector<int>& group_indices, CollectiveTag::Kind kind) const {
  CollectiveTag t = group_tag(model_.group(group_indices.front()), kind);
  // The first few names say which collective it is (a communicator keeps the label's first 96
  // characters): quoting thousands of small groups' names would cost more than their reduction.
  std::string names;
  for (std::size_t k = 0; k < std::min(kNamed, group_indices.size()); ++k)
    names += (names.empty() ? "" : ", ") + detail::quoted(model_.group(group_indices[k]).name);
  if (group_indices.size() > kNamed) names += detail::concat(" and ", group_indices.size() - kNamed, " more");
  t.label = detail::concat(kind == CollectiveTag::Kind::grads ? "gradients of " : "parameters of ", group_indices.size(),
                           " groups (", names, ")");
  return t;
}

Collectives::Mark Collectives::now() const {
  return Mark{cx_.comm.stats(), elements_sent_, all_gather_calls_, reduce_scatter_calls_, all_reduce_calls_};
}

void Collectives::begin_step() { step_start_ = now(); }

void Collectives::end_step() {
  const Mark end = now();
  const Mark& a = step_start_;
  last_traffic_.all_gather_bytes = end.comm.all_gather_bytes - a.comm.all_gather_bytes;
  last_traffic_.reduce_scatter_bytes = end.comm.reduce_scatter_bytes - a.comm.reduce_scatter_bytes;
  last_traffic_.all_reduce_bytes = end.comm.all_reduce_bytes - a.comm.all_reduce_bytes;
  last_traffic_.bytes_sent = end.comm.total() - a.comm.total();
  last_traffic_.elements_sent = end.elements - a.elements;
  last_traffic_.all_gather_calls = end.all_gather - a.all_gather;
  last_traffic_.reduce_scatter_calls = end.reduce_scatter - a.reduce_scatter;
  last_traffic_.all_reduce_calls = end.all_reduce - a.all_reduce;
  last_traffic_.calls = end.comm.calls - a.comm.calls;
  step_start_ = end;
}

void Collectives::agree_on_step() {
  if (cx_.world == 1) return;
  const CallRules& R = rules_;
  constexpr int kWords = 4;
  const std::uint32_t mine[kWords] = {R.fingerprint(), R.collectives(), R.backward_calls(),
                                      static_cast<std::uint32_t>(R.steps())};
  // The words travel as fp32 bit patterns: all_gather copies, never computes.
  DeviceBuffer send = cx_.alloc(MemKind::buffer, DType::f32, kWords);
  DeviceBuffer recv = cx_.alloc(MemKind::buffer, DType::f32, kWords * cx_.world);
  // Through the step's registered read-back area (no pageable copy on the hot path); step()
  // reuses it only after the synchronize below. Layout: [mine | every rank's words].
  auto* area = reinterpret_cast<std::uint32_t*>(cx_.readback.get(sizeof(mine) * static_cast<std::size_t>(1 + cx_.world)));
  std::memcpy(area, mine, sizeof(mine));
  std::span<const std::uint32_t> all(area + kWords, static_cast<std::size_t>(kWords * cx_.world));
  Stream& s = *cx_.side;
  cx_.device.copy(send.data(), area, sizeof(mine), s);
  CollectiveTag tag;
  tag.kind = CollectiveTag::Kind::step_agreement;
  tag.step = R.steps();
  tag.label = "the step agreement of step()";
  cx_.comm.tag_next(std::move(tag));
  cx_.comm.all_gather(send.data(), recv.data(), kWords, DType::f32, s);
  cx_.device.copy(area + kWords, recv.data(), all.size() * sizeof(std::uint32_t), s);
  cx_.device.synchronize(s);  // rethrows a failure of this step's collectives
  for (int p = 0; p < cx_.world; ++p) {
    const std::uint32_t* theirs = all.data() + p * kWords;
    if (std::memcmp(theirs, mine, sizeof(mine)) == 0) continue;
    ZOE_THROW(UsageError, "step() ", R.steps(), " on rank ", cx_.rank, ": rank ", p, " made different calls in this step (",
              theirs[2], " backward calls and ", theirs[1], " collectives, fingerprint ", theirs[0], ") than rank ",
              cx_.rank, " (", mine[2], " backward calls: ", R.backward_log(), "; ", mine[1], " collectives, fingerprint ",
              mine[0], "); rule: every rank runs the same modules' forward and backward in the same order (to count "
              "a module's gradient as zero on one rank, run its begin_backward/end_backward and add nothing). The "
              "step's gradients are mixed: destroy this Engine");
  }
}

}  // namespace zoe::core
