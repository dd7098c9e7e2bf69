#include "src/common/quote.hpp"
#include "src/offload/nvme_store.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "io/crc32c.hpp"
#include "src/common/aligned_buffer.hpp"
#include "src/common/check.hpp"
#include "src/common/log.hpp"
#include "src/offload/swap_file_owner.hpp"

namespace zoe::offload {
namespace {

constexpr std::uint64_t kBlock = 4096;
constexpr std::uint64_t kMagic = 0x3150415753454F5AULL;  // "ZOESWAP1", little-endian

// Last 32 bytes of every extent.
struct Trailer {
  std::uint64_t magic;
  std::uint64_t bytes;     // logical tensor size
  std::uint32_t data_crc;  // CRC32C of the `bytes` data bytes
  std::uint32_t name_crc;  // CRC32C of the tensor's name (catches a swapped extent)
  std::uint64_t reserved;
};
static_assert(sizeof(Trailer) == 32);

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
std::uint64_t round_down(std::uint64_t v, std::uint64_t a) { return v / a * a; }
bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kBlock == 0; }
std::uint32_t name_crc(const std::string& name) { return io::crc32c(name.data(), name.size()); }

std::atomic<unsigned> g_store_serial{0};

}  // namespace

struct SwapHandle::State {
  io::Handle io;
  AlignedBuffer bounce;  // the extent's last block(s): data tail, padding, trailer
  // swap_in only: where the tail goes and what to check.
  bool is_read = false;
  std::byte* dst = nullptr;
  std::size_t bytes = 0;
  std::size_t body = 0;  // bytes moved directly (4096-multiple prefix of the data)
  std::string name, path;
  std::uint64_t offset = 0;

  std::mutex mutex;
  bool finished = false;  // guarded by mutex
  std::exception_ptr error;

  void verify() {
    std::size_t tail = bytes - body;
    std::memcpy(dst + body, bounce.data(), tail);
    Trailer t;
    std::memcpy(&t, static_cast<std::byte*>(bounce.data()) + bounce.size() - sizeof t, sizeof t);
    if (t.magic != kMagic || t.bytes != bytes || t.name_crc != name_crc(name))
      ZOE_THROW(CorruptionError, "NVMe store ", detail::quoted_path(path), ": tensor '", name, "' (extent at offset ", offset,
                ", ", bytes, " bytes) has a damaged trailer (magic ", t.magic == kMagic ? "ok" : "wrong",
                ", recorded size ", t.bytes, ")");
    std::uint32_t crc = io::crc32c(dst, bytes);
    if (crc != t.data_crc)
      ZOE_THROW(CorruptionError, "NVMe store ", detail::quoted_path(path), ": tensor '", name, "' (extent at offset ", offset,
                ", ", bytes, " bytes) failed its CRC32C check: stored 0x", std::hex, t.data_crc,
                ", read back 0x", crc);
  }
};

NvmeStoreOptions NvmeStoreOptions::from_config(const Config& config, const std::string& nvme_path, int rank) {
  return from_aio(config.aio, config.zoe.require_direct_io, nvme_path, rank);
}

NvmeStoreOptions NvmeStoreOptions::from_aio(const AioConfig& aio, bool require_direct_io,
                                            const std::string& nvme_path, int rank) {
  NvmeStoreOptions o;
  o.dir = nvme_path;
  o.rank = rank;
  if (aio.block_size <= 0 || aio.block_size % 4096 != 0 || aio.block_size > (1 << 30))
    ZOE_THROW_CONFIG("aio.block_size", "must be a positive multiple of 4096 up to 1 GiB, got ", aio.block_size);
  if (aio.queue_depth < 1 || aio.queue_depth > 32768)
    ZOE_THROW_CONFIG("aio.queue_depth", "must be 1..32768, got ", aio.queue_depth);
  if (aio.intra_op_parallelism < 1 || aio.intra_op_parallelism > 64)
    ZOE_THROW_CONFIG("aio.intra_op_parallelism", "must be 1..64, got ", aio.intra_op_parallelism);
  o.aio.block_size = static_cast<std::size_t>(aio.block_size);
  o.aio.queue_depth = static_cast<unsigned>(aio.queue_depth);
  o.aio.threads = static_cast<unsigned>(aio.intra_op_parallelism);
  o.aio.single_submit = aio.single_submit;
  o.aio.overlap_events = aio.overlap_events;
  o.require_direct_io = require_direct_io;
  return o;
}

