#include "src/comm/local_communicator.hpp"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/reduce.hpp"
#include "src/comm/collective_sequencer.hpp"
#include "src/comm/rank_failure.hpp"
#include "src/common/check.hpp"
#include "src/device/host_elementwise.hpp"


namespace zoe {
namespace {
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// What a rank publishes for one collective: the identity every rank must agree on, and
// the buffers its peers read.
struct Descriptor {
  const char* name = "";
  std::uint64_t seq = 0;
  std::size_t count = 0;
  DType dtype = DType::f32;
  bool typed = true;  // false for all_reduce_f64 (always fp64) and barrier
  int reduce = -1;  // ReduceOp as int, -1 when the collective does not reduce
  int root = -1;    // broadcast's root, else -1
  const void* send = nullptr;
  void* recv = nullptr;
  // A grouped collective's parts (count: their total). Peers read `parts` only between a
  // successful join and the closing rendezvous (while its owner is inside the collective);
  // the shape they compare is copied: the number of parts, a hash of their counts and the
  // first few counts (for messages).
  std::span<const GroupedPart> parts;
  std::size_t part_count = 0;
  std::uint64_t parts_hash = 0;
  static constexpr std::size_t kShownParts = 4;
  std::array<std::size_t, kShownParts> first_counts{};
  CollectiveTag tag;  // what it is for (Communicator::tag_next)

  void set_parts(std::span<const GroupedPart> p) {
    parts = p;
    part_count = p.size();
    parts_hash = 0xcbf29ce484222325ull;  // FNV-1a over the counts
    for (std::size_t k = 0; k < p.size(); ++k) {
      parts_hash = (parts_hash ^ p[k].count) * 0x100000001b3ull;
      if (k < kShownParts) first_counts[k] = p[k].count;
    }
  }
  bool same_collective(const Descriptor& o) const {
    return std::strcmp(name, o.name) == 0 && count == o.count && dtype == o.dtype && reduce == o.reduce &&
           root == o.root && part_count == o.part_count && parts_hash == o.parts_hash && tag.same(o.tag);
  }
  std::string describe() const {
    std::string s = detail::concat(name, " (collective #", seq, ", count ", count);
    if (part_count > 0) {
      s += detail::concat(" in ", part_count, " parts of ");
      for (std::size_t k = 0; k < std::min(kShownParts, part_count); ++k) s += detail::concat(k ? ", " : "", first_counts[k]);
      if (part_count > kShownParts) s += ", ...";
    }
    if (typed) s += detail::concat(", ", dtype_name(dtype));
    if (reduce >= 0) s += reduce == static_cast<int>(ReduceOp::avg) ? ", avg" : ", sum";
    if (root >= 0) s += detail::concat(", root ", root);
    return s + tag.describe() + ")";
  }
};

using Op = CollectiveOp;

// The N near-equal parts all_reduce splits a buffer of `count` elements into (the same
// split as HostCommunicator, so part r is computed from the same operands).
std::size_t part_begin(std::size_t count, int world, int r) {
  std::size_t base = count / world, extra = count % world;
  return r * base + std::min<std::size_t>(r, extra);
}
std::size_t part_size(std::size_t count, int world, int r) {
  return part_begin(count, world, r + 1) - part_begin(count, world, r);
}

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

// out[i] = kernels::reduce_ranks(slices, T, world, i, avg) for i < n, computed a block at
// a time so the compiler vectorizes across elements. Per element the operations are the
// same (fp32 sum in rank order, then / N, then one rounding), so the bits are too. `out`
// may alias one slice element for element (in-place all_reduce and reduce-scatter): a block
// is fully read before it is written. The block has a fixed size, so it stays in registers
// (a variable one was copied in and out with a string move each time: a cost per call that
// thousands of small parts paid once each).
constexpr std::size_t kReduceBlock = 64;  // elements per block (a fixed size: see above)
template <DType T>
void reduce_block(const void* const* slices, int world, void* out, std::size_t b, bool avg) {
  constexpr std::size_t kBlock = kReduceBlock;
  float acc[kBlock];
  for (std::size_t i = 0; i < kBlock; ++i) acc[i] = kernels::load_f32(slices[0], T, b + i);
  for (int r = 1; r < world; ++r)
    for (std::size_t i = 0; i < kBlock; ++i) acc[i] += kernels::load_f32(slices[r], T, b + i);
  if (avg) {
    const float divisor = static_cast<float>(world);
    for (std::size_t i = 0; i < kBlock; ++i) acc[i] = acc[i] / divisor;
  }
  for (std::size_t i = 0; i < kBlock; ++i) kernels::store_f32(out, T, b + i, acc[i]);
}
template <DType T>
void reduce_blocks(const void* const* slices, int world, void* out, std::size_t n, bool avg) {
  std::size_t b = 0;
  for (; b + kReduceBlock <= n; b += kReduceBlock) reduce_block<T>(slices, world, out, b, avg);
  for (; b < n; ++b) kernels::store_f32(out, T, b, kernels::reduce_ranks(slices, T, world, b, avg));
}
void reduce_into(const std::vector<const void*>& slices, DType t, void* out, std::size_t n, bool avg) {
  int world = static_cast<int>(slices.size());
  switch (t) {
    case DType::f32: reduce_blocks<DType::f32>(slices.data(), world, out, n, avg); break;
    case DType::bf16: reduce_blocks<DType::bf16>(slices.data(), world, out, n, avg); break;
    case DType::f16: reduce_blocks<DType::f16>(slices.data(), world, out, n, avg); break;
  }
}
}  // namespace

class LocalGroup {
 public:
  LocalGroup(int world_size, milliseconds collective_timeout)
      : world(world_size), timeout(collective_timeout), slots(world_size), points(world_size, 0),
        claimed(world_size, false) {}

