// Split master weights: an fp32 master weight stored as its low 16 bits and one "rounded up"
// bit beside the bf16 compute copy, which holds the high half (2 + 1/8 bytes per element
// instead of 4, rebuilt bit for bit).
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
// Layout: `low` is n uint16; `rounded_up` is ceil(n / 8) bytes, element i in bit i % 8 of byte
// i / 8 (bits past n are written as 0).
// Thread-safety: pure functions over their arguments. Errors: none (n = 0 does nothing).
#pragma once

#include <cstddef>
#include <cstdint>

namespace zoe::optim {

/// Bytes of the "rounded up" bits of n elements: ceil(n / 8).
constexpr std::size_t split_master_bit_bytes(std::size_t n) { return (n + 7) / 8; }

/// master[i] = the fp32 weight whose bf16 copy is high[i], from its low half and rounded-up bit.
/// high, low: n bf16 / uint16 bit patterns; rounded_up: split_master_bit_bytes(n) bytes.
void join_master(const std::uint16_t* high, const std::uint16_t* low, const std::uint8_t* rounded_up, float* master,
                 std::size_t n);

/// The inverse: low[i] = master[i]'s low 16 bits, bit i of rounded_up = (high[i] != master[i]'s
/// high 16 bits), where high[i] must be master[i]'s bf16 copy (round to nearest even).
void split_master(const float* master, const std::uint16_t* high, std::uint16_t* low, std::uint8_t* rounded_up,
                  std::size_t n);

}  // namespace zoe::optim
