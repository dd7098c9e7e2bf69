#include "io/engine.hpp"

#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <thread>

#include "src/common/check.hpp"
#include "src/common/log.hpp"

namespace zoe::io {

namespace {
constexpr std::uint64_t kAlign = 4096;
constexpr std::uint64_t kWakeTag = ~std::uint64_t{0};
constexpr unsigned kFileSlots = 64;
bool aligned(std::uint64_t v) { return v % kAlign == 0; }
}  // namespace

struct Engine::Counters {
  std::atomic<std::uint64_t> requests{0}, bytes{0}, resubmitted{0}, fixed_requests{0}, submit_calls{0},
      overlapped_requests{0};
};

namespace detail {
// One transfer. Fields below `done` are touched only by the ring thread that owns it.
struct Job {
  Op op;
  FileRef file;
  std::string path;  // copy, so errors name the file even after it is unregistered
  std::vector<Segment> segments;
  std::shared_ptr<void> keep_alive;
  std::exception_ptr error;  // written before `done`, read after it
  std::atomic<std::uint32_t> done{0};

  std::size_t total = 0;      // requests the whole transfer needs
  std::size_t issued = 0;     // requests handed to the kernel (not counting resubmissions)
  std::size_t completed = 0;  // issued requests that finished (successfully or not)
  std::size_t seg = 0;        // cursor: next segment and byte within it
  std::size_t seg_pos = 0;

  void finish() noexcept {
    keep_alive.reset();  // breaks the cycle when the keep-alive holds this job's handle
    done.store(1, std::memory_order_release);
    done.notify_all();
  }
};
}  // namespace detail

using detail::Job;

bool Handle::ready() const noexcept { return !job_ || job_->done.load(std::memory_order_acquire) != 0; }

std::exception_ptr Handle::wait_nothrow() const noexcept {
  if (!job_) return nullptr;
  while (job_->done.load(std::memory_order_acquire) == 0) job_->done.wait(0, std::memory_order_acquire);
  return job_->error;
}

void Handle::wait() const {
  if (auto error = wait_nothrow()) std::rethrow_exception(error);
}

// One io_uring and the thread that alone submits to and reaps from it.
class Engine::Ring {
 public:
  Ring(const EngineOptions& options, Counters& counters) : options_(options), counters_(counters) {
    // One entry per request in flight plus the armed eventfd read; io_uring allows 32768
    // entries at most, so a depth of 32768 keeps 32767 requests in flight.
    unsigned entries = std::min(options.queue_depth + 1, 32768u);
    if (int rc = io_uring_queue_init(entries, &ring_, 0); rc < 0)
      ZOE_THROW_ERRNO(-rc, "io_uring_queue_init(", entries, " entries) failed");
    event_fd_ = ::eventfd(0, EFD_CLOEXEC);
    if (event_fd_ < 0) {
      int err = errno;
      io_uring_queue_exit(&ring_);
      ZOE_THROW_ERRNO(err, "eventfd() failed");
    }
    slots_.resize(entries - 1);
    for (unsigned i = entries - 1; i-- > 0;) free_.push_back(i);
  }

  ~Ring() {
    if (thread_.joinable()) {
      stop();
      thread_.join();
    }
    io_uring_queue_exit(&ring_);
    ::close(event_fd_);
  }

  // Returns 0 or -errno.
  int register_buffers(std::span<const std::span<std::byte>> buffers) {
    std::vector<iovec> iov;
    for (auto b : buffers) iov.push_back({b.data(), b.size()});
    int rc = io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size()));
    if (rc == 0) {
      for (std::size_t i = 0; i < buffers.size(); ++i)
        fixed_.push_back({reinterpret_cast<std::uintptr_t>(buffers[i].data()), buffers[i].size(), static_cast<int>(i)});
      std::sort(fixed_.begin(), fixed_.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
    }
    return rc;
  }
  void unregister_buffers() {
    if (!fixed_.empty()) io_uring_unregister_buffers(&ring_);
    fixed_.clear();
  }
  int register_file_table() { return io_uring_register_files_sparse(&ring_, kFileSlots); }
  int update_file(int slot, int fd) {
    int rc = io_uring_register_files_update(&ring_, static_cast<unsigned>(slot), &fd, 1);
    return rc < 0 ? rc : 0;
  }

  void start() { thread_ = std::thread([this] { run(); }); }

