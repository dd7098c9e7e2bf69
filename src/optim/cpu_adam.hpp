// CPU Adam / AdamW over fp32 master weights and fp32 exp_avg / exp_avg_sq (or, opt-in, bf16
// exp_avg / exp_avg_sq: below), with a gradient in fp32, bf16 or fp16 and an optional bf16/fp16
// copy of the updated weights.
// Math (torch.optim.Adam / AdamW 1.13; Kingma & Ba 2015 Alg. 1; Loshchilov & Hutter 2019 Alg. 2):
//   g  = grad * grad_scale                  (grad_scale = clip_coef / loss_scale / ...)
//   Adam:  g += weight_decay * p            AdamW: p -= lr * weight_decay * p
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// eps is added after the square root of the bias-corrected second moment, as torch does. The
// exact operation order (the one torch's kernels use) is in kernels/adam_math.hpp.
// `step` (t >= 1) is an argument, so a resumed run reproduces an uninterrupted one bitwise.
//
// ISA paths (scalar, AVX2+F16C, AVX-512) and threads: every path performs the same IEEE
// binary32 operations in the same order with no FMA contraction (the library's optim sources are
// compiled with -ffp-contract=off), and every element is independent, so all ISA paths and all
// thread counts give bitwise identical weights, moments and half outputs (tested). Against torch
// itself, whose vector kernels fuse some multiply-adds into FMAs, results agree to ~1 ulp per step.
// sum_squares adds in a fixed order (below) that every path reproduces, so it is bitwise equal
// across ISAs and thread counts too.
//
// bf16 optimizer states (opt-in, OptimizerStateDType::bf16): exp_avg and exp_avg_sq are stored
// as bf16 bit patterns (uint16) while the master weights stay fp32 and all the math is the fp32
// math above, unchanged: per element, m and v are widened to fp32 (exact), updated as above, the
// weight is updated with those fp32 m and v (the values computed in this step, BEFORE rounding:
// what a kernel that keeps fp32 math does), and only then are m and v rounded to bf16 and stored. The rounding is round to nearest, ties to
// even (NaN stays a quiet NaN with its sign, overflow past bf16's largest finite value gives inf):
// it is deterministic, so results stay bitwise equal for any thread count, ISA and rank (which
// zoe's tests rely on), and it is what torch's tensor.to(torch.bfloat16) does, so states match a
// torch run that keeps bf16 states. (Stochastic rounding would depend on a random stream.)
//
// Stores: step() writes its arrays with ordinary or non-temporal (streaming, cache-bypassing)
// stores. Which is faster depends on the CPU, the sizes and what is in cache, not on a cache size
// one can read (issue 16: on a Zen 4 VM non-temporal stores of the in-place arrays ran 0.55-0.8x
// ordinary ones past the L3 size, the old threshold; on the 2-vCPU Xeon build VM they cost 25-31%,
// while software prefetch gained 14-18% there and lost 3-8% on the Zen 4 VM). So by default
// (StorePolicy::measure) each CpuAdam times the candidate store kinds, with and without
// prefetch, on its own first calls of each size class and keeps the simplest one within noise
// of the fastest: no separate calibration pass, no memory of its own, and the trial calls do
// the real update (67 calls of a class with a half copy, 45 without). Store kinds and prefetch
// never change a result bit (tested), so the choice affects speed only.
//
// Thread-safety: a CpuAdam runs its own oneTBB arena of the size given. step and sum_squares
// may be called from one thread at a time, and add_grad from one thread at a time,
// which may be another one running beside them (the engine: the gradient sink's I/O worker adds
// gradients while the update pipeline's worker runs step; they touch disjoint measurement
// state). Both then run in the one arena, so together they use at most threads() threads (with
// threads() == 1 each runs inline on its calling thread); StorePolicy::measure's trials of one
// may then be slowed by the other, which can only change a speed pick, never a result.
// set_store_policy must not run beside any call. Distinct CpuAdam objects may be used concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "zoe/dtype.hpp"