  const int world;
  const milliseconds timeout;

  // Rendezvous: rank r arrives at its next meeting point (publishing `mine` first when
  // given) and waits until every rank has arrived at that point, or until `deadline`.
  // Returns every rank's descriptor when `mine` was given (copied under the lock: a
  // peer cannot publish its next one before this collective's closing rendezvous).
  // Throws TimeoutError naming the lowest rank that did not arrive, and CommError when
  // publishing into a group that already failed. A rank's abort (below) ends the wait of a
  // joining rank (`mine` given) at once with RankFailedError, unless every rank has arrived;
  // the meeting points inside a collective (`mine` null: every rank joined, they only wait
  // for each other's copying) are not cut short, so no rank leaves while a peer still reads
  // its buffers.
  std::vector<Descriptor> meet(int r, const Descriptor* mine, const Op& op, Clock::time_point deadline) {
    std::unique_lock lock(mutex);
    if (mine != nullptr) {
      // Before publishing: no peer may read this rank's buffers after it returns.
      if (aborted) throw_rank_failed(op.name, op.seq, r, *aborted, __FILE__, __LINE__);
      // A failed peer will never join: fail now instead of timing out, and before
      // publishing, so no peer can read this rank's buffers after it returns.
      if (!failure.empty()) {
        std::string message =
            detail::concat(op.name, " (collective #", op.seq, ") on rank ", r, ": the group failed earlier: ", failure);
        // A peer that timed out waiting for this collective means it timed out here too.
        if (failure_is_timeout) throw TimeoutError(message, __FILE__, __LINE__);
        ZOE_THROW_COMM(message);
      }
      slots[r] = *mine;
    }
    std::uint64_t point = ++points[r];
    cv.notify_all();
    auto all_arrived = [&] { return lowest_missing(point) < 0; };
    auto done_waiting = [&] { return all_arrived() || (mine != nullptr && aborted); };
    if (cv.wait_until(lock, deadline, done_waiting) && !all_arrived())
      throw_rank_failed(op.name, op.seq, r, *aborted, __FILE__, __LINE__);
    if (!all_arrived()) {
      int missing = lowest_missing(point);
      std::string message = detail::concat(
          op.name, " (collective #", op.seq, ") on rank ", r, " timed out after ", timeout.count() / 1000.0,
          " s waiting for rank ", missing,
          " to join (the lowest rank missing: it did not issue this collective, is stuck, or died)");
      if (failure.empty()) {
        failure = message;
        failure_is_timeout = true;
      }
      throw TimeoutError(message, __FILE__, __LINE__);
    }
    if (mine == nullptr) return {};
    return slots;
  }

  // Marks the group failed (the first message wins): later collectives fail at once.
  void fail(const std::string& message) {
    std::lock_guard lock(mutex);
    if (failure.empty()) failure = message;
  }

