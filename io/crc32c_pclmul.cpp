// CRC32C by folding 16-byte blocks with PCLMULQDQ (the derivation and the constants are in
// io/crc32c_fold.hpp). Four independent 128-bit lanes are folded 64 bytes at a time, so the
// multiplier's latency is hidden; they are then folded onto one, reduced to the 32-bit
// register with the crc32 instruction, and the last < 64 bytes go through the SSE4.2 path.
// Compiled with -mpclmul -msse4.2 (this file only); crc32c.cpp calls it when CPUID has both.
#include <immintrin.h>

#include "io/crc32c.hpp"
#include "io/crc32c_fold128.hpp"

namespace zoe::io::detail {
namespace {

inline __m128i load(const unsigned char* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

}  // namespace

std::uint32_t crc32c_pclmul(const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  constexpr std::size_t kStep = 64;
  if (bytes < 2 * kStep) return crc32c_sse42(data, bytes, crc);
  static const __m128i k128 = fold_constant128(kFold128), k512 = fold_constant128(kFold512);
  const auto* p = static_cast<const unsigned char*>(data);
  // The starting register is the same as XOR-ing it into the message's first 32 bits.
  __m128i x0 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(~crc)));
  __m128i x1 = load(p + 16), x2 = load(p + 32), x3 = load(p + 48);
  p += kStep;
  bytes -= kStep;
  for (; bytes >= kStep; p += kStep, bytes -= kStep) {
    x0 = _mm_xor_si128(fold128(x0, k512), load(p));
    x1 = _mm_xor_si128(fold128(x1, k512), load(p + 16));
    x2 = _mm_xor_si128(fold128(x2, k512), load(p + 32));
    x3 = _mm_xor_si128(fold128(x3, k512), load(p + 48));
  }
  __m128i x = _mm_xor_si128(fold128(x0, k128), x1);
  x = _mm_xor_si128(fold128(x, k128), x2);
  x = _mm_xor_si128(fold128(x, k128), x3);
  for (; bytes >= 16; p += 16, bytes -= 16) x = _mm_xor_si128(fold128(x, k128), load(p));
  return crc32c_sse42(p, bytes, ~register_of(x));
}

}  // namespace zoe::io::detail
