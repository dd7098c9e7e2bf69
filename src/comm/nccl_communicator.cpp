#include "src/comm/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "kernels/elementwise_cuda.hpp"
#include "src/comm/rank_failure.hpp"
#include "src/common/check.hpp"
#include "src/common/log.hpp"
#include "src/device/cuda_device.hpp"

namespace zoe {
namespace {
using Clock = std::chrono::steady_clock;

// The NCCL entry points zoe uses, resolved from libnccl.so.2 at run time.
struct NcclApi {
  decltype(&::ncclGetUniqueId) GetUniqueId;
  decltype(&::ncclCommInitRank) CommInitRank;
  decltype(&::ncclCommDestroy) CommDestroy;
  decltype(&::ncclCommAbort) CommAbort;
  decltype(&::ncclGetErrorString) GetErrorString;
  decltype(&::ncclAllGather) AllGather;
  decltype(&::ncclAllReduce) AllReduce;
  decltype(&::ncclBroadcast) Broadcast;
  decltype(&::ncclSend) Send;
  decltype(&::ncclRecv) Recv;
  decltype(&::ncclGroupStart) GroupStart;
  decltype(&::ncclGroupEnd) GroupEnd;
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    void* lib = nullptr;
    std::string errors;
    for (const char* name : {"libnccl.so.2", "libnccl.so"}) {
      lib = ::dlopen(name, RTLD_NOW | RTLD_GLOBAL);
      if (lib) break;
      errors += std::string(errors.empty() ? "" : "; ") + ::dlerror();
    }
    if (!lib) throw CommError("NCCL could not be loaded (" + errors + "); install NCCL or add it to LD_LIBRARY_PATH", 0,
                              __FILE__, __LINE__);
    auto sym = [&](const char* name) {
      void* p = ::dlsym(lib, name);
      if (!p) throw CommError(std::string("NCCL library lacks ") + name, 0, __FILE__, __LINE__);
      return p;
    };
    NcclApi a;
    a.GetUniqueId = reinterpret_cast<decltype(a.GetUniqueId)>(sym("ncclGetUniqueId"));
    a.CommInitRank = reinterpret_cast<decltype(a.CommInitRank)>(sym("ncclCommInitRank"));
    a.CommDestroy = reinterpret_cast<decltype(a.CommDestroy)>(sym("ncclCommDestroy"));
    a.CommAbort = reinterpret_cast<decltype(a.CommAbort)>(sym("ncclCommAbort"));
    a.GetErrorString = reinterpret_cast<decltype(a.GetErrorString)>(sym("ncclGetErrorString"));
    a.AllGather = reinterpret_cast<decltype(a.AllGather)>(sym("ncclAllGather"));
    a.AllReduce = reinterpret_cast<decltype(a.AllReduce)>(sym("ncclAllReduce"));
    a.Broadcast = reinterpret_cast<decltype(a.Broadcast)>(sym("ncclBroadcast"));
    a.Send = reinterpret_cast<decltype(a.Send)>(sym("ncclSend"));
    a.Recv = reinterpret_cast<decltype(a.Recv)>(sym("ncclRecv"));
    a.GroupStart = reinterpret_cast<decltype(a.GroupStart)>(sym("ncclGroupStart"));
    a.GroupEnd = reinterpret_cast<decltype(a.GroupEnd)>(sym("ncclGroupEnd"));
    return a;
  }();
  return api;
}

void check_nccl(ncclResult_t r, const char* what, const char* file, int line) {
  if (r != ncclSuccess)
    throw CommError(std::string(what) + ": " + nccl().GetErrorString(r), static_cast<int>(r), file, line);
}
void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess)
    throw CudaError(std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e),
                    static_cast<int>(e), file, line);
}
#define ZOE_NCCL(call, what) check_nccl((call), what, __FILE__, __LINE__)
#define ZOE_CUDA(call, what) check_cuda((call), what, __FILE__, __LINE__)