  // Rank r failed (Communicator::abort): the first failure is kept, and every rank waiting
  // to join a collective, or joining one later, throws naming it.
  void abort(int r, const std::string& cause) {
    {
      std::lock_guard lock(mutex);
      if (!aborted) aborted = RankFailure{r, cut_cause(cause)};
    }
    cv.notify_all();
  }

  void claim(int r) {
    std::lock_guard lock(mutex);
    ZOE_CHECK_USAGE(!claimed[r], "LocalCommunicator: rank ", r, " of this group already has a communicator");
    claimed[r] = true;
  }
  void release(int r) {
    std::lock_guard lock(mutex);
    claimed[r] = false;
  }

 private:
  int lowest_missing(std::uint64_t point) const {
    for (int p = 0; p < world; ++p)
      if (points[p] < point) return p;
    return -1;
  }

  std::mutex mutex;
  std::condition_variable cv;
  std::vector<Descriptor> slots;      // each rank's current collective (guarded by mutex)
  std::vector<std::uint64_t> points;  // meeting points each rank has arrived at (guarded)
  std::vector<bool> claimed;          // ranks that have a communicator (guarded)
  std::string failure;                // first failure of any rank (guarded)
  bool failure_is_timeout = false;    // that failure was a TimeoutError (guarded)
  std::optional<RankFailure> aborted;  // the first rank that called abort (guarded)
};

std::shared_ptr<LocalGroup> make_local_group(int world, milliseconds timeout) {
  ZOE_CHECK_USAGE(world >= 1, "make_local_group: world size must be >= 1, got ", world);
  ZOE_CHECK_USAGE(timeout.count() > 0, "make_local_group: timeout must be positive, got ", timeout.count(), " ms");
  return std::make_shared<LocalGroup>(world, timeout);
}

namespace {
// The parts' total elements; throws UsageError if a part's buffers overlap other than in the
// in-place layout (`recv_is_full`: all_gather's, recv holds count x world; else
// reduce_scatter's, send does).
std::size_t checked_total(std::span<const GroupedPart> parts, std::size_t esize, int world, int rank,
                          bool recv_is_full, const char* what) {
  std::size_t total = 0;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const GroupedPart& p = parts[k];
    const std::size_t bytes = p.count * esize;
    const std::size_t send_bytes = recv_is_full ? bytes : bytes * world;
    const std::size_t recv_bytes = recv_is_full ? bytes * world : bytes;
    const bool in_place = recv_is_full ? p.send == static_cast<const char*>(p.recv) + rank * bytes
                                       : p.recv == static_cast<const char*>(p.send) + rank * bytes;
    ZOE_CHECK_USAGE(in_place || !overlaps(p.send, send_bytes, p.recv, recv_bytes), what, ": part ", k,
                    "'s send and recv buffers overlap (only the in-place layout may)");
    total += p.count;
  }
  return total;
}
// Every rank's parts have the same counts (the join compared a hash of them; this rules out a
// collision before any part is read). Read between the join and the closing rendezvous.
bool same_part_counts(const std::vector<Descriptor>& all, std::span<const GroupedPart> mine) {
  for (const Descriptor& d : all)
    for (std::size_t k = 0; k < mine.size(); ++k)
      if (d.parts[k].count != mine[k].count) return false;
  return true;
}

// Software prefetch of part k's operands, asked for host_ops::kPrefetchAhead parts before
// their use, each part a small allocation of its own (the hardware prefetcher finds no stream
// in time): every rank's send (all-gather) or this rank's slice of it (reduce-scatter), and
// this rank's recv.
void prefetch_part(const std::vector<Descriptor>& all, std::size_t k, std::size_t es, int rank, bool gather) {
  const std::size_t bytes = all[static_cast<std::size_t>(rank)].parts[k].count * es;
  for (const Descriptor& d : all)
    host_ops::prefetch_read(static_cast<const char*>(d.parts[k].send) + (gather ? 0 : rank * bytes), bytes);
  host_ops::prefetch_write(all[static_cast<std::size_t>(rank)].parts[k].recv, gather ? bytes * all.size() : bytes);
}
}  // namespace

struct LocalCommunicator::Impl {
  int rank = 0, world = 1;
  std::shared_ptr<Device> device;
  std::shared_ptr<LocalGroup> group;

