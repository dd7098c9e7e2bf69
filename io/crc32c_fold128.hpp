// The 16-byte folding step shared by the PCLMULQDQ and VPCLMULQDQ paths. Each of those files is
// compiled with its own ISA flags, so these helpers have internal linkage (an anonymous
// namespace): every file gets its own copy, and the linker can never hand the AVX-512 file's
// copy to the PCLMULQDQ path (which runs on CPUs without AVX-512). Include only from files
// compiled with at least -msse4.2 -mpclmul.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "io/crc32c_fold.hpp"

namespace zoe::io::detail {
namespace {  // NOLINT: internal linkage on purpose, see above

// The fold constant for `distance_bits` in one 128-bit register (crc32c_fold.hpp's layout).
inline __m128i fold_constant128(unsigned distance_bits) {
  const FoldConstant k = crc32c_fold_constant(distance_bits);
  return _mm_set_epi64x(static_cast<long long>(k.low_half), static_cast<long long>(k.high_half));
}

// The block `x` moved `k`'s distance further along the message (still congruent mod P).
inline __m128i fold128(__m128i x, __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

// The CRC register of the message whose remainder is the block x (x * x^32 mod P): the crc32
// instruction fed x's two halves from a zero register.
inline std::uint32_t register_of(__m128i x) {
  std::uint64_t reg = _mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(x)));
  return static_cast<std::uint32_t>(_mm_crc32_u64(reg, static_cast<std::uint64_t>(_mm_extract_epi64(x, 1))));
}

}  // namespace
}  // namespace zoe::io::detail