std::size_t part_begin(std::size_t count, int world, int r) {
  std::size_t base = count / world, extra = count % world;
  return r * base + std::min<std::size_t>(r, extra);
}
std::size_t part_size(std::size_t count, int world, int r) {
  return part_begin(count, world, r + 1) - part_begin(count, world, r);
}
}  // namespace

struct NcclCommunicator::Impl {
  CudaDevice* cuda = nullptr;
  int rank = 0, world = 1;
  std::chrono::milliseconds timeout;
  std::shared_ptr<KeyValueStore> store;
  ncclComm_t comm = nullptr;
  int* barrier_flag = nullptr;
  std::uint64_t issued = 0;

  // Watchdog: collectives in flight, oldest first.
  struct InFlight {
    const char* name;
    std::uint64_t seq;
    cudaEvent_t start, end;
    std::optional<Clock::time_point> started;
  };
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<InFlight> in_flight;
  // Shared with the host funcs that report an abort, which may run after this is destroyed.
  struct AbortState {
    std::atomic<bool> aborted{false};
    std::mutex mutex;
    std::string reason;
    std::optional<RankFailure> failure;  // set when a rank failed (abort), not on a timeout
    std::string get() {
      std::lock_guard lock(mutex);
      return reason;
    }
    std::optional<RankFailure> rank_failure() {
      std::lock_guard lock(mutex);
      return failure;
    }
  };
  std::shared_ptr<AbortState> abort = std::make_shared<AbortState>();
  bool stopping = false;
  std::thread watchdog;
  // Held while NCCL calls are queued on `comm` and while it is aborted: ncclCommAbort frees the
  // communicator, so no call may use it concurrently (the watchdog and the abort channel's
  // thread abort it). Never held together with `mutex` by the issuing thread.
  std::mutex comm_mutex;

  // Aborts the NCCL communicator once (the stuck kernels return), recording why. `failure`:
  // a rank failed (abort), else a timeout. Returns false if it was aborted already.
  bool abort_comm(const std::string& reason, std::optional<RankFailure> failure) {
    std::lock_guard comm_lock(comm_mutex);
    if (abort->aborted) return false;
    {
      std::lock_guard reason_lock(abort->mutex);
      abort->reason = reason;
      abort->failure = std::move(failure);
    }
    abort->aborted = true;
    nccl().CommAbort(comm);
    return true;
  }

  void watch() {
    cuda->make_current();
    std::unique_lock lock(mutex);
    while (!stopping) {
      cv.wait_for(lock, std::chrono::milliseconds(20));
      while (!in_flight.empty()) {
        InFlight& f = in_flight.front();
        if (cudaEventQuery(f.end) == cudaSuccess) {
          cudaEventDestroy(f.start);
          cudaEventDestroy(f.end);
          in_flight.pop_front();
          continue;
        }
        if (!f.started && cudaEventQuery(f.start) == cudaSuccess) f.started = Clock::now();
        if (f.started && Clock::now() - *f.started > timeout && !abort->aborted) {
          std::string reason = detail::concat(f.name, " (collective #", f.seq, ") on rank ", rank, " timed out after ",
                                        timeout.count() / 1000.0, " s: a rank did not issue it, is stuck, or died ",
                                        "(NCCL cannot tell which); the NCCL communicator was aborted");
          ZOE_LOG_ERROR("{}", reason);
          lock.unlock();  // the issuing thread must not wait for `mutex` during the abort
          abort_comm(reason, std::nullopt);  // makes the stuck kernels return
          lock.lock();
        }
        break;
      }
    }
  }

