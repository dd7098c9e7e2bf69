// Split master weights: an fp32 master weight stored as its low 16 bits beside the bf16 compute
// copy, which holds the high half, and one "rounded up" bit kept in the sign bit of the
// element's exp_avg_sq (2 bytes per element instead of 4, rebuilt bit for bit).
//
// Why it is exact: the bf16 compute copy h of a master weight w is w rounded to nearest even
// (kernels::f32_to_bf16), and rounding to bf16 either keeps w's high 16 bits (h = hi) or adds one
// to them (h = hi + 1, which carries into the exponent as IEEE bit patterns allow, up to inf).
// So w's bits are ((h - r) << 16) | lo, with lo = w's low 16 bits and r = h - hi in {0, 1}.
// lo alone cannot give r: lo = 0x8000 (a tie) rounds up or down depending on the parity of hi,
// which the rounding has changed, hence the stored bit. r is taken from the h actually stored
// (not recomputed), so the rebuild is exact whatever produced h, as long as h is w's bf16 copy.
// One exception: a NaN master (bf16 rounding sets the quiet bit) rebuilds as a NaN of the same
// sign, its payload possibly changed.
//
// Where the bit lives: exp_avg_sq = beta2 * v + (1 - beta2) * g * g is a sum of products of equal
// signs, so it is +0 or positive, never negative or -0: its sign bit is always 0 and holds r
// between steps at no cost. split_master sets it; join_master reads it, and
// join_master_for_update also clears it, so the update reads the moment as it was. A NaN
// exp_avg_sq (only after a NaN gradient in an update that could not be skipped) stays a NaN
// whose sign is lost.
//
// Layout: `low` is n uint16; `exp_avg_sq` is n floats (fp32 optimizer states) or n bf16 bit
// patterns (bf16 states), the same array the optimizer updates.
// Thread-safety: pure functions over their arguments. Errors: none (n = 0 does nothing).
#pragma once

#include <cstddef>
#include <cstdint>

namespace zoe::optim {

/// master[i] = the fp32 weight whose bf16 copy is high[i], from its low half and the rounded-up
/// bit in exp_avg_sq[i]'s sign (left there). high, low: n bf16 / uint16 bit patterns.
void join_master(const std::uint16_t* high, const std::uint16_t* low, const void* exp_avg_sq, bool bf16_states,
                 float* master, std::size_t n);

/// join_master, then clears exp_avg_sq's sign bits: the moment the update reads.
void join_master_for_update(const std::uint16_t* high, const std::uint16_t* low, void* exp_avg_sq, bool bf16_states,
                            float* master, std::size_t n);

/// The inverse: low[i] = master[i]'s low 16 bits, exp_avg_sq[i]'s sign bit = (high[i] !=
/// master[i]'s high 16 bits), where high[i] must be master[i]'s bf16 copy (round to nearest
/// even) and exp_avg_sq[i] the element's moment (its other bits are kept).
void split_master(const float* master, const std::uint16_t* high, std::uint16_t* low, void* exp_avg_sq,
                  bool bf16_states, std::size_t n);

}  // namespace zoe::optim
