// Constants of CRC32C folding by carry-less multiplication, derived here from the polynomial
// (nothing is copied from a table): the method is the one of Gopal et al., "Fast CRC Computation
// for Generic Polynomials Using PCLMULQDQ Instruction" (Intel, 2009), worked out below for the
// reflected bit order the CRC32C register uses.
//
// The message as a polynomial M(x) has its first bit (bit 0 of byte 0) as the highest power;
// the CRC register after M, starting from register r, is (r * x^|M| + M * x^32) mod P with
// P = 0x1EDC6F41 + x^32. A 16-byte block loaded little-endian into a 128-bit lane holds the
// coefficient of x^(127-i) in bit i, so its low 64 bits H carry the high powers: the block is
// H * x^64 + L. Moving a block D bits further along the message multiplies it by x^D, and
//   (H * x^64 + L) * x^D = H * x^(D+64) + L * x^D == H * (x^(D+64) mod P) + L * (x^D mod P),
// two 64 x 32-bit carry-less products that fit in 128 bits again: that is one fold. A constant
// K (degree < 32) is kept in a 64-bit lane with the coefficient of x^(32-j) in bit j; the
// product of a 64-bit half (x^(63-i) in bit i) with it then holds x^(95-k) in bit k, which
// read as a 128-bit block (x^(127-k)) is the true product times x^32. So the lane for H holds
// x^(D+32) mod P and the lane for L holds x^(D-32) mod P.
// At the end one 128-bit block A is left; its register is A * x^32 mod P, which is what the
// SSE4.2 crc32 instruction computes when fed A's two 64-bit halves from a zero register.
#pragma once

#include <cstdint>

namespace zoe::io::detail {

/// The reflected CRC32C polynomial: bit i is the coefficient of x^(31-i) of P - x^32.
inline constexpr std::uint32_t kCrc32cPolyReflected = 0x82F63B78u;

/// x^e mod P as a CRC register (bit i = coefficient of x^(31-i)): x^0 is bit 31, and a
/// multiplication by x is a right shift that reduces the x^32 falling out by P.
constexpr std::uint32_t crc32c_xpow_mod(unsigned e) {
  std::uint32_t r = 0x80000000u;
  for (unsigned k = 0; k < e; ++k) r = (r >> 1) ^ (kCrc32cPolyReflected & (0u - (r & 1u)));
  return r;
}

/// The two 64-bit lanes of the constant that folds a 16-byte block `distance_bits` further
/// along the message (see the file comment): `high_half` multiplies the block's low qword
/// (its high powers), `low_half` its high qword.
struct FoldConstant {
  std::uint64_t high_half;  // x^(D+32) mod P, coefficient of x^(32-j) in bit j
  std::uint64_t low_half;   // x^(D-32) mod P, same layout
};

constexpr FoldConstant crc32c_fold_constant(unsigned distance_bits) {
  return {std::uint64_t{crc32c_xpow_mod(distance_bits + 32)} << 1,
          std::uint64_t{crc32c_xpow_mod(distance_bits - 32)} << 1};
}

/// The fold distances the kernels use (bits): 128, 256 and 384 bring the lanes of one wide
/// register onto the last one; 512 is four 16-byte lanes (PCLMULQDQ loop, and one 64-byte
/// register's step); 2048 is four 64-byte registers (VPCLMULQDQ loop).
inline constexpr unsigned kFold128 = 128, kFold256 = 256, kFold384 = 384, kFold512 = 512, kFold2048 = 2048;

}  // namespace zoe::io::detail
