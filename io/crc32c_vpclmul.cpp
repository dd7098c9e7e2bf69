// CRC32C by folding with VPCLMULQDQ on 512-bit registers: the PCLMULQDQ method
// (io/crc32c_pclmul.cpp, constants in io/crc32c_fold.hpp) with four 16-byte blocks per
// register and four registers in flight, 256 bytes a round. The registers are then folded onto
// one, its four lanes onto the last, which is reduced as in the PCLMULQDQ path; the last
// < 64 bytes go through the SSE4.2 path.
// Compiled with -mavx512f -mvpclmulqdq -mpclmul -msse4.2 (this file only); crc32c.cpp calls it
// when CPUID (and the OS's saved register state) allows all of them.
#include <immintrin.h>

#include "io/crc32c.hpp"
#include "io/crc32c_fold128.hpp"

namespace zoe::io::detail {
namespace {

// Each 16-byte lane of z moved k's distance along and XOR-ed with next (0x96: a ^ b ^ c).
inline __m512i fold_into(__m512i z, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(z, k, 0x00), _mm512_clmulepi64_epi128(z, k, 0x11),
                                   next, 0x96);
}

inline __m512i load(const unsigned char* p) { return _mm512_loadu_si512(p); }

}  // namespace

std::uint32_t crc32c_vpclmul(const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  constexpr std::size_t kStep = 256;
  if (bytes < 2 * kStep) return crc32c_sse42(data, bytes, crc);
  static const __m128i k128 = fold_constant128(kFold128), k256 = fold_constant128(kFold256), k384 = fold_constant128(kFold384);
  static const __m512i k512 = _mm512_broadcast_i32x4(fold_constant128(kFold512)),
                       k2048 = _mm512_broadcast_i32x4(fold_constant128(kFold2048));
  const auto* p = static_cast<const unsigned char*>(data);
  // The starting register is the same as XOR-ing it into the message's first 32 bits.
  __m512i z0 = _mm512_xor_si512(load(p), _mm512_castsi128_si512(_mm_cvtsi32_si128(static_cast<int>(~crc))));
  __m512i z1 = load(p + 64), z2 = load(p + 128), z3 = load(p + 192);
  p += kStep;
  bytes -= kStep;
  for (; bytes >= kStep; p += kStep, bytes -= kStep) {
    z0 = fold_into(z0, k2048, load(p));
    z1 = fold_into(z1, k2048, load(p + 64));
    z2 = fold_into(z2, k2048, load(p + 128));
    z3 = fold_into(z3, k2048, load(p + 192));
  }
  __m512i z = fold_into(z0, k512, z1);
  z = fold_into(z, k512, z2);
  z = fold_into(z, k512, z3);
  for (; bytes >= 64; p += 64, bytes -= 64) z = fold_into(z, k512, load(p));
  __m128i x = _mm_xor_si128(fold128(_mm512_castsi512_si128(z), k384), fold128(_mm512_extracti32x4_epi32(z, 1), k256));
  x = _mm_xor_si128(x, _mm_xor_si128(fold128(_mm512_extracti32x4_epi32(z, 2), k128), _mm512_extracti32x4_epi32(z, 3)));
  return crc32c_sse42(p, bytes, ~register_of(x));
}

}  // namespace zoe::io::detail