namespace zoe::optim {

/// Instruction-set paths. scalar: portable C++. avx2: AVX2 + F16C. avx512: AVX-512 F/BW/VL/DQ,
/// with vcvtneps2bf16 for bf16 outputs and bf16 states when the CPU has AVX512_BF16 (else integer
/// rounding, same result), and vcvtps2ph / vcvtph2ps for fp16.
enum class Isa { scalar, avx2, avx512 };
/// "scalar", "avx2", "avx512".
std::string_view isa_name(Isa isa);
/// True if this CPU (CPUID + OS register state) can run `isa`.
bool isa_supported(Isa isa);
/// Best ISA this CPU supports (CPUID), lowered by env ZOE_ISA=scalar|avx2|avx512. Throws
/// zoe::ConfigError (key "ZOE_ISA") for another value or for an ISA this CPU lacks.
Isa active_isa();

/// How one stream of stores is written: ordinary (through the caches) or non-temporal
/// (vmovntps & co.: write-combined straight to memory, no read for ownership).
enum class StoreKind { ordinary, nontemporal };

/// The store kinds of one CpuAdam::step: for the fp32 arrays updated in place (master, exp_avg,
/// exp_avg_sq) and for the bf16/fp16 copy out_half (ignored without one). The in-place lines
/// have just been read, so streaming them saves no read for ownership; the half copy's have not.
/// Also whether step's loop issues software prefetches (not a store kind, but measured with
/// them: it pays on some CPUs and loses on others; add_grad never prefetches).
struct Stores {
  StoreKind in_place = StoreKind::ordinary;
  StoreKind half_out = StoreKind::ordinary;
  bool prefetch = false;
  friend bool operator==(const Stores&, const Stores&) = default;
};
/// "ordinary" (both ordinary), "nontemporal" (both non-temporal), "nontemporal-half" (ordinary in
/// place, non-temporal half copy), "nontemporal-in-place" (the remaining combination); with
/// "+prefetch" appended when prefetch is set.
std::string stores_name(Stores stores);

/// How a CpuAdam picks the Stores of each step.
enum class StorePolicy {
  /// Default. Per size class (floor(log2(bytes moved)), with / without a half copy): the first
  /// call uses ordinary stores untimed (warm-up: page faults, thread start); the next
  /// kStoreTrialRounds rounds run every candidate once each (order rotated per round) and time
  /// them; from then on the earliest (simplest) candidate whose fastest trial is within a noise
  /// margin of the fastest candidate's is used
  /// (detail::pick_simplest_within_noise: margin = max(5%, 2 standard errors of the median)),
  /// so a pick within noise stays the same from process to process. step's candidates: ordinary, nontemporal, each also with
  /// prefetch, and with a half copy nontemporal-half with and without prefetch (4 or 6);
  /// add_grad's: ordinary, nontemporal (first and accumulating calls are measured apart).
  /// Arrays not aligned for streaming (see step) use ordinary stores and do not count as trials.
  /// Trials are timed by the calling thread's CPU clock when the arena has one thread (the call
  /// runs inline; time given to other processes is left out), else by the wall clock.
  measure,
  ordinary,          // always Stores{ordinary, ordinary}, no prefetch
  nontemporal,       // always Stores{nontemporal, nontemporal} (where aligned), no prefetch
  nontemporal_half,  // always Stores{ordinary, nontemporal} (half copy streamed where aligned), no prefetch
};
/// "measure", "ordinary", "nontemporal", "nontemporal-half".
std::string_view store_policy_name(StorePolicy policy);
/// Inverse of store_policy_name; throws zoe::ConfigError(key) naming the accepted values.
StorePolicy parse_store_policy(std::string_view text, const char* key);

/// Storage type of a step's optimizer states exp_avg and exp_avg_sq (zoe/dtype.hpp): fp32 float
/// arrays (the default) or uint16 arrays of bf16 bit patterns, widened exactly on load and rounded
/// to nearest even on store (class comment). The master weights and the math are always fp32.
using ::zoe::OptimizerStateDType;
using ::zoe::optimizer_state_dtype_size;
/// "fp32", "bf16".
std::string_view optimizer_state_dtype_name(OptimizerStateDType dtype);
/// Inverse of optimizer_state_dtype_name (exact, case-sensitive); throws zoe::ConfigError(key)
/// naming the value and the accepted ones ("fp32", "bf16") for any other text.
OptimizerStateDType parse_optimizer_state_dtype(std::string_view text, const char* key);

/// Hyper-parameters, in double like torch's Python floats (so 1 - beta2 is computed as torch does;
/// float literals convert implicitly). lr in parameter units per step; betas in [0, 1); eps > 0.
struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = true;  // true: AdamW, false: Adam (L2 added to the gradient)
  bool bias_correction = true;  // false: no moment bias correction (kernels::adam_coeffs)
};

