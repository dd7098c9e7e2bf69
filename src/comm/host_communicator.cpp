#include "src/comm/host_communicator.hpp"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "kernels/reduce.hpp"
#include "src/comm/collective_sequencer.hpp"
#include "src/comm/rank_failure.hpp"
#include "src/common/check.hpp"


namespace zoe {
namespace {
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Gloo's rendezvous reads and writes addresses through its own Store interface.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(KeyValueStore& store, std::string prefix, milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_.set(prefix_ + key, data); }
  std::vector<char> get(const std::string& key) override {
    return store_.get(prefix_ + key, timeout_, "Gloo rendezvous");
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    for (const auto& key : keys) store_.get(prefix_ + key, timeout, "Gloo rendezvous");
  }

 private:
  KeyValueStore& store_;
  std::string prefix_;
  milliseconds timeout_;
};

// The N near-equal parts all_reduce splits a buffer of `count` elements into.
std::size_t part_begin(std::size_t count, int world, int r) {
  std::size_t base = count / world, extra = count % world;
  return r * base + std::min<std::size_t>(r, extra);
}
std::size_t part_size(std::size_t count, int world, int r) {
  return part_begin(count, world, r + 1) - part_begin(count, world, r);
}

// out[i] = reduction of slices[0..world)[i], in rank order; dtype fixed at compile time
// so the per-element dtype switch folds away.
template <DType T>
void reduce_loop(const void* const* slices, int world, void* out, std::size_t n, bool avg) {
  for (std::size_t i = 0; i < n; ++i) kernels::store_f32(out, T, i, kernels::reduce_ranks(slices, T, world, i, avg));
}
void reduce_into(const std::vector<const void*>& slices, DType t, void* out, std::size_t n, bool avg) {
  int world = static_cast<int>(slices.size());
  switch (t) {
    case DType::f32: reduce_loop<DType::f32>(slices.data(), world, out, n, avg); break;
    case DType::bf16: reduce_loop<DType::bf16>(slices.data(), world, out, n, avg); break;
    case DType::f16: reduce_loop<DType::f16>(slices.data(), world, out, n, avg); break;
  }
}

using Op = CollectiveOp;

// What every rank sends its peers before a collective (phase 2 of the collective's slots):
// its shape and tag, compared so that different collectives never pair (even with equal sizes).
struct Header {
  char name[16] = {};
  std::uint64_t count = 0;
  std::int32_t dtype = -1;   // DType as int; -1 when untyped (all_reduce_f64, barrier)
  std::int32_t reduce = -1;  // ReduceOp as int; -1 when not reducing
  std::int32_t root = -1;    // broadcast's root, else -1
  std::int32_t kind = 0;     // CollectiveTag
  std::int32_t group = -1;
  std::int32_t micro_batch = -1;
  std::int64_t step = -1;
  char label[96] = {};

  Header() = default;
  Header(const Op& op, std::size_t n, int dt, int rop, int rt, const CollectiveTag& tag)
      : count(n), dtype(dt), reduce(rop), root(rt), kind(static_cast<std::int32_t>(tag.kind)), group(tag.group),
        micro_batch(tag.micro_batch), step(tag.step) {
    std::strncpy(name, op.name, sizeof(name) - 1);
    std::strncpy(label, tag.label.c_str(), sizeof(label) - 1);
  }
  bool same(const Header& o) const {
    return std::strncmp(name, o.name, sizeof(name)) == 0 && count == o.count && dtype == o.dtype &&
           reduce == o.reduce && root == o.root && kind == o.kind && group == o.group &&
           micro_batch == o.micro_batch && step == o.step;
  }
  std::string describe(std::uint64_t seq) const {
    CollectiveTag t;
    t.kind = static_cast<CollectiveTag::Kind>(kind);
    t.group = group;
    t.step = step;
    t.micro_batch = micro_batch;
    t.label = std::string(label, strnlen(label, sizeof(label)));
    std::string s = detail::concat(std::string(name, strnlen(name, sizeof(name))), " (collective #", seq, ", count ", count);
    if (dtype >= 0) s += detail::concat(", ", dtype_name(static_cast<DType>(dtype)));
    if (reduce >= 0) s += reduce == static_cast<int>(ReduceOp::avg) ? ", avg" : ", sum";
    if (root >= 0) s += detail::concat(", root ", root);
    return s + t.describe() + ")";
  }
};

struct SendSpec {
  int peer;
  const void* ptr;
  std::size_t bytes;
};
struct RecvSpec {
  int peer;
  void* ptr;
  std::size_t bytes;
};
}  // namespace

