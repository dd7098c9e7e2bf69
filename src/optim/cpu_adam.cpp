// CpuAdam: argument checks, ISA dispatch and the oneTBB loops over fixed chunks.
#include "src/optim/cpu_adam.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <ctime>
#include <cstdlib>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/elementwise.hpp"
#include "src/common/check.hpp"
#include "src/common/sanitizers.hpp"
#include "src/optim/adam_kernels.hpp"
#include "src/optim/isa_detect.hpp"
#include "src/optim/split_master.hpp"
#include "src/optim/store_pick.hpp"

namespace zoe::optim {

std::string stores_name(Stores s) {
  const bool a = s.in_place == StoreKind::nontemporal, b = s.half_out == StoreKind::nontemporal;
  const std::string kinds = a ? (b ? "nontemporal" : "nontemporal-in-place") : (b ? "nontemporal-half" : "ordinary");
  return s.prefetch ? kinds + "+prefetch" : kinds;
}

std::string_view store_policy_name(StorePolicy p) {
  switch (p) {
    case StorePolicy::measure: return "measure";
    case StorePolicy::ordinary: return "ordinary";
    case StorePolicy::nontemporal: return "nontemporal";
    case StorePolicy::nontemporal_half: return "nontemporal-half";
  }
  return "unknown";
}

StorePolicy parse_store_policy(std::string_view text, const char* key) {
  for (StorePolicy p : {StorePolicy::measure, StorePolicy::ordinary, StorePolicy::nontemporal,
                        StorePolicy::nontemporal_half})
    if (text == store_policy_name(p)) return p;
  ZOE_THROW_CONFIG(key, "'", text, "' is not one of measure, ordinary, nontemporal, nontemporal-half");
}

std::string_view optimizer_state_dtype_name(OptimizerStateDType d) {
  switch (d) {
    case OptimizerStateDType::fp32: return "fp32";
    case OptimizerStateDType::bf16: return "bf16";
  }
  return "unknown";
}

OptimizerStateDType parse_optimizer_state_dtype(std::string_view text, const char* key) {
  for (OptimizerStateDType d : {OptimizerStateDType::fp32, OptimizerStateDType::bf16})
    if (text == optimizer_state_dtype_name(d)) return d;
  ZOE_THROW_CONFIG(key, "'", text, "' is not an optimizer state dtype: expected fp32 or bf16");
}

namespace {

static_assert(CpuAdam::kChunk % 64 == 0, "chunks must keep 64-byte alignment of fp32 and bf16 arrays");
static_assert(CpuAdam::kChunk % kernels::kSumSquaresChunk == 0);

StorePolicy store_policy_from_env() {
  const char* env = std::getenv("ZOE_ADAM_STORES");
  return env && *env ? parse_store_policy(env, "ZOE_ADAM_STORES") : StorePolicy::measure;
}

constexpr Stores kOrdinary{StoreKind::ordinary, StoreKind::ordinary};
constexpr Stores kNontemporal{StoreKind::nontemporal, StoreKind::nontemporal};
constexpr Stores kNontemporalHalf{StoreKind::ordinary, StoreKind::nontemporal};
constexpr Stores with_prefetch(Stores s) { return {s.in_place, s.half_out, true}; }
// StorePolicy::measure's candidates, in tie-break order; add_grad uses the first 2, step
// without a half copy the first 4, with one all 6.
constexpr Stores kCandidates[] = {kOrdinary,
                                  kNontemporal,
                                  with_prefetch(kOrdinary),
                                  with_prefetch(kNontemporal),
                                  kNontemporalHalf,
                                  with_prefetch(kNontemporalHalf)};
constexpr int kMaxCandidates = 6;

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

int size_class(std::size_t bytes) { return bytes == 0 ? 0 : 63 - __builtin_clzll(bytes); }

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

// StorePolicy::measure's state for one size class of one operation.
struct StoreTrials {
  int calls = 0;  // counted calls: 1 warm-up, then the timed trials
  // Seconds per byte of each candidate's trial in each round; 0 = not yet timed.
  double secs[kMaxCandidates][CpuAdam::kStoreTrialRounds] = {};
  int chosen = -1;      // index in kCandidates once decided
  double margin = 0.0;  // the noise margin the pick was made with, once decided
};

// The operations measured apart (their access patterns differ). kStepBf16*: bf16 states.
enum Op { kStep, kStepHalf, kAddGradFirst, kAddGradAccumulate, kStepBf16, kStepBf16Half, kOps };

Op step_op(bool half_out, OptimizerStateDType state_dtype) {
  if (state_dtype == OptimizerStateDType::bf16) return half_out ? kStepBf16Half : kStepBf16;
  return half_out ? kStepHalf : kStep;
}

struct CpuAdam::Impl {
  Impl(int threads, Isa isa_)
      : arena(threads == 0 ? tbb::task_arena::automatic : threads),
        isa(isa_),
        kernels(kernels_for(isa_)),
        bf16_convert(isa_ == Isa::avx512 && cpu_has_avx512_bf16_convert()),
        policy(store_policy_from_env()) {}