  // Runs `body` (which queues NCCL work and kernels on `s`) as one watched collective.
  template <class Body>
  void collective(const char* name, Stream& stream, Body body) {
    InFlight f{name, issued++, nullptr, nullptr, std::nullopt};
    {
      std::lock_guard comm_lock(comm_mutex);
      if (abort->aborted) {
        if (auto failure = abort->rank_failure()) throw_rank_failed(name, f.seq, rank, *failure, __FILE__, __LINE__);
        throw CommError(detail::concat(name, " on rank ", rank, ": the communicator is unusable after an earlier ",
                                       "failure: ", abort->get()),
                        0, __FILE__, __LINE__);
      }
      cuda->make_current();
      auto s = static_cast<cudaStream_t>(CudaDevice::native(stream));
      ZOE_CUDA(cudaEventCreateWithFlags(&f.start, cudaEventDisableTiming), "cudaEventCreate");
      ZOE_CUDA(cudaEventCreateWithFlags(&f.end, cudaEventDisableTiming), "cudaEventCreate");
      ZOE_CUDA(cudaEventRecord(f.start, s), "cudaEventRecord");
      body(s);
      ZOE_CUDA(cudaEventRecord(f.end, s), "cudaEventRecord");
    }
    {
      std::lock_guard lock(mutex);
      in_flight.push_back(f);
    }
    // Reports an abort of this collective at synchronize(stream): RankFailedError naming the
    // rank that failed, else the watchdog's TimeoutError.
    std::uint64_t seq = f.seq;
    int me = rank;
    cuda->host_func(stream, [state = abort, seq, name, me] {
      if (!state->aborted) return;
      if (auto failure = state->rank_failure()) throw_rank_failed(name, seq, me, *failure, __FILE__, __LINE__);
      throw TimeoutError(detail::concat(name, " (collective #", seq, "): ", state->get()), __FILE__, __LINE__);
    });
  }

  // A rank failed (this one, or a peer the channel reported): abort NCCL so every kernel
  // waiting for that rank returns.
  void on_failure(const RankFailure& f) {
    std::string reason = f.rank == rank ? detail::concat("this rank aborted the communicator: ", f.cause)
                                        : detail::concat("rank ", f.rank, " failed: ", f.cause);
    abort_comm(reason, f);
  }

  // The error side channel of ranks as processes (last member: destroyed first, it calls
  // on_failure from its thread).
  std::unique_ptr<StoreAbortChannel> channel;

  void* scratch(std::size_t bytes, cudaStream_t s) {
    void* p = nullptr;
    ZOE_CUDA(cudaMallocAsync(&p, bytes ? bytes : 1, s), "cudaMallocAsync of collective scratch");
    return p;
  }

  // Grouped point-to-point exchange: send[p] to p and recv[p] from p for every peer p.
  void exchange(const std::vector<std::pair<const void*, std::size_t>>& sends,
                const std::vector<std::pair<void*, std::size_t>>& recvs, cudaStream_t s) {
    ZOE_NCCL(nccl().GroupStart(), "ncclGroupStart");
    for (int p = 0; p < world; ++p) {
      if (p == rank) continue;
      if (sends[p].second) ZOE_NCCL(nccl().Send(sends[p].first, sends[p].second, ncclUint8, p, comm, s), "ncclSend");
      if (recvs[p].second) ZOE_NCCL(nccl().Recv(recvs[p].first, recvs[p].second, ncclUint8, p, comm, s), "ncclRecv");
    }
    ZOE_NCCL(nccl().GroupEnd(), "ncclGroupEnd");
  }
};