class CpuAdam {
 public:
  /// Element chunk every parallel loop is cut into (a multiple of every SIMD width; independent
  /// of the thread count, which is what makes sum_squares deterministic).
  static constexpr std::size_t kChunk = 16384;

  /// Timed rounds over the candidates per size class under StorePolicy::measure (medians of 11
  /// interleaved trials: one trial alone was seen off by 2x on a shared 2-core machine, and
  /// best-of-3 picked differently from one process to the next; so did medians of 7 at load 10).
  static constexpr int kStoreTrialRounds = 11;

  /// threads: size of the oneTBB arena (0 = all hardware threads). The ISA is active_isa(); the
  /// store policy is env ZOE_ADAM_STORES (measure|ordinary|nontemporal|nontemporal-half),
  /// default measure. Throws zoe::UsageError for threads < 0, zoe::ConfigError for a bad ZOE_ISA
  /// or ZOE_ADAM_STORES.
  explicit CpuAdam(int threads = 0);
  /// As above with a forced ISA; throws zoe::UsageError if this CPU cannot run it.
  CpuAdam(int threads, Isa isa);
  ~CpuAdam();
  CpuAdam(const CpuAdam&) = delete;
  CpuAdam& operator=(const CpuAdam&) = delete;
  Isa isa() const;
  int threads() const;

  /// Replaces the store policy (tests, benches); forgets every measurement made so far.
  void set_store_policy(StorePolicy policy);
  StorePolicy store_policy() const;

  /// What StorePolicy::measure knows about the size class of a step of n elements with
  /// grad_dtype gradients, (half_out) a half copy and state_dtype states (bf16 states are measured
  /// apart from fp32 ones: another access pattern). Units: GB/s = bytes moved (as step counts
  /// them) / best trial seconds / 1e9; 0 for a candidate not yet timed.
  struct StoreChoice {
    bool decided = false;  // all trials done: `stores` is what step uses for this class
    Stores stores;         // decided: the pick; else the next call's stores (ordinary for warm-up)
    /// Best rate over the timed trials of each candidate (what the pick compares), in the order of
    /// StorePolicy::measure's list:
    /// ordinary, nontemporal, ordinary+prefetch, nontemporal+prefetch, nontemporal-half,
    /// nontemporal-half+prefetch (add_grad: the first two only).
    double gbps[6] = {0, 0, 0, 0, 0, 0};
    /// Decided: the relative noise margin the pick was made with (>= 0.05); else 0.
    double margin = 0.0;
  };
  /// Under another policy: decided = true and the policy's Stores, no rates.
  StoreChoice store_choice(std::size_t n, DType grad_dtype, bool half_out,
                           OptimizerStateDType state_dtype = OptimizerStateDType::fp32) const;
  /// The same for add_grad of n elements of src_dtype (first or accumulate: measured apart);
  /// stores.in_place is the kind of the fp32 gradient's stores. Bytes moved: n * (src size + 4),
  /// + 4 more when accumulating (grad read).
  StoreChoice add_grad_store_choice(std::size_t n, DType src_dtype, bool first) const;