  std::vector<char> scratch;  // a private copy of an aliased send buffer (one collective at a time)

  const void* private_copy(const void* src, std::size_t bytes) {
    if (scratch.size() < bytes) scratch.resize(bytes);
    std::memcpy(scratch.data(), src, bytes);
    return scratch.data();
  }

  std::unique_ptr<CollectiveSequencer> sequencer;  // issue order, first-failure latch

  void submit(Stream& stream, const char* name, std::function<void(const Op&)> body) {
    sequencer->submit(stream, name, std::move(body));
  }

  // Publishes `mine` and waits for every rank to publish this collective; returns all
  // ranks' descriptors. Throws CommError (and fails the group) if they disagree.
  std::vector<Descriptor> join(const Op& op, const Descriptor& mine) {
    std::vector<Descriptor> all = group->meet(rank, &mine, op, op.deadline);
    for (int p = 0; p < world; ++p) {
      if (all[p].same_collective(mine)) continue;
      int lo = std::min(p, rank), hi = std::max(p, rank);
      std::string message = detail::concat("mismatched collectives: rank ", lo, " issued ", all[lo].describe(),
                                           " but rank ", hi, " issued ", all[hi].describe(),
                                           " (all ranks must issue the same collectives in the same order)");
      group->fail(message);
      ZOE_THROW_COMM(message);
    }
    return all;
  }

  // After the join of a grouped collective: throws CommError (after the closing rendezvous,
  // so no peer still reads this rank's buffers) unless every rank's part counts are equal.
  void check_part_counts(const Op& op, const std::vector<Descriptor>& all, std::span<const GroupedPart> mine);

  // A meeting point inside a collective whose ranks have all joined: they only wait for
  // each other's copying and arithmetic, never for anything outside the collective.
  void meet(const Op& op) { group->meet(rank, nullptr, op, Clock::now() + group->timeout); }

  Descriptor descriptor(const Op& op, std::size_t count, DType dtype, const CollectiveTag& tag) const {
    Descriptor d;
    d.name = op.name;
    d.seq = op.seq;
    d.count = count;
    d.dtype = dtype;
    d.tag = tag;
    return d;
  }
};

void LocalCommunicator::Impl::check_part_counts(const Op& op, const std::vector<Descriptor>& all,
                                                std::span<const GroupedPart> mine) {
  if (same_part_counts(all, mine)) return;
  const std::string message = detail::concat("mismatched collectives: the ranks' ", op.name, " (collective #", op.seq,
                                             ") parts have different counts with the same total and hash");
  group->fail(message);
  meet(op);
  ZOE_THROW_COMM(message);
}

LocalCommunicator::LocalCommunicator(std::shared_ptr<Device> device, std::shared_ptr<LocalGroup> group, int rank)
    : device_(std::move(device)), rank_(rank), impl_(std::make_unique<Impl>()) {
  ZOE_CHECK_USAGE(device_ != nullptr, "LocalCommunicator: null device");
  ZOE_CHECK_USAGE(group != nullptr, "LocalCommunicator: null group");
  ZOE_CHECK_USAGE(device_->kind() == DeviceKind::host, "LocalCommunicator needs a host device, got ",
                  device_->name(), " (peers read its buffers directly)");
  world_ = group->world;
  ZOE_CHECK_USAGE(rank >= 0 && rank < world_, "LocalCommunicator: rank ", rank, " is not in [0, world size ",
                  world_, ")");
  group->claim(rank);
  impl_->rank = rank;
  impl_->world = world_;
  impl_->device = device_;
  impl_->group = std::move(group);
  impl_->sequencer = std::make_unique<CollectiveSequencer>(*device_, rank, impl_->group->timeout);
}

LocalCommunicator::~LocalCommunicator() {
  impl_->sequencer->wait_idle();
  impl_->group->release(rank_);
}

void LocalCommunicator::abort(const std::string& cause) noexcept {
  try {
    impl_->group->abort(rank_, cause);
  } catch (...) {
  }
}