  void enqueue(std::shared_ptr<Job> job) {
    {
      std::lock_guard lock(mutex_);
      inbox_.push_back(std::move(job));
    }
    wake();
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake();
  }

 private:
  struct FixedBuffer {
    std::uintptr_t begin;
    std::size_t bytes;
    int index;
  };
  // One request in flight. `job` keeps the transfer alive while the kernel uses its buffer.
  struct Slot {
    std::shared_ptr<Job> job;
    char* buffer = nullptr;
    std::uint64_t offset = 0;
    std::size_t bytes = 0;
  };

  void wake() {
    std::uint64_t one = 1;
    while (::write(event_fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }

  io_uring_sqe* get_sqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (!sqe) {  // cannot happen with entries >= queue_depth + 1, kept for safety
      submitted(io_uring_submit(&ring_));
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }

  // Bookkeeping after a submission of everything prepared (rc: io_uring_submit's result).
  void submitted(int rc) {
    if (rc < 0 || unsubmitted_ == 0) return;
    counters_.submit_calls.fetch_add(1, std::memory_order_relaxed);
    in_kernel_ += unsubmitted_;
    unsubmitted_ = 0;
  }

  void arm_wake() {
    io_uring_sqe* sqe = get_sqe();
    io_uring_prep_read(sqe, event_fd_, &wake_value_, sizeof wake_value_, 0);
    io_uring_sqe_set_data64(sqe, kWakeTag);
  }

  int fixed_index(const char* p, std::size_t bytes) const {
    auto addr = reinterpret_cast<std::uintptr_t>(p);
    auto it = std::upper_bound(fixed_.begin(), fixed_.end(), addr,
                               [](std::uintptr_t a, const FixedBuffer& b) { return a < b.begin; });
    if (it == fixed_.begin()) return -1;
    --it;
    return addr + bytes <= it->begin + it->bytes ? it->index : -1;
  }

  void prep(unsigned slot_index) {
    Slot& s = slots_[slot_index];
    const Job& job = *s.job;
    io_uring_sqe* sqe = get_sqe();
    int fd = job.file.slot >= 0 ? job.file.slot : job.file.fd;
    int buf_index = fixed_index(s.buffer, s.bytes);
    auto len = static_cast<unsigned>(s.bytes);
    if (job.op == Op::read) {
      if (buf_index >= 0) io_uring_prep_read_fixed(sqe, fd, s.buffer, len, s.offset, buf_index);
      else io_uring_prep_read(sqe, fd, s.buffer, len, s.offset);
    } else {
      if (buf_index >= 0) io_uring_prep_write_fixed(sqe, fd, s.buffer, len, s.offset, buf_index);
      else io_uring_prep_write(sqe, fd, s.buffer, len, s.offset);
    }
    if (job.file.slot >= 0) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, slot_index);
    counters_.requests.fetch_add(1, std::memory_order_relaxed);
    if (buf_index >= 0) counters_.fixed_requests.fetch_add(1, std::memory_order_relaxed);
    ++unsubmitted_;
    if (options_.single_submit) submitted(io_uring_submit(&ring_));  // this request alone
  }

  // Issues requests from queued transfers, in order, while slots are free.
  void fill() {
    const bool overlapping = in_kernel_ > 0;  // refilling while earlier requests are in flight
    while (!free_.empty() && !active_.empty()) {
      std::shared_ptr<Job>& job = active_.front();
      if (job->error || job->issued == job->total) {
        active_.pop_front();
        continue;
      }
      const Segment& seg = job->segments[job->seg];
      unsigned index = free_.back();
      free_.pop_back();
      Slot& s = slots_[index];
      s.job = job;
      s.buffer = static_cast<char*>(seg.buffer) + job->seg_pos;
      s.offset = seg.offset + job->seg_pos;
      s.bytes = std::min<std::size_t>(options_.block_size, seg.bytes - job->seg_pos);
      job->seg_pos += s.bytes;
      if (job->seg_pos == seg.bytes) {
        ++job->seg;
        job->seg_pos = 0;
      }
      ++job->issued;
      if (overlapping) counters_.overlapped_requests.fetch_add(1, std::memory_order_relaxed);
      prep(index);
    }
  }

  void release(unsigned index) {
    Slot& s = slots_[index];
    std::shared_ptr<Job> job = std::move(s.job);
    s.job.reset();
    free_.push_back(index);
    ++job->completed;
    bool closed = job->error || job->issued == job->total;
    if (closed && job->completed == job->issued) job->finish();
  }

  void fail(Job& job, const Slot& s, int error, const char* what) {
    if (!job.error)
      job.error = std::make_exception_ptr(IoError(job.path, static_cast<long long>(s.offset),
                                                  static_cast<long long>(s.bytes), error, what,
                                                  __FILE__, __LINE__));
  }

  void complete(unsigned index, int result) {
    --in_kernel_;
    Slot& s = slots_[index];
    Job& job = *s.job;
    if (options_.fault_injector)
      result = options_.fault_injector(Completion{job.op, &job.path, s.offset, s.bytes, result});
    const char* what = job.op == Op::read ? "read" : "write";
    if (result == -EAGAIN || result == -EINTR) {
      counters_.resubmitted.fetch_add(1, std::memory_order_relaxed);
      prep(index);
      return;
    }
    if (result < 0) {
      fail(job, s, -result, what);
    } else if (result == 0) {
      fail(job, s, EIO, job.op == Op::read ? "read (unexpected end of file)" : "write (no progress)");
    } else if (static_cast<std::size_t>(result) < s.bytes) {
      counters_.bytes.fetch_add(static_cast<std::uint64_t>(result), std::memory_order_relaxed);
      counters_.resubmitted.fetch_add(1, std::memory_order_relaxed);
      s.buffer += result;
      s.offset += static_cast<std::uint64_t>(result);
      s.bytes -= static_cast<std::size_t>(result);
      prep(index);
      return;
    } else {
      counters_.bytes.fetch_add(s.bytes, std::memory_order_relaxed);
    }
    release(index);
  }

  void reap() {
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      std::uint64_t tag = io_uring_cqe_get_data64(cqe);
      if (tag == kWakeTag) {
        arm_wake();
      } else {
        complete(static_cast<unsigned>(tag), cqe->res);
      }
    }
    io_uring_cq_advance(&ring_, seen);
  }

