// CpuAdam: argument checks, ISA dispatch and the oneTBB loops over fixed chunks.
#include "src/optim/cpu_adam.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstdint>
#include <vector>

#include "src/common/check.hpp"
#include "src/optim/adam_kernels.hpp"
#include "src/optim/isa_detect.hpp"

namespace zoe::optim {
namespace {

static_assert(CpuAdam::kChunk % 64 == 0, "chunks must keep 64-byte alignment of fp32 arrays");
static_assert(CpuAdam::kChunk % CpuAdam::kSumLanes == 0);
static_assert(CpuAdam::kSumLanes == detail::kSumLanes);

// Non-temporal stores only pay when the update's arrays do not fit in the last-level cache: then
// every written line goes to memory anyway, and streaming it keeps the cache for the inputs. A
// working set that fits stays cached with ordinary stores (an in-place update reads each line
// first, so ordinary stores cost no extra read-for-ownership traffic).
// Env ZOE_ADAM_STREAM_BYTES overrides the threshold (tests use 0 to cover the streaming path).
std::size_t stream_threshold_bytes() {
  if (const char* env = std::getenv("ZOE_ADAM_STREAM_BYTES"); env && *env) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(env, &end, 10);
    if (*end != '\0') ZOE_THROW_CONFIG("ZOE_ADAM_STREAM_BYTES", "'", env, "' is not a byte count");
    return static_cast<std::size_t>(v);
  }
  // The reported L3 is often the sum over all core complexes (a VM here reports 508 MiB) while one
  // core reaches only its own slice (32-96 MiB on current x86 server parts): clamp it.
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::clamp<std::size_t>(l3 > 0 ? static_cast<std::size_t>(l3) : 0, std::size_t{32} << 20,
                                 std::size_t{128} << 20);
}

const detail::KernelTable& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::avx512: return detail::avx512_kernels();
    case Isa::avx2: return detail::avx2_kernels();
    case Isa::scalar: break;
  }
  return detail::scalar_kernels();
}

bool aligned(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

}  // namespace

struct CpuAdam::Impl {
  Impl(int threads, Isa isa_)
      : arena(threads == 0 ? tbb::task_arena::automatic : threads),
        isa(isa_),
        kernels(kernels_for(isa_)),
        bf16_convert(isa_ == Isa::avx512 && cpu_has_avx512_bf16_convert()),
        stream_min_bytes(stream_threshold_bytes()) {}

  // Runs body(chunk, begin, end) over the kChunk chunks of [0, n): inline for one chunk or one
  // thread, else in the arena.
  template <class Body>
  void for_chunks(std::size_t n, const Body& body) {
    const std::size_t chunks = (n + kChunk - 1) / kChunk;
    auto run = [&](std::size_t c) { body(c, c * kChunk, c + 1 == chunks ? n : (c + 1) * kChunk); };
    if (chunks <= 1 || arena.max_concurrency() == 1) {
      for (std::size_t c = 0; c < chunks; ++c) run(c);
      return;
    }
    arena.execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, chunks, 1), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t c = r.begin(); c != r.end(); ++c) run(c);
      });
    });
  }

  tbb::task_arena arena;
  Isa isa;
  const detail::KernelTable& kernels;
  bool bf16_convert;
  std::size_t stream_min_bytes;
};

namespace {
Isa checked_isa(Isa isa) {
  ZOE_CHECK_USAGE(isa_supported(isa), "CpuAdam: ISA ", isa_name(isa), " is not supported by this CPU");
  return isa;
}
int checked_threads(int threads) {
  ZOE_CHECK_USAGE(threads >= 0, "CpuAdam: threads must be >= 0 (0 = all), got ", threads);
  return threads;
}
}  // namespace

CpuAdam::CpuAdam(int threads) : impl_(std::make_unique<Impl>(checked_threads(threads), active_isa())) {}
CpuAdam::CpuAdam(int threads, Isa isa) : impl_(std::make_unique<Impl>(checked_threads(threads), checked_isa(isa))) {}
CpuAdam::~CpuAdam() = default;
Isa CpuAdam::isa() const { return impl_->isa; }
int CpuAdam::threads() const { return impl_->arena.max_concurrency(); }

void CpuAdam::step(const AdamHyper& hyper, std::int64_t step, float grad_scale, float* master, float* exp_avg,
                   float* exp_avg_sq, const void* grad, DType grad_dtype, std::size_t n, void* out_half,
                   DType out_dtype) {
  ZOE_CHECK_USAGE(step >= 1, "CpuAdam::step: step must be >= 1 (1-based), got ", step);
  ZOE_CHECK_USAGE(out_half == nullptr || out_dtype != DType::f32,
                  "CpuAdam::step: out_dtype must be bf16 or fp16, got ", dtype_name(out_dtype));
  if (n == 0) return;
  ZOE_CHECK_USAGE(master && exp_avg && exp_avg_sq && grad,
                  "CpuAdam::step: null array (master, exp_avg, exp_avg_sq or grad) for n = ", n);
  detail::AdamArgs a{};
  a.c = kernels::adam_coeffs(hyper.lr, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay, hyper.decoupled,
                             step, grad_scale, hyper.bias_correction);
  a.p = master;
  a.m = exp_avg;
  a.v = exp_avg_sq;
  a.grad = grad;
  a.grad_dtype = grad_dtype;
  a.out = out_half;
  a.out_dtype = out_dtype;
  const std::size_t bytes = n * (3 * 4 * 2 + dtype_size(grad_dtype) + (out_half ? 2 : 0));
  a.stream = bytes > impl_->stream_min_bytes && aligned(master, 64) && aligned(exp_avg, 64) && aligned(exp_avg_sq, 64) &&
             (!out_half || aligned(out_half, 32));
  a.bf16_convert = impl_->bf16_convert;
  const auto adam = impl_->kernels.adam;
  impl_->for_chunks(n, [&](std::size_t, std::size_t begin, std::size_t end) { adam(a, begin, end); });
}

double CpuAdam::sum_squares(const void* x, DType dtype, std::size_t n) {
  if (n == 0) return 0.0;
  ZOE_CHECK_USAGE(x, "CpuAdam::sum_squares: null array for n = ", n);
  std::vector<double> partials((n + kChunk - 1) / kChunk);
  const auto sum = impl_->kernels.sum_squares;
  impl_->for_chunks(n, [&](std::size_t c, std::size_t begin, std::size_t end) { partials[c] = sum(x, dtype, begin, end); });
  double total = 0.0;
  for (double p : partials) total += p;  // chunk order: independent of which thread made which partial
  return total;
}

bool CpuAdam::all_finite(const void* x, DType dtype, std::size_t n) {
  if (n == 0) return true;
  ZOE_CHECK_USAGE(x, "CpuAdam::all_finite: null array for n = ", n);
  std::atomic<bool> bad{false};
  const auto finite = impl_->kernels.all_finite;
  impl_->for_chunks(n, [&](std::size_t, std::size_t begin, std::size_t end) {
    if (!bad.load(std::memory_order_relaxed) && !finite(x, dtype, begin, end)) bad.store(true, std::memory_order_relaxed);
  });
  return !bad.load();
}

}  // namespace zoe::optim