  // Candidates: a prefix of kCandidates.
  static int candidate_count(Op op) {
    if (op == kStepHalf || op == kStepBf16Half) return 6;
    return op == kStep || op == kStepBf16 ? 4 : 2;
  }
  // Index in kCandidates of the next call's stores in this class (warm-up / trial / decided).
  static int next_candidate(const StoreTrials& t, Op op) {
    if (t.chosen >= 0) return t.chosen;
    if (t.calls == 0) return 0;  // warm-up
    const int c = candidate_count(op), k = t.calls - 1;
    return (k + k / c) % c;  // round r = k / c starts at candidate r % c
  }
  // `s` for an operation: one without a half copy has nothing to stream there (a measured
  // candidate with a streaming half copy then stands for its other stores only).
  static Stores for_op(Stores s, Op op) {
    if (op != kStepHalf && op != kStepBf16Half) s.half_out = StoreKind::ordinary;
    return s;
  }
  static Stores forced(StorePolicy p, Op op) {
    Stores s = kOrdinary;
    if (p == StorePolicy::nontemporal) s = kNontemporal;
    if (p == StorePolicy::nontemporal_half) s = kNontemporalHalf;
    return for_op(s, op);
  }
  // Runs run(stores) once with the stores the policy gives this call; under measure, times the
  // call if it is a trial. can_stream: the arrays allow every candidate (else ordinary, untimed).
  template <class Run>
  void with_stores(Op op, std::size_t bytes, bool can_stream, const Run& run) {
    if (policy != StorePolicy::measure) return run(forced(policy, op));
    StoreTrials& t = trials[op][size_class(bytes)];
    if (t.chosen >= 0 || !can_stream) return run(t.chosen >= 0 ? for_op(kCandidates[t.chosen], op) : kOrdinary);
    const int c = next_candidate(t, op);
    // One thread runs the call inline: its CPU clock leaves out time the scheduler gave to
    // other processes (a loaded machine then still picks what is faster for this kernel).
    // More threads: the wall clock (the workers' CPU time includes their idle spinning).
    const bool inline_call = arena.max_concurrency() == 1;
    const double t0 = inline_call ? thread_cpu_seconds() : wall_seconds();
    run(for_op(kCandidates[c], op));
    // Never 0 (a call shorter than the clock's tick), which would read as "not yet timed".
    const double s_per_byte =
        std::max(1e-300, ((inline_call ? thread_cpu_seconds() : wall_seconds()) - t0) / static_cast<double>(bytes));
    if (t.calls++ == 0) return;  // the warm-up call: ordinary stores, not a trial
    t.secs[c][(t.calls - 2) / candidate_count(op)] = s_per_byte;
    if (t.calls < 1 + kStoreTrialRounds * candidate_count(op)) return;
    std::vector<std::vector<double>> table;
    for (int k = 0; k < candidate_count(op); ++k) table.emplace_back(t.secs[k], t.secs[k] + kStoreTrialRounds);
    const detail::StorePick pick = detail::pick_simplest_within_noise(table);
    t.chosen = pick.chosen;
    t.margin = pick.margin;
  }
  StoreChoice choice(Op op, std::size_t bytes) const {
    StoreChoice r;
    if (policy != StorePolicy::measure) {
      r.decided = true;
      r.stores = forced(policy, op);
      return r;
    }
    const StoreTrials& t = trials[op][size_class(bytes)];
    r.decided = t.chosen >= 0;
    r.stores = for_op(kCandidates[next_candidate(t, op)], op);
    r.margin = t.margin;
    for (int k = 0; k < kMaxCandidates; ++k) {
      double fastest = 0;  // 0: not timed yet
      for (double x : t.secs[k])
        if (x > 0 && (fastest == 0 || x < fastest)) fastest = x;
      r.gbps[k] = fastest > 0 ? 1e-9 / fastest : 0.0;
    }
    return r;
  }

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
    sanitizers::ForkJoin edges;  // what libtbb synchronises, stated for ThreadSanitizer
    arena.execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, chunks, 1), [&](const tbb::blocked_range<std::size_t>& r) {
        edges.body_begins();
        for (std::size_t c = r.begin(); c != r.end(); ++c) run(c);
        edges.body_ends();
      });
    });
    edges.joined();
  }

  tbb::task_arena arena;
  Isa isa;
  const detail::KernelTable& kernels;
  bool bf16_convert;
  StorePolicy policy;
  StoreTrials trials[kOps][64];  // [operation][size class]
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