  void run() {
    arm_wake();
    for (;;) {
      bool stopping;
      {
        std::lock_guard lock(mutex_);
        while (!inbox_.empty()) {
          active_.push_back(std::move(inbox_.front()));
          inbox_.pop_front();
        }
        stopping = stopping_;
      }
      // overlap_events false: a new batch only once the last one has completed.
      if (options_.overlap_events || free_.size() == slots_.size()) fill();
      if (stopping && active_.empty() && free_.size() == slots_.size()) break;
      int rc = io_uring_submit_and_wait(&ring_, 1);
      submitted(rc);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        // The ring itself failed: nothing more can be submitted. Fail every queued transfer
        // (requests already in the kernel still complete and are reaped below).
        ZOE_LOG_ERROR("io_uring_submit_and_wait failed: errno {}", -rc);
        for (auto& job : active_) {
          if (!job->error)
            job->error = std::make_exception_ptr(SystemError("io_uring submission failed", -rc, __FILE__, __LINE__));
          if (job->completed == job->issued) job->finish();
        }
        active_.clear();
      }
      reap();
    }
  }

  const EngineOptions& options_;
  Counters& counters_;
  io_uring ring_{};
  int event_fd_ = -1;
  std::uint64_t wake_value_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::deque<std::shared_ptr<Job>> inbox_;  // guarded by mutex_
  bool stopping_ = false;                   // guarded by mutex_
  // Ring-thread state.
  std::deque<std::shared_ptr<Job>> active_;
  std::vector<Slot> slots_;
  std::vector<unsigned> free_;
  std::vector<FixedBuffer> fixed_;
  unsigned unsubmitted_ = 0;  // requests prepared, not yet submitted
  unsigned in_kernel_ = 0;    // requests submitted, not yet reaped
};

