// SSE4.2 CRC32C: three independent crc32 streams (the instruction has latency 3 and
// throughput 1 per cycle, so one stream would run at a third of the possible rate),
// combined by "appending zeros" to the earlier streams with precomputed GF(2) operators.
// Method and operator construction: Mark Adler, crc32c.c (zlib-licensed, stackoverflow
// answer 17646775), rewritten here.
#include <nmmintrin.h>

#include <cstdint>
#include <cstring>

#include "io/crc32c.hpp"
#include "io/crc32c_fold.hpp"

namespace zoe::io::detail {
namespace {

constexpr std::uint32_t kPolyReflected = kCrc32cPolyReflected;
constexpr std::size_t kLong = 8192;  // bytes per stream in the big loop
constexpr std::size_t kShort = 256;  // bytes per stream in the small loop

// 32x32 GF(2) matrix (one column per word) times vector.
std::uint32_t gf2_times(const std::uint32_t* mat, std::uint32_t vec) {
  std::uint32_t sum = 0;
  for (; vec; vec >>= 1, ++mat)
    if (vec & 1) sum ^= *mat;
  return sum;
}

void gf2_square(std::uint32_t* square, const std::uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = gf2_times(mat, mat[n]);
}

// Operator (as four byte-indexed tables) that advances a raw CRC register over `len`
// zero bytes; len is a power of two.
struct ZerosOp {
  std::uint32_t table[4][256];
  explicit ZerosOp(std::size_t len) {
    std::uint32_t odd[32], even[32];
    odd[0] = kPolyReflected;  // one zero bit
    for (int n = 1; n < 32; ++n) odd[n] = 1u << (n - 1);
    gf2_square(even, odd);  // two zero bits
    gf2_square(odd, even);  // four zero bits
    const std::uint32_t* op = nullptr;
    for (;;) {  // squaring doubles: 1, 2, 4, ... zero bytes, alternating buffers
      gf2_square(even, odd);
      len >>= 1;
      if (len == 0) { op = even; break; }
      gf2_square(odd, even);
      len >>= 1;
      if (len == 0) { op = odd; break; }
    }
    for (std::uint32_t n = 0; n < 256; ++n) {
      table[0][n] = gf2_times(op, n);
      table[1][n] = gf2_times(op, n << 8);
      table[2][n] = gf2_times(op, n << 16);
      table[3][n] = gf2_times(op, n << 24);
    }
  }
  std::uint64_t shift(std::uint64_t crc) const {
    return table[0][crc & 0xFF] ^ table[1][(crc >> 8) & 0xFF] ^ table[2][(crc >> 16) & 0xFF] ^
           table[3][(crc >> 24) & 0xFF];
  }
};

inline std::uint64_t load64(const unsigned char* p) {
  std::uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

// Three streams of `block` bytes each at p, p+block, p+2*block; returns the combined register.
inline std::uint64_t three_streams(std::uint64_t crc0, const unsigned char* p, std::size_t block,
                                   const ZerosOp& op) {
  std::uint64_t crc1 = 0, crc2 = 0;
  for (const unsigned char* end = p + block; p < end; p += 8) {
    crc0 = _mm_crc32_u64(crc0, load64(p));
    crc1 = _mm_crc32_u64(crc1, load64(p + block));
    crc2 = _mm_crc32_u64(crc2, load64(p + 2 * block));
  }
  crc0 = op.shift(crc0) ^ crc1;
  return op.shift(crc0) ^ crc2;
}

}  // namespace

std::uint32_t crc32c_sse42(const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  static const ZerosOp long_op(kLong);
  static const ZerosOp short_op(kShort);
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t c = static_cast<std::uint32_t>(~crc);
  while (bytes && (reinterpret_cast<std::uintptr_t>(p) & 7)) {
    c = _mm_crc32_u8(static_cast<std::uint32_t>(c), *p++);
    --bytes;
  }
  while (bytes >= 3 * kLong) {
    c = three_streams(c, p, kLong, long_op);
    p += 3 * kLong;
    bytes -= 3 * kLong;
  }
  while (bytes >= 3 * kShort) {
    c = three_streams(c, p, kShort, short_op);
    p += 3 * kShort;
    bytes -= 3 * kShort;
  }
  for (; bytes >= 8; bytes -= 8, p += 8) c = _mm_crc32_u64(c, load64(p));
  while (bytes--) c = _mm_crc32_u8(static_cast<std::uint32_t>(c), *p++);
  return ~static_cast<std::uint32_t>(c);
}

}  // namespace zoe::io::detail