void CpuAdam::set_store_policy(StorePolicy policy) {
  impl_->policy = policy;
  for (auto& per_out : impl_->trials)
    for (StoreTrials& t : per_out) t = StoreTrials{};
}
StorePolicy CpuAdam::store_policy() const { return impl_->policy; }

namespace {
// fp32 states: master, exp_avg, exp_avg_sq 4 + 4 each; bf16 states: master 4 + 4, the moments 2 + 2.
std::size_t step_bytes(std::size_t n, DType grad_dtype, bool half_out, OptimizerStateDType state_dtype) {
  return n * (2 * 4 + 2 * 2 * optimizer_state_dtype_size(state_dtype) + dtype_size(grad_dtype) + (half_out ? 2 : 0));
}
std::size_t add_grad_bytes(std::size_t n, DType src_dtype, bool first) {
  return n * (dtype_size(src_dtype) + (first ? 4 : 8));
}
}  // namespace

CpuAdam::StoreChoice CpuAdam::store_choice(std::size_t n, DType grad_dtype, bool half_out,
                                           OptimizerStateDType state_dtype) const {
  return impl_->choice(step_op(half_out, state_dtype), step_bytes(n, grad_dtype, half_out, state_dtype));
}

CpuAdam::StoreChoice CpuAdam::add_grad_store_choice(std::size_t n, DType src_dtype, bool first) const {
  return impl_->choice(first ? kAddGradFirst : kAddGradAccumulate, add_grad_bytes(n, src_dtype, first));
}

void CpuAdam::step(const AdamHyper& hyper, std::int64_t step, float grad_scale, float* master, float* exp_avg,
                   float* exp_avg_sq, const void* grad, DType grad_dtype, std::size_t n, void* out_half,
                   DType out_dtype) {
  this->step(hyper, step, grad_scale, master, exp_avg, exp_avg_sq, OptimizerStateDType::fp32, grad, grad_dtype, n,
             out_half, out_dtype);
}

void CpuAdam::step(const AdamHyper& hyper, std::int64_t step, float grad_scale, float* master, void* exp_avg,
                   void* exp_avg_sq, OptimizerStateDType state_dtype, const void* grad, DType grad_dtype,
                   std::size_t n, void* out_half, DType out_dtype) {
  ZOE_CHECK_USAGE(step >= 1, "CpuAdam::step: step must be >= 1 (1-based), got ", step);
  ZOE_CHECK_USAGE(state_dtype == OptimizerStateDType::fp32 || state_dtype == OptimizerStateDType::bf16,
                  "CpuAdam::step: unknown optimizer state dtype ", static_cast<int>(state_dtype));
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
  a.bf16_states = state_dtype == OptimizerStateDType::bf16;
  a.bf16_convert = impl_->bf16_convert;
  const bool half_out = out_half != nullptr;
  const bool can_stream = aligned(master, 64) && aligned(exp_avg, 64) && aligned(exp_avg_sq, 64) &&
                          (!half_out || aligned(out_half, 32));
  const bool can_stream_out = half_out && aligned(out_half, 32);
  const std::size_t bytes = step_bytes(n, grad_dtype, half_out, state_dtype);
  const auto adam = impl_->kernels.adam;
  impl_->with_stores(step_op(half_out, state_dtype), bytes, can_stream, [&](Stores st) {
    a.stream = st.in_place == StoreKind::nontemporal && can_stream;
    a.stream_out = !a.stream && st.half_out == StoreKind::nontemporal && can_stream_out;
    a.prefetch = st.prefetch;
    impl_->for_chunks(n, [&](std::size_t, std::size_t begin, std::size_t end) { adam(a, begin, end); });
  });
}