Engine::Engine(const EngineOptions& options, std::vector<std::span<std::byte>> fixed_buffers)
    : options_(options), counters_(std::make_unique<Counters>()) {
  ZOE_CHECK_USAGE(options.block_size > 0 && aligned(options.block_size) && options.block_size <= (1u << 30),
                  "aio.block_size must be a positive multiple of 4096 up to 1 GiB, got ", options.block_size);
  ZOE_CHECK_USAGE(options.queue_depth >= 1 && options.queue_depth <= 32768,
                  "aio.queue_depth must be 1..32768, got ", options.queue_depth);
  ZOE_CHECK_USAGE(options.threads >= 1 && options.threads <= 64,
                  "aio.intra_op_parallelism must be 1..64, got ", options.threads);
  for (unsigned i = 0; i < options.threads; ++i) rings_.push_back(std::make_unique<Ring>(options_, *counters_));

  if (options.fixed_buffers && !fixed_buffers.empty()) {
    int rc = 0;
    std::size_t done = 0;
    for (; done < rings_.size() && rc == 0; ++done) rc = rings_[done]->register_buffers(fixed_buffers);
    if (rc == 0) {
      fixed_buffers_active_ = true;
    } else {
      for (std::size_t i = 0; i + 1 < done; ++i) rings_[i]->unregister_buffers();
      ZOE_LOG_INFO("io_uring refused to register {} buffers (errno {}: {}); using plain buffers",
                   fixed_buffers.size(), -rc, -rc == ENOMEM ? "memlock limit" : "see io_uring_register(2)");
    }
  }
  if (options.fixed_files) {
    int rc = 0;
    for (auto& ring : rings_)
      if (rc == 0) rc = ring->register_file_table();
    fixed_files_active_ = rc == 0;
    if (rc != 0) ZOE_LOG_INFO("io_uring refused a fixed-file table (errno {}); using plain descriptors", -rc);
    slot_used_.assign(kFileSlots, false);
  }
  for (auto& ring : rings_) ring->start();
}

Engine::~Engine() {
  for (auto& ring : rings_) ring->stop();
  rings_.clear();  // joins each thread once its queued transfers are done
}

FileRef Engine::register_file(const DirectFile& file) {
  FileRef ref{file.fd(), &file.path(), file.direct(), -1};
  if (!fixed_files_active_) return ref;
  std::lock_guard lock(slot_mutex_);
  auto it = std::find(slot_used_.begin(), slot_used_.end(), false);
  if (it == slot_used_.end()) return ref;  // table full: plain descriptor
  int slot = static_cast<int>(it - slot_used_.begin());
  int rc = 0;
  std::size_t done = 0;
  for (; done < rings_.size() && rc == 0; ++done) rc = rings_[done]->update_file(slot, file.fd());
  if (rc != 0) {
    for (std::size_t i = 0; i + 1 < done; ++i) rings_[i]->update_file(slot, -1);
    ZOE_LOG_INFO("io_uring refused to register '{}' as a fixed file (errno {}); using its descriptor",
                 file.path(), -rc);
    return ref;
  }
  *it = true;
  ref.slot = slot;
  return ref;
}

void Engine::unregister_file(const FileRef& ref) noexcept {
  if (ref.slot < 0) return;
  std::lock_guard lock(slot_mutex_);
  for (auto& ring : rings_) ring->update_file(ref.slot, -1);
  slot_used_[static_cast<std::size_t>(ref.slot)] = false;
}

Handle Engine::submit(Op op, const FileRef& file, std::span<const Segment> segments,
                      std::shared_ptr<void> keep_alive) {
  auto job = std::make_shared<Job>();
  job->op = op;
  job->file = file;
  job->path = file.path ? *file.path : std::string("fd ") + std::to_string(file.fd);
  for (const Segment& s : segments) {
    if (s.bytes == 0) continue;
    if (file.direct)
      ZOE_CHECK_USAGE(aligned(reinterpret_cast<std::uintptr_t>(s.buffer)) && aligned(s.offset) && aligned(s.bytes),
                      "direct I/O on '", job->path, "' needs 4096-aligned buffer, offset and length; got buffer ",
                      s.buffer, ", offset ", s.offset, ", length ", s.bytes);
    job->segments.push_back(s);
    job->total += (s.bytes + options_.block_size - 1) / options_.block_size;
  }
  if (job->total == 0) {
    job->finish();
    return Handle(job);
  }
  job->keep_alive = std::move(keep_alive);
  Handle handle(job);
  unsigned ring = next_ring_.fetch_add(1, std::memory_order_relaxed) % rings_.size();
  rings_[ring]->enqueue(std::move(job));
  return handle;
}

EngineStats Engine::stats() const noexcept {
  return {counters_->requests.load(std::memory_order_relaxed), counters_->bytes.load(std::memory_order_relaxed),
          counters_->resubmitted.load(std::memory_order_relaxed),
          counters_->fixed_requests.load(std::memory_order_relaxed),
          counters_->submit_calls.load(std::memory_order_relaxed),
          counters_->overlapped_requests.load(std::memory_order_relaxed)};
}

}  // namespace zoe::io