struct HostCommunicator::Impl {
  int rank = 0, world = 1;
  milliseconds timeout;
  std::shared_ptr<Device> device;
  std::shared_ptr<KeyValueStore> store;
  std::shared_ptr<gloo::transport::Device> transport;
  std::shared_ptr<gloo::rendezvous::Context> context;

  std::vector<char> scratch;     // used by one collective at a time (they are serialized)

  char* scratch_bytes(std::size_t bytes) {
    if (scratch.size() < bytes) scratch.resize(bytes);
    return scratch.data();
  }

  std::unique_ptr<CollectiveSequencer> sequencer;  // issue order, first-failure latch

  // Rank failures (abort): the first known, and the transfers being waited for, which a
  // failure interrupts (abortWaitRecv / abortWaitSend make their waits return false).
  std::mutex failure_mutex;
  std::optional<RankFailure> failure;                   // guarded by failure_mutex
  std::vector<gloo::transport::UnboundBuffer*> active;  // guarded by failure_mutex

  void on_failure(const RankFailure& f) {
    std::lock_guard lock(failure_mutex);
    if (!failure) failure = f;
    for (auto* buf : active) {
      buf->abortWaitRecv();
      buf->abortWaitSend();
    }
  }
  std::optional<RankFailure> known_failure() {
    std::lock_guard lock(failure_mutex);
    return failure;
  }

  // Registers a phase's transfers as active for as long as it lives (the vectors must
  // outlive it); throws if a rank failed already.
  struct ActiveTransfers {
    Impl& impl;
    std::size_t count = 0;
    ActiveTransfers(Impl& i, const Op& op,
                    const std::vector<std::pair<int, std::unique_ptr<gloo::transport::UnboundBuffer>>>& a,
                    const std::vector<std::pair<int, std::unique_ptr<gloo::transport::UnboundBuffer>>>& b)
        : impl(i) {
      std::lock_guard lock(impl.failure_mutex);
      if (impl.failure) throw_rank_failed(op.name, op.seq, impl.rank, *impl.failure, __FILE__, __LINE__);
      for (const auto* v : {&a, &b})
        for (const auto& [peer, buf] : *v) impl.active.push_back(buf.get());
      count = a.size() + b.size();
    }
    ~ActiveTransfers() {
      std::lock_guard lock(impl.failure_mutex);
      impl.active.resize(impl.active.size() - count);
    }
  };

  void submit(Stream& stream, const char* name, std::function<void(const Op&)> body) {
    sequencer->submit(stream, name, std::move(body));
  }

  // Posts every receive and send of one phase of `op`, then waits for the receives in
  // rank order and then the sends, each bounded by the op's deadline.
  void exchange(const Op& op, int phase, const std::vector<SendSpec>& sends, const std::vector<RecvSpec>& recvs) {
    std::uint64_t slot = op.seq * 4 + static_cast<std::uint64_t>(phase);
    std::vector<std::pair<int, std::unique_ptr<gloo::transport::UnboundBuffer>>> rbufs, sbufs;
    try {
      for (const auto& r : recvs) {
        if (r.bytes == 0) continue;
        auto buf = context->createUnboundBuffer(r.ptr, r.bytes);
        buf->recv(r.peer, slot);
        rbufs.emplace_back(r.peer, std::move(buf));
      }
      for (const auto& s : sends) {
        if (s.bytes == 0) continue;
        auto buf = context->createUnboundBuffer(const_cast<void*>(s.ptr), s.bytes);
        buf->send(s.peer, slot);
        sbufs.emplace_back(s.peer, std::move(buf));
      }
    } catch (const gloo::Exception& e) {
      ZOE_THROW_COMM(op.name, " (collective #", op.seq, ") on rank ", rank, ": posting transfers failed: ", e.what());
    }
    ActiveTransfers registered(*this, op, rbufs, sbufs);
    for (auto& [peer, buf] : rbufs) wait_one(op, peer, *buf, true);
    for (auto& [peer, buf] : sbufs) wait_one(op, peer, *buf, false);
  }