void LocalCommunicator::all_gather(const void* send, void* recv, std::size_t count, DType dtype, Stream& stream) {
  std::size_t bytes = count * dtype_size(dtype);
  count_all_gather(bytes * world_);
  impl_->submit(stream, "all_gather", [this, send, recv, count, bytes, dtype, tag = take_tag()](const Op& op) {
    char* out = static_cast<char*>(recv);
    Descriptor mine = impl_->descriptor(op, count, dtype, tag);
    mine.send = send;
    mine.recv = recv;
    // Peers read `send` while this rank writes `recv`: only the in-place layout is safe.
    if (overlaps(send, bytes, recv, bytes * world_) && send != out + rank_ * bytes)
      mine.send = impl_->private_copy(send, bytes);
    auto all = impl_->join(op, mine);
    for (int p = 0; p < world_; ++p)
      if (bytes > 0 && out + p * bytes != all[p].send) std::memcpy(out + p * bytes, all[p].send, bytes);
    impl_->meet(op);  // peers have finished reading this rank's send
  });
}

void LocalCommunicator::reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp rop,
                                       Stream& stream) {
  std::size_t bytes = count * dtype_size(dtype);
  count_reduce_scatter(bytes * world_);
  impl_->submit(stream, "reduce_scatter", [this, send, recv, count, bytes, dtype, rop, tag = take_tag()](const Op& op) {
    const char* in = static_cast<const char*>(send);
    Descriptor mine = impl_->descriptor(op, count, dtype, tag);
    mine.reduce = static_cast<int>(rop);
    mine.send = send;
    mine.recv = recv;
    // Peers read every slice of `send` but this rank's own, while this rank writes `recv`.
    if (overlaps(recv, bytes, send, bytes * world_) && recv != in + rank_ * bytes)
      mine.send = impl_->private_copy(send, bytes * world_);
    auto all = impl_->join(op, mine);
    std::vector<const void*> slices(world_);
    for (int p = 0; p < world_; ++p) slices[p] = static_cast<const char*>(all[p].send) + rank_ * bytes;
    reduce_into(slices, dtype, recv, count, rop == ReduceOp::avg);
    impl_->meet(op);
  });
}

void LocalCommunicator::all_gather_grouped(std::span<const GroupedPart> parts, DType dtype, Stream& stream) {
  const std::size_t es = dtype_size(dtype);
  const std::size_t total = checked_total(parts, es, world_, rank_, true, "all_gather_grouped");
  count_all_gather(total * es * world_);
  impl_->submit(stream, "all_gather_grouped",
                [this, mine_parts = std::vector<GroupedPart>(parts.begin(), parts.end()), total, es, dtype,
                 tag = take_tag()](const Op& op) {
                  Descriptor mine = impl_->descriptor(op, total, dtype, tag);
                  mine.set_parts(mine_parts);
                  auto all = impl_->join(op, mine);
                  impl_->check_part_counts(op, all, mine_parts);
                  host_ops::for_each_prefetched(
                      mine_parts.size(), [&](std::size_t k) { prefetch_part(all, k, es, rank_, true); },
                      [&](std::size_t k) {
                        const std::size_t bytes = mine_parts[k].count * es;
                        char* out = static_cast<char*>(mine_parts[k].recv);
                        for (int p = 0; p < world_; ++p) {
                          const void* theirs = all[p].parts[k].send;
                          if (bytes > 0 && out + p * bytes != theirs) std::memcpy(out + p * bytes, theirs, bytes);
                        }
                      });
                  impl_->meet(op);  // peers have finished reading this rank's sends
                });
}

void LocalCommunicator::reduce_scatter_grouped(std::span<const GroupedPart> parts, DType dtype, ReduceOp rop,
                                               Stream& stream) {
  const std::size_t es = dtype_size(dtype);
  const std::size_t total = checked_total(parts, es, world_, rank_, false, "reduce_scatter_grouped");
  count_reduce_scatter(total * es * world_);
  impl_->submit(stream, "reduce_scatter_grouped",
                [this, mine_parts = std::vector<GroupedPart>(parts.begin(), parts.end()), total, es, dtype, rop,
                 tag = take_tag()](const Op& op) {
                  Descriptor mine = impl_->descriptor(op, total, dtype, tag);
                  mine.reduce = static_cast<int>(rop);
                  mine.set_parts(mine_parts);
                  auto all = impl_->join(op, mine);
                  impl_->check_part_counts(op, all, mine_parts);
                  std::vector<const void*> slices(world_);
                  host_ops::for_each_prefetched(
                      mine_parts.size(), [&](std::size_t k) { prefetch_part(all, k, es, rank_, false); },
                      [&](std::size_t k) {
                        const std::size_t bytes = mine_parts[k].count * es;
                        for (int p = 0; p < world_; ++p)
                          slices[p] = static_cast<const char*>(all[p].parts[k].send) + rank_ * bytes;
                        reduce_into(slices, dtype, mine_parts[k].recv, mine_parts[k].count, rop == ReduceOp::avg);
                      });
                  impl_->meet(op);
                });
}

void LocalCommunicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp rop,
                                   Stream& stream) {
  std::size_t es = dtype_size(dtype);
  count_all_reduce(count * es);
  impl_->submit(stream, "all_reduce", [this, send, recv, count, es, dtype, rop, tag = take_tag()](const Op& op) {
    char* out = static_cast<char*>(recv);
    Descriptor mine = impl_->descriptor(op, count, dtype, tag);
    mine.reduce = static_cast<int>(rop);
    mine.send = send;
    mine.recv = recv;
    // In place is safe (each part is written only by the rank that reads it last);
    // a partial overlap is not.
    if (send != recv && overlaps(send, count * es, recv, count * es))
      mine.send = impl_->private_copy(send, count * es);
    auto all = impl_->join(op, mine);
    // Phase 1: this rank's part, reduced over every rank's send, into its recv.
    std::size_t begin = part_begin(count, world_, rank_);
    std::vector<const void*> slices(world_);
    for (int p = 0; p < world_; ++p) slices[p] = static_cast<const char*>(all[p].send) + begin * es;
    reduce_into(slices, dtype, out + begin * es, part_size(count, world_, rank_), rop == ReduceOp::avg);
    impl_->meet(op);  // every part is reduced; no rank reads a send buffer any more
    // Phase 2: the other ranks' reduced parts, from their recv buffers.
    for (int p = 0; p < world_; ++p) {
      std::size_t b = part_begin(count, world_, p), n = part_size(count, world_, p);
      if (p != rank_ && n > 0) std::memcpy(out + b * es, static_cast<const char*>(all[p].recv) + b * es, n * es);
    }
    impl_->meet(op);
  });
}

void LocalCommunicator::all_reduce_f64(double* data, std::size_t count, Stream& stream) {
  count_all_reduce(count * sizeof(double));
  impl_->submit(stream, "all_reduce_f64", [this, data, count, tag = take_tag()](const Op& op) {
    Descriptor mine = impl_->descriptor(op, count, DType::f32, tag);
    mine.typed = false;
    mine.send = data;
    auto all = impl_->join(op, mine);
    // Every rank sums all values (they are few) into a private buffer, and writes `data`
    // only after the closing rendezvous, once no peer reads it any more.
    std::vector<const double*> slices(world_);
    for (int p = 0; p < world_; ++p) slices[p] = static_cast<const double*>(all[p].send);
    std::vector<double> sum(count);
    for (std::size_t i = 0; i < count; ++i) sum[i] = kernels::reduce_ranks_f64(slices.data(), world_, i);
    impl_->meet(op);
    if (count > 0) std::memcpy(data, sum.data(), count * sizeof(double));
  });
}

void LocalCommunicator::broadcast(void* buf, std::size_t count, DType dtype, int root, Stream& stream) {
  ZOE_CHECK_USAGE(root >= 0 && root < world_, "broadcast: root ", root, " is not in [0, world size ", world_, ")");
  std::size_t bytes = count * dtype_size(dtype);
  count_broadcast(bytes);
  impl_->submit(stream, "broadcast", [this, buf, count, bytes, dtype, root, tag = take_tag()](const Op& op) {
    Descriptor mine = impl_->descriptor(op, count, dtype, tag);
    mine.root = root;
    mine.send = buf;
    auto all = impl_->join(op, mine);
    if (rank_ != root && bytes > 0) std::memcpy(buf, all[root].send, bytes);
    impl_->meet(op);  // the root's buffer is read until here
  });
}

void LocalCommunicator::barrier(Stream& stream) {
  impl_->submit(stream, "barrier", [this, tag = take_tag()](const Op& op) {
    Descriptor mine = impl_->descriptor(op, 0, DType::f32, tag);
    mine.typed = false;
    impl_->join(op, mine);
    impl_->meet(op);  // keeps this rank's descriptor in place until every peer has read it
  });
}

}  // namespace zoe