bool SwapHandle::ready() const noexcept { return !state_ || state_->io.ready(); }

void SwapHandle::wait() const {
  if (!state_) return;
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (!s.finished) {
    s.error = s.io.wait_nothrow();
    if (!s.error && s.is_read) {
      try {
        s.verify();
      } catch (...) {
        s.error = std::current_exception();
      }
    }
    s.finished = true;
  }
  if (s.error) std::rethrow_exception(s.error);
}

NvmeStore::NvmeStore(const NvmeStoreOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) ZOE_THROW_ERRNO(ec.value(), "cannot create the NVMe directory ", detail::quoted_path(options.dir));
  io::FileOptions fo;
  fo.require_direct = options.require_direct_io;
  fo.remove_on_close = true;
  fo.simulate_direct_refusal = options.simulate_direct_refusal;
  remove_stale_swap_files(options.dir);
  for (int attempt = 0;; ++attempt) {
    std::string path = options.dir + "/" + swap_file_name(options.rank, ::getpid(), g_store_serial.fetch_add(1));
    try {
      file_ = io::DirectFile::create(path, kSwapHeaderBytes, fo);
      break;
    } catch (const SystemError& e) {
      if (e.error_code() != EEXIST || attempt >= 1000) throw;  // a leftover of an earlier run: skip it
    }
  }
  // The header block names this process, so a later start can tell the file is a dead one's.
  AlignedBuffer header(kSwapHeaderBytes);
  encode_swap_header(SwapFileOwner::self(options.rank), header.data());
  ssize_t written;
  do {
    written = ::pwrite(file_.fd(), header.data(), kSwapHeaderBytes, 0);
  } while (written < 0 && errno == EINTR);
  if (written != static_cast<ssize_t>(kSwapHeaderBytes))
    throw IoError(file_.path(), 0, kSwapHeaderBytes, written < 0 ? errno : EIO, "swap file header write",
                  __FILE__, __LINE__);
  end_ = kSwapHeaderBytes;
  engine_ = std::make_unique<io::Engine>(options.aio, options.fixed_buffers);
  ref_ = engine_->register_file(file_);
  ZOE_LOG_DEBUG("NVMe store '{}' ({} I/O, fixed buffers {}, fixed files {})", file_.path(),
                file_.direct() ? "direct" : "buffered", engine_->fixed_buffers_active(),
                engine_->fixed_files_active());
}

NvmeStore::~NvmeStore() {
  {
    std::lock_guard lock(mutex_);
    for (auto& [name, t] : tensors_) t.last.wait_nothrow();  // each op waited for its predecessor
  }
  engine_->unregister_file(ref_);
  engine_.reset();  // then file_ closes and removes itself
}

void NvmeStore::register_tensor(const std::string& name, std::size_t bytes) {
  ZOE_CHECK_USAGE(bytes >= 1, "NVMe store: tensor '", name, "' has size 0");
  std::lock_guard lock(mutex_);
  ZOE_CHECK_USAGE(!tensors_.contains(name), "NVMe store: tensor '", name, "' is already registered");
  std::uint64_t capacity = round_up(bytes + sizeof(Trailer), kBlock);
  try {
    file_.allocate(end_, capacity);
  } catch (const IoError& e) {
    throw IoError(e.path(), e.offset(), e.length(), e.error_code(),
                  "reserving disk for tensor '" + name + "' (fallocate" +
                      (e.error_code() == ENOSPC ? ", not enough free disk" : "") + ")",
                  __FILE__, __LINE__);
  }
  tensors_.emplace(name, Tensor{Extent{end_, capacity, bytes}, false, {}});
  end_ += capacity;
}

NvmeStore::Tensor& NvmeStore::find(const std::string& name, const char* op) {
  auto it = tensors_.find(name);
  ZOE_CHECK_USAGE(it != tensors_.end(), "NVMe store ", op, ": tensor '", name, "' is not registered");
  return it->second;
}