NcclCommunicator::NcclCommunicator(std::shared_ptr<Device> device, std::shared_ptr<KeyValueStore> store, int rank,
                                   int world, std::chrono::milliseconds timeout)
    : device_(std::move(device)), rank_(rank), world_(world), impl_(std::make_unique<Impl>()) {
  auto* cuda = dynamic_cast<CudaDevice*>(device_.get());
  ZOE_CHECK_USAGE(cuda != nullptr, "NcclCommunicator needs a CUDA device, got ",
                  device_ ? device_->name() : std::string("null"));
  ZOE_CHECK_USAGE(world >= 1 && rank >= 0 && rank < world, "NcclCommunicator: rank ", rank,
                  " is not in [0, world size ", world, ")");
  impl_->cuda = cuda;
  impl_->rank = rank;
  impl_->world = world;
  impl_->timeout = timeout;
  impl_->store = std::move(store);
  const NcclApi& api = nccl();
  ncclUniqueId id;
  if (world > 1) {
    ZOE_CHECK_USAGE(impl_->store != nullptr, "NcclCommunicator: null store for world size ", world);
    wait_for_all_ranks(*impl_->store, "zoe/nccl", rank, world, timeout);
    if (rank == 0) {
      ZOE_NCCL(api.GetUniqueId(&id), "ncclGetUniqueId");
      impl_->store->set("zoe/nccl/unique_id", std::vector<char>(id.internal, id.internal + sizeof id.internal));
    } else {
      auto bytes = impl_->store->get("zoe/nccl/unique_id", timeout, "NCCL rendezvous");
      ZOE_CHECK(bytes.size() == sizeof id.internal, "NCCL unique id of ", bytes.size(), " bytes");
      std::memcpy(id.internal, bytes.data(), sizeof id.internal);
    }
  } else {
    ZOE_NCCL(api.GetUniqueId(&id), "ncclGetUniqueId");
  }
  cuda->make_current();
  ZOE_NCCL(api.CommInitRank(&impl_->comm, world, id, rank), "ncclCommInitRank");
  ZOE_CUDA(cudaMalloc(&impl_->barrier_flag, sizeof(int)), "cudaMalloc of the barrier flag");
  ZOE_CUDA(cudaMemset(impl_->barrier_flag, 0, sizeof(int)), "cudaMemset of the barrier flag");
  impl_->watchdog = std::thread([this] { impl_->watch(); });
  if (world > 1) {
    Impl* impl = impl_.get();
    impl_->channel = std::make_unique<StoreAbortChannel>(impl_->store, "zoe/nccl", rank, world,
                                                         [impl](const RankFailure& f) { impl->on_failure(f); });
  }
}

void NcclCommunicator::abort(const std::string& cause) noexcept {
  try {
    if (!impl_->channel) {
      impl_->on_failure(RankFailure{rank_, cut_cause(cause)});
      return;
    }
    if (auto earlier = impl_->channel->known()) {
      impl_->on_failure(*earlier);
      return;
    }
    impl_->on_failure(RankFailure{rank_, cut_cause(cause)});  // this rank's kernels return first
    impl_->channel->post(cause);
  } catch (...) {
  }
}

NcclCommunicator::~NcclCommunicator() {
  impl_->channel.reset();  // no abort from its thread from here on
  // Let the watchdog see every collective finish (or abort the stuck ones) before stopping it.
  std::unique_lock lock(impl_->mutex);
  while (!impl_->in_flight.empty()) {
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    lock.lock();
  }
  impl_->stopping = true;
  lock.unlock();
  impl_->cv.notify_all();
  impl_->watchdog.join();
  impl_->cuda->make_current();
  cudaFree(impl_->barrier_flag);
  if (impl_->abort->aborted) return;  // ncclCommAbort already freed the communicator
  nccl().CommDestroy(impl_->comm);
}

void NcclCommunicator::all_gather(const void* send, void* recv, std::size_t count, DType dtype, Stream& stream) {
  std::size_t bytes = count * dtype_size(dtype);
  count_all_gather(bytes * world_);
  impl_->collective("all_gather", stream, [&](cudaStream_t s) {
    if (bytes) ZOE_NCCL(nccl().AllGather(send, recv, bytes, ncclUint8, impl_->comm, s), "ncclAllGather");
  });
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                      Stream& stream) {
  std::size_t bytes = count * dtype_size(dtype);
  count_reduce_scatter(bytes * world_);
  impl_->collective("reduce_scatter", stream, [&](cudaStream_t s) {
    if (!count) return;
    auto* in = static_cast<const char*>(send);
    auto* tmp = static_cast<char*>(impl_->scratch(bytes * world_, s));
    std::vector<std::pair<const void*, std::size_t>> sends(world_);
    std::vector<std::pair<void*, std::size_t>> recvs(world_);
    for (int p = 0; p < world_; ++p) {
      sends[p] = {in + p * bytes, bytes};
      recvs[p] = {tmp + p * bytes, bytes};
    }
    impl_->exchange(sends, recvs, s);
    ZOE_CUDA(cudaMemcpyAsync(tmp + rank_ * bytes, in + rank_ * bytes, bytes, cudaMemcpyDeviceToDevice, s),
             "cudaMemcpyAsync of the own slice");
    ZOE_CUDA(static_cast<cudaError_t>(
                 kernels::cuda::reduce_ranks(tmp, dtype, world_, count, recv, op == ReduceOp::avg, s)),
             "reduce_ranks kernel");
    ZOE_CUDA(cudaFreeAsync(tmp, s), "cudaFreeAsync");
  });
}

void NcclCommunicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                  Stream& stream) {
  std::size_t es = dtype_size(dtype);
  count_all_reduce(count * es);
  impl_->collective("all_reduce", stream, [&](cudaStream_t s) {
    if (!count) return;
    auto* in = static_cast<const char*>(send);
    auto* out = static_cast<char*>(recv);
    std::size_t mine = part_size(count, world_, rank_), my_begin = part_begin(count, world_, rank_);
    auto* tmp = static_cast<char*>(impl_->scratch(mine * es * world_, s));
    std::vector<std::pair<const void*, std::size_t>> sends(world_);
    std::vector<std::pair<void*, std::size_t>> recvs(world_);
    for (int p = 0; p < world_; ++p) {
      sends[p] = {in + part_begin(count, world_, p) * es, part_size(count, world_, p) * es};
      recvs[p] = {tmp + p * mine * es, mine * es};
    }
    impl_->exchange(sends, recvs, s);
    ZOE_CUDA(cudaMemcpyAsync(tmp + rank_ * mine * es, in + my_begin * es, mine * es, cudaMemcpyDeviceToDevice, s),
             "cudaMemcpyAsync of the own part");
    ZOE_CUDA(static_cast<cudaError_t>(kernels::cuda::reduce_ranks(tmp, dtype, world_, mine, out + my_begin * es,
                                                                   op == ReduceOp::avg, s)),
             "reduce_ranks kernel");
    for (int p = 0; p < world_; ++p) {
      sends[p] = {out + my_begin * es, mine * es};
      recvs[p] = {out + part_begin(count, world_, p) * es, part_size(count, world_, p) * es};
    }
    impl_->exchange(sends, recvs, s);
    ZOE_CUDA(cudaFreeAsync(tmp, s), "cudaFreeAsync");
  });
}

void NcclCommunicator::all_reduce_f64(double* data, std::size_t count, Stream& stream) {
  count_all_reduce(count * sizeof(double));
  impl_->collective("all_reduce_f64", stream, [&](cudaStream_t s) {
    if (!count || world_ == 1) return;
    auto* all = static_cast<double*>(impl_->scratch(count * sizeof(double) * world_, s));
    ZOE_NCCL(nccl().AllGather(data, all, count, ncclFloat64, impl_->comm, s), "ncclAllGather");
    ZOE_CUDA(static_cast<cudaError_t>(kernels::cuda::reduce_ranks_f64(all, world_, count, data, s)),
             "reduce_ranks_f64 kernel");
    ZOE_CUDA(cudaFreeAsync(all, s), "cudaFreeAsync");
  });
}

void NcclCommunicator::broadcast(void* buf, std::size_t count, DType dtype, int root, Stream& stream) {
  ZOE_CHECK_USAGE(root >= 0 && root < world_, "broadcast: root ", root, " is not in [0, world size ", world_, ")");
  std::size_t bytes = count * dtype_size(dtype);
  count_broadcast(bytes);
  impl_->collective("broadcast", stream, [&](cudaStream_t s) {
    if (bytes) ZOE_NCCL(nccl().Broadcast(buf, buf, bytes, ncclUint8, root, impl_->comm, s), "ncclBroadcast");
  });
}

void NcclCommunicator::barrier(Stream& stream) {
  impl_->collective("barrier", stream, [&](cudaStream_t s) {
    ZOE_NCCL(nccl().AllReduce(impl_->barrier_flag, impl_->barrier_flag, 1, ncclInt32, ncclSum, impl_->comm, s),
             "ncclAllReduce (barrier)");
  });
}

}  // namespace zoe