void CpuAdam::join_master_for_update(const std::uint16_t* high, const std::uint16_t* low, void* exp_avg_sq,
                                     bool bf16_states, float* master, std::size_t n) {
  if (n == 0) return;
  ZOE_CHECK_USAGE(high && low && exp_avg_sq && master, "CpuAdam::join_master_for_update: null array for n = ", n);
  const std::size_t s = bf16_states ? 2 : 4;
  impl_->for_chunks(n, [&](std::size_t, std::size_t begin, std::size_t end) {
    optim::join_master_for_update(high + begin, low + begin, static_cast<char*>(exp_avg_sq) + begin * s, bf16_states,
                                  master + begin, end - begin);
  });
}

void CpuAdam::split_master(const float* master, const std::uint16_t* high, std::uint16_t* low, void* exp_avg_sq,
                           bool bf16_states, std::size_t n) {
  if (n == 0) return;
  ZOE_CHECK_USAGE(high && low && exp_avg_sq && master, "CpuAdam::split_master: null array for n = ", n);
  const std::size_t s = bf16_states ? 2 : 4;
  impl_->for_chunks(n, [&](std::size_t, std::size_t begin, std::size_t end) {
    optim::split_master(master + begin, high + begin, low + begin, static_cast<char*>(exp_avg_sq) + begin * s,
                        bf16_states, end - begin);
  });
}

double CpuAdam::sum_squares(const void* x, DType dtype, std::size_t n) {
  if (n == 0) return 0.0;
  ZOE_CHECK_USAGE(x, "CpuAdam::sum_squares: null array for n = ", n);
  constexpr std::size_t C = kernels::kSumSquaresChunk;
  std::vector<double> sums((n + C - 1) / C);
  const auto chunk_sums = impl_->kernels.chunk_sums;
  impl_->for_chunks(n, [&](std::size_t, std::size_t begin, std::size_t end) { chunk_sums(x, dtype, begin, end, sums.data() + begin / C); });
  double total = 0.0;
  for (double s : sums) total += s;  // chunk order, as host_ops::sum_squares: whichever thread made which sum
  return total;
}

CpuAdam::GradStats CpuAdam::add_grad(const void* src, DType src_dtype, float* grad, std::size_t n, bool first) {
  GradStats r;
  if (n == 0) return r;
  ZOE_CHECK_USAGE(src && grad, "CpuAdam::add_grad: null array (src or grad) for n = ", n);
  constexpr std::size_t C = kernels::kSumSquaresChunk, kBlock = 8 * C;  // a task: 8 chunks
  std::vector<double> sums((n + C - 1) / C);
  const auto add = impl_->kernels.add_grad;
  const std::size_t blocks = (n + kBlock - 1) / kBlock;
  std::atomic<bool> bad{false};
  impl_->with_stores(first ? kAddGradFirst : kAddGradAccumulate, add_grad_bytes(n, src_dtype, first), aligned(grad, 64),
                     [&](Stores st) {
    const bool stream = st.in_place == StoreKind::nontemporal && aligned(grad, 64);
    auto run = [&](std::size_t blk) {
      const std::size_t b = blk * kBlock, e = std::min(n, b + kBlock);
      if (!add(src, src_dtype, grad, first, stream, b, e, sums.data() + b / C)) bad.store(true, std::memory_order_relaxed);
    };
    if (blocks <= 1 || impl_->arena.max_concurrency() == 1) {
      for (std::size_t blk = 0; blk < blocks; ++blk) run(blk);
      return;
    }
    sanitizers::ForkJoin edges;  // what libtbb synchronises, stated for ThreadSanitizer
    impl_->arena.execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, blocks, 1), [&](const tbb::blocked_range<std::size_t>& rg) {
        edges.body_begins();
        for (std::size_t blk = rg.begin(); blk != rg.end(); ++blk) run(blk);
        edges.body_ends();
      });
    });
    edges.joined();
  });
  for (double x : sums) r.sum_squares += x;  // chunk order, as host_ops::sum_squares
  // The AVX-512 kernel reports its vector part finite; an inf or NaN there made the sum inf / NaN.
  r.finite = !bad.load() && std::isfinite(r.sum_squares);
  return r;
}

}  // namespace zoe::optim