  // Exchanges `mine` with every peer and throws CommError naming both sides if a peer is
  // about to run a different collective (each rank compares, so every rank throws).
  void check_same(const Op& op, const Header& mine) {
    if (world == 1) return;
    std::vector<Header> theirs(world);
    std::vector<SendSpec> sends;
    std::vector<RecvSpec> recvs;
    for (int p = 0; p < world; ++p) {
      if (p == rank) continue;
      recvs.push_back({p, &theirs[p], sizeof(Header)});
      sends.push_back({p, &mine, sizeof(Header)});
    }
    exchange(op, 2, sends, recvs);
    for (int p = 0; p < world; ++p) {
      if (p == rank || theirs[p].same(mine)) continue;
      const Header& lo = p < rank ? theirs[p] : mine;
      const Header& hi = p < rank ? mine : theirs[p];
      ZOE_THROW_COMM("mismatched collectives: rank ", std::min(p, rank), " issued ", lo.describe(op.seq), " but rank ",
                     std::max(p, rank), " issued ", hi.describe(op.seq),
                     " (all ranks must issue the same collectives in the same order)");
    }
  }

  void wait_one(const Op& op, int peer, gloo::transport::UnboundBuffer& buf, bool recv) {
    auto left = std::chrono::duration_cast<milliseconds>(op.deadline - Clock::now());
    if (left < milliseconds(1)) left = milliseconds(1);
    bool done = false;
    try {
      done = recv ? buf.waitRecv(nullptr, left) : buf.waitSend(nullptr, left);
    } catch (const gloo::Exception& e) {
      // A peer that failed and exited closes its connections: say why it failed if it
      // told the store first.
      if (auto f = channel ? channel->check_now() : known_failure())
        throw_rank_failed(op.name, op.seq, rank, *f, __FILE__, __LINE__);
      if (Clock::now() >= op.deadline)
        ZOE_THROW(TimeoutError, op.name, " (collective #", op.seq, ") on rank ", rank, " timed out after ",
                  timeout.count() / 1000.0, " s waiting ", (recv ? "for data from" : "to send to"), " rank ", peer,
                  " (the lowest rank missing: it did not issue this collective, is stuck, or died)");
      ZOE_THROW_COMM(op.name, " (collective #", op.seq, ") on rank ", rank, ": transfer ",
                     (recv ? "from" : "to"), " rank ", peer, " failed: ", e.what());
    }
    if (!done) {
      if (auto f = known_failure()) throw_rank_failed(op.name, op.seq, rank, *f, __FILE__, __LINE__);
      ZOE_THROW_COMM(op.name, " (collective #", op.seq, ") on rank ", rank, ": transfer with rank ", peer,
                     " was aborted");
    }
  }

  // The error side channel of ranks as processes (last member: destroyed first, it calls
  // on_failure from its thread).
  std::unique_ptr<StoreAbortChannel> channel;
};

HostCommunicator::HostCommunicator(std::shared_ptr<Device> device, std::shared_ptr<KeyValueStore> store, int rank,
                                   int world, HostCommOptions options)
    : device_(std::move(device)), rank_(rank), world_(world), impl_(std::make_unique<Impl>()) {
  ZOE_CHECK_USAGE(device_ != nullptr, "HostCommunicator: null device");
  ZOE_CHECK_USAGE(device_->kind() == DeviceKind::host, "HostCommunicator needs a host device, got ",
                  device_->name(), " (use the NCCL communicator for CUDA devices)");
  ZOE_CHECK_USAGE(world >= 1 && rank >= 0 && rank < world, "HostCommunicator: rank ", rank,
                  " is not in [0, world size ", world, ")");
  ZOE_CHECK_USAGE(options.timeout.count() > 0, "HostCommunicator: timeout must be positive, got ",
                  options.timeout.count(), " ms");
  impl_->rank = rank;
  impl_->world = world;
  impl_->timeout = options.timeout;
  impl_->device = device_;
  impl_->sequencer = std::make_unique<CollectiveSequencer>(*device_, rank, options.timeout);
  impl_->store = std::move(store);
  if (world == 1) return;  // no peers: every collective is a local copy
  ZOE_CHECK_USAGE(impl_->store != nullptr, "HostCommunicator: null store for world size ", world);
  wait_for_all_ranks(*impl_->store, options.prefix, rank, world, options.timeout);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    impl_->transport = gloo::transport::tcp::CreateDevice(attr);
    impl_->context = std::make_shared<gloo::rendezvous::Context>(rank, world);
    impl_->context->setTimeout(options.timeout);
    GlooStoreAdapter adapter(*impl_->store, options.prefix + "/gloo/", options.timeout);
    impl_->context->connectFullMesh(adapter, impl_->transport);
  } catch (const gloo::Exception& e) {
    ZOE_THROW_COMM("HostCommunicator: rank ", rank, " of ", world, " could not connect (Gloo TCP on '",
                   options.hostname, "'): ", e.what());
  }
  Impl* impl = impl_.get();
  impl_->channel = std::make_unique<StoreAbortChannel>(impl_->store, options.prefix, rank, world,
                                                       [impl](const RankFailure& f) { impl->on_failure(f); });
}