  /// One update of n elements in place: master, exp_avg, exp_avg_sq (fp32, n each). grad has n
  /// elements of grad_dtype. If out_half is not null it receives the updated weights as out_dtype
  /// (bf16 or fp16, n elements, round to nearest even, NaN stays NaN). step is t >= 1.
  /// Arrays must not overlap. Stores per the store policy (class comment); non-temporal stores
  /// only where the fp32 arrays are 64-byte aligned (in place) and out_half 32-byte aligned
  /// (half copy), else ordinary. Bytes moved: n * (24 + dtype_size(grad_dtype) + (out_half ? 2 : 0)),
  /// i.e. master, exp_avg, exp_avg_sq read and written, grad read, out_half written.
  /// Throws zoe::UsageError for step < 1, a null array with n > 0, or out_dtype fp32.
  void step(const AdamHyper& hyper, std::int64_t step, float grad_scale, float* master, float* exp_avg,
            float* exp_avg_sq, const void* grad, DType grad_dtype, std::size_t n, void* out_half = nullptr,
            DType out_dtype = DType::bf16);
  /// The same update with the states' storage type chosen at run time. Arrays are flat, n
  /// elements each, not overlapping. state_dtype fp32: exp_avg and exp_avg_sq are float arrays and
  /// this is exactly the overload above (same bits, same kernels). state_dtype bf16: exp_avg and
  /// exp_avg_sq are std::uint16_t arrays of bf16 bit patterns; each element is widened to fp32
  /// (exact), updated with the fp32 math, the weight updated with those fp32 moments (this step's,
  /// before any rounding), and the moments written back rounded to nearest even (NaN stays a quiet
  /// NaN, overflow gives inf; class comment). master stays fp32; grad, out_half and step are as
  /// above, and so is the bitwise equality across ISAs and thread counts. Stores: the same kinds
  /// and prefetch choices as with fp32 states (non-temporal 16-bit stores for the moments), picked
  /// under StorePolicy::measure in size classes of their own; non-temporal only where master,
  /// exp_avg, exp_avg_sq are 64-byte and out_half 32-byte aligned. Bytes moved with bf16 states:
  /// n * (16 + dtype_size(grad_dtype) + (out_half ? 2 : 0)), i.e. master 4 read + 4 written,
  /// exp_avg 2 + 2, exp_avg_sq 2 + 2, grad read, out_half written. Thread-safety: as step above
  /// (class comment). Throws zoe::UsageError as above (step < 1, a null array with n > 0,
  /// out_dtype fp32) and for a state_dtype outside the enum; nothing is written then.
  void step(const AdamHyper& hyper, std::int64_t step, float grad_scale, float* master, void* exp_avg,
            void* exp_avg_sq, OptimizerStateDType state_dtype, const void* grad, DType grad_dtype, std::size_t n,
            void* out_half = nullptr, DType out_dtype = DType::bf16);
  /// Sum of float(x[i])^2 over n elements of dtype in fp64 (squares of floats are exact there),
  /// in the order kernels::kSumSquaresChunk documents (32 fp64 lanes per 4,096-element chunk,
  /// the chunk sums in chunk order), host_ops::sum_squares' and add_grad's too. So the result is
  /// bitwise the same for any thread count and ISA, and the same as the host device's sum of
  /// the same values (a gradient tier's norm piece equals the device optimizer's). NaN / inf
  /// propagate. Throws zoe::UsageError for null x with n > 0.
  double sum_squares(const void* x, DType dtype, std::size_t n);

  /// What add_grad reports about the gradient it wrote.
  struct GradStats {
    double sum_squares = 0.0;  // fp64, in kernels::kSumSquaresChunk's order (host_ops::sum_squares')
    bool finite = true;        // every element finite
  };
  /// The offload tier's gradient add (offload::OptimizerStates::add_grad's arithmetic) in one
  /// pass over this object's threads: grad[i] = float(src[i]) when `first`, else grad[i] +
  /// float(src[i]) in fp32, for n elements (src of src_dtype, grad fp32, not overlapping), and of
  /// the result its sum of squares and finiteness. Bitwise what host_ops::cast / accumulate then
  /// host_ops::sum_squares give, for any thread count and ISA (tested; one
  /// exception: an fp16 signalling NaN becomes a quiet NaN on the AVX-512 path, as in step). The
  /// AVX-512 path keeps a chunk's 32 lanes in four 8-wide accumulators, so the order is kept.
  /// grad's stores follow the store policy like step's (measured apart, class comment);
  /// non-temporal only where grad is 64-byte aligned. Throws zoe::UsageError for a null array with n > 0.
  GradStats add_grad(const void* src, DType src_dtype, float* grad, std::size_t n, bool first);

  /// Split master weights (src/optim/split_master.hpp: arrays, layout and why it is exact) on
  /// this CpuAdam's threads, in kChunk-element pieces: the same bytes as the free functions
  /// join_master_for_update and split_master. Thread-safety: as step (one call at a time with
  /// step and sum_squares). Throws zoe::UsageError for a null array with n > 0.
  void join_master_for_update(const std::uint16_t* high, const std::uint16_t* low, void* exp_avg_sq, bool bf16_states,
                              float* master, std::size_t n);
  void split_master(const float* master, const std::uint16_t* high, std::uint16_t* low, void* exp_avg_sq,
                    bool bf16_states, std::size_t n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zoe::optim