void NvmeStore::wait_previous(Tensor& t, std::unique_lock<std::mutex>& lock) {
  while (!t.last.ready()) {
    io::Handle previous = t.last;
    lock.unlock();
    previous.wait_nothrow();  // its error belongs to its own handle
    lock.lock();
  }
}

SwapHandle NvmeStore::swap_out(const std::string& name, const void* src, std::size_t bytes) {
  Extent extent;
  {
    std::lock_guard lock(mutex_);
    extent = find(name, "swap_out").extent;
  }
  ZOE_CHECK_USAGE(bytes == extent.bytes, "NVMe store swap_out: tensor '", name, "' is registered with ",
                  extent.bytes, " bytes, got ", bytes);
  ZOE_CHECK_USAGE(aligned(src), "NVMe store swap_out: tensor '", name, "': source ", src, " is not 4096-aligned");

  // CRC and tail block outside the lock: other threads' swaps need not wait for them.
  auto state = std::make_shared<SwapHandle::State>();
  state->body = round_down(bytes, kBlock);
  std::size_t tail_region = extent.capacity - state->body;
  state->bounce = AlignedBuffer(tail_region);
  auto* bounce = static_cast<std::byte*>(state->bounce.data());
  std::size_t tail = bytes - state->body;
  std::memcpy(bounce, static_cast<const std::byte*>(src) + state->body, tail);
  std::memset(bounce + tail, 0, tail_region - tail);
  Trailer trailer{kMagic, bytes, io::crc32c(src, bytes), name_crc(name), 0};
  std::memcpy(bounce + tail_region - sizeof trailer, &trailer, sizeof trailer);
  io::Segment segments[2] = {{const_cast<void*>(src), extent.offset, state->body},
                             {bounce, extent.offset + state->body, tail_region}};

  std::unique_lock lock(mutex_);
  Tensor& t = find(name, "swap_out");
  wait_previous(t, lock);
  state->io = engine_->submit(io::Op::write, ref_, segments, state);
  t.last = state->io;
  t.written = true;
  return SwapHandle(std::move(state));
}

SwapHandle NvmeStore::swap_in(const std::string& name, void* dst, std::size_t bytes) {
  std::unique_lock lock(mutex_);
  Tensor& t = find(name, "swap_in");
  ZOE_CHECK_USAGE(t.written, "NVMe store swap_in: tensor '", name, "' was never swapped out");
  ZOE_CHECK_USAGE(bytes == t.extent.bytes, "NVMe store swap_in: tensor '", name, "' is registered with ",
                  t.extent.bytes, " bytes, got ", bytes);
  ZOE_CHECK_USAGE(aligned(dst), "NVMe store swap_in: tensor '", name, "': destination ", dst,
                  " is not 4096-aligned");
  wait_previous(t, lock);

  auto state = std::make_shared<SwapHandle::State>();
  state->is_read = true;
  state->dst = static_cast<std::byte*>(dst);
  state->bytes = bytes;
  state->body = round_down(bytes, kBlock);
  state->name = name;
  state->path = file_.path();
  state->offset = t.extent.offset;
  state->bounce = AlignedBuffer(t.extent.capacity - state->body);
  io::Segment segments[2] = {{dst, t.extent.offset, state->body},
                             {state->bounce.data(), t.extent.offset + state->body, state->bounce.size()}};
  state->io = engine_->submit(io::Op::read, ref_, segments, state);
  t.last = state->io;
  return SwapHandle(std::move(state));
}

bool NvmeStore::contains(const std::string& name) const {
  std::lock_guard lock(mutex_);
  return tensors_.contains(name);
}

Extent NvmeStore::extent(const std::string& name) const {
  std::lock_guard lock(mutex_);
  auto it = tensors_.find(name);
  ZOE_CHECK_USAGE(it != tensors_.end(), "NVMe store: tensor '", name, "' is not registered");
  return it->second.extent;
}

std::uint64_t NvmeStore::file_bytes() const {
  std::lock_guard lock(mutex_);
  return end_;
}

}  // namespace zoe::offload