void HostCommunicator::abort(const std::string& cause) noexcept {
  try {
    if (!impl_->channel) {  // world size 1: nobody to tell
      impl_->on_failure(RankFailure{rank_, cut_cause(cause)});
      return;
    }
    // This rank's own waits end first; then the peers learn it (post waits for their
    // acknowledgements).
    if (auto earlier = impl_->channel->known()) {
      impl_->on_failure(*earlier);
      return;
    }
    impl_->on_failure(RankFailure{rank_, cut_cause(cause)});
    impl_->channel->post(cause);
  } catch (...) {
  }
}

HostCommunicator::~HostCommunicator() {
  impl_->sequencer->wait_idle();
}

void HostCommunicator::all_gather(const void* send, void* recv, std::size_t count, DType dtype, Stream& stream) {
  std::size_t bytes = count * dtype_size(dtype);
  count_all_gather(bytes * world_);
  impl_->submit(stream, "all_gather", [this, send, recv, count, bytes, dtype, tag = take_tag()](const Op& op) {
    impl_->check_same(op, Header(op, count, static_cast<int>(dtype), -1, -1, tag));
    if (bytes == 0) return;
    char* out = static_cast<char*>(recv);
    if (out + rank_ * bytes != send) std::memmove(out + rank_ * bytes, send, bytes);
    std::vector<SendSpec> sends;
    std::vector<RecvSpec> recvs;
    for (int p = 0; p < world_; ++p)
      if (p != rank_) recvs.push_back({p, out + p * bytes, bytes});
    for (int d = 1; d < world_; ++d) sends.push_back({(rank_ + d) % world_, send, bytes});
    impl_->exchange(op, 0, sends, recvs);
  });
}

void HostCommunicator::reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp rop,
                                      Stream& stream) {
  std::size_t bytes = count * dtype_size(dtype);
  count_reduce_scatter(bytes * world_);
  impl_->submit(stream, "reduce_scatter", [this, send, recv, count, bytes, dtype, rop, tag = take_tag()](const Op& op) {
    impl_->check_same(op, Header(op, count, static_cast<int>(dtype), static_cast<int>(rop), -1, tag));
    if (count == 0) return;
    const char* in = static_cast<const char*>(send);
    char* tmp = impl_->scratch_bytes(bytes * world_);
    std::vector<SendSpec> sends;
    std::vector<RecvSpec> recvs;
    std::vector<const void*> slices(world_);
    for (int p = 0; p < world_; ++p) {
      slices[p] = p == rank_ ? static_cast<const void*>(in + p * bytes) : tmp + p * bytes;
      if (p == rank_) continue;
      recvs.push_back({p, tmp + p * bytes, bytes});
      sends.push_back({p, in + p * bytes, bytes});
    }
    impl_->exchange(op, 0, sends, recvs);
    reduce_into(slices, dtype, recv, count, rop == ReduceOp::avg);
  });
}

void HostCommunicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp rop,
                                  Stream& stream) {
  std::size_t es = dtype_size(dtype);
  count_all_reduce(count * es);
  impl_->submit(stream, "all_reduce", [this, send, recv, count, es, dtype, rop, tag = take_tag()](const Op& op) {
    impl_->check_same(op, Header(op, count, static_cast<int>(dtype), static_cast<int>(rop), -1, tag));
    if (count == 0) return;
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    std::size_t mine = part_size(count, world_, rank_), my_begin = part_begin(count, world_, rank_);
    char* tmp = impl_->scratch_bytes(mine * es * world_);
    // Phase 0: reduce-scatter of the parts (part p goes to rank p).
    std::vector<SendSpec> sends;
    std::vector<RecvSpec> recvs;
    std::vector<const void*> slices(world_);
    for (int p = 0; p < world_; ++p) {
      slices[p] = p == rank_ ? static_cast<const void*>(in + my_begin * es) : tmp + p * mine * es;
      if (p == rank_) continue;
      recvs.push_back({p, tmp + p * mine * es, mine * es});
      sends.push_back({p, in + part_begin(count, world_, p) * es, part_size(count, world_, p) * es});
    }
    impl_->exchange(op, 0, sends, recvs);
    reduce_into(slices, dtype, out + my_begin * es, mine, rop == ReduceOp::avg);
    // Phase 1: all-gather of the reduced parts.
    sends.clear();
    recvs.clear();
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) continue;
      recvs.push_back({p, out + part_begin(count, world_, p) * es, part_size(count, world_, p) * es});
      sends.push_back({p, out + my_begin * es, mine * es});
    }
    impl_->exchange(op, 1, sends, recvs);
  });
}

void HostCommunicator::all_reduce_f64(double* data, std::size_t count, Stream& stream) {
  count_all_reduce(count * sizeof(double));
  impl_->submit(stream, "all_reduce_f64", [this, data, count, tag = take_tag()](const Op& op) {
    impl_->check_same(op, Header(op, count, -1, -1, -1, tag));
    if (count == 0 || world_ == 1) return;
    std::size_t bytes = count * sizeof(double);
    auto* all = reinterpret_cast<double*>(impl_->scratch_bytes(bytes * world_));
    std::memcpy(all + rank_ * count, data, bytes);
    std::vector<SendSpec> sends;
    std::vector<RecvSpec> recvs;
    std::vector<const double*> slices(world_);
    for (int p = 0; p < world_; ++p) {
      slices[p] = all + p * count;
      if (p == rank_) continue;
      recvs.push_back({p, all + p * count, bytes});
      sends.push_back({p, data, bytes});
    }
    impl_->exchange(op, 0, sends, recvs);
    for (std::size_t i = 0; i < count; ++i) data[i] = kernels::reduce_ranks_f64(slices.data(), world_, i);
  });
}

void HostCommunicator::broadcast(void* buf, std::size_t count, DType dtype, int root, Stream& stream) {
  ZOE_CHECK_USAGE(root >= 0 && root < world_, "broadcast: root ", root, " is not in [0, world size ", world_, ")");
  std::size_t bytes = count * dtype_size(dtype);
  count_broadcast(bytes);
  impl_->submit(stream, "broadcast", [this, buf, count, bytes, dtype, root, tag = take_tag()](const Op& op) {
    impl_->check_same(op, Header(op, count, static_cast<int>(dtype), -1, root, tag));
    if (bytes == 0 || world_ == 1) return;
    std::vector<SendSpec> sends;
    std::vector<RecvSpec> recvs;
    if (rank_ == root) {
      for (int p = 0; p < world_; ++p)
        if (p != root) sends.push_back({p, buf, bytes});
    } else {
      recvs.push_back({root, buf, bytes});
    }
    impl_->exchange(op, 0, sends, recvs);
  });
}

void HostCommunicator::barrier(Stream& stream) {
  impl_->submit(stream, "barrier", [this, tag = take_tag()](const Op& op) {
    impl_->check_same(op, Header(op, 0, -1, -1, -1, tag));
    if (world_ == 1) return;
    static const char token = 1;
    std::vector<char> tokens(world_);
    std::vector<SendSpec> sends;
    std::vector<RecvSpec> recvs;
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) continue;
      recvs.push_back({p, &tokens[p], 1});
      sends.push_back({p, &token, 1});
    }
    impl_->exchange(op, 0, sends, recvs);
  });
}

}  // namespace zoe
