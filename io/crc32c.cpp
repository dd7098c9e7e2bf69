#include "io/crc32c.hpp"

#include <array>
#include <cstring>

namespace zoe::io {
namespace {

constexpr std::uint32_t kPolyReflected = 0x82F63B78u;

// Slicing-by-8 tables: table[0] is the classic byte table, table[k][b] is the CRC
// register after byte b followed by k zero bytes.
struct Tables {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  Tables() {
    for (std::uint32_t b = 0; b < 256; ++b) {
      std::uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (kPolyReflected & (0u - (c & 1u)));
      t[0][b] = c;
    }
    for (std::uint32_t b = 0; b < 256; ++b)
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  }
};

const Tables& tables() {
  static const Tables instance;
  return instance;
}

bool cpu_has_sse42() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

}  // namespace

std::uint32_t crc32c_portable(const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  const auto& t = tables().t;
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  while (bytes >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian load
    w ^= c;
    c = t[7][w & 0xFF] ^ t[6][(w >> 8) & 0xFF] ^ t[5][(w >> 16) & 0xFF] ^ t[4][(w >> 24) & 0xFF] ^
        t[3][(w >> 32) & 0xFF] ^ t[2][(w >> 40) & 0xFF] ^ t[1][(w >> 48) & 0xFF] ^ t[0][w >> 56];
    p += 8;
    bytes -= 8;
  }
  while (bytes--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return ~c;
}

std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  static const bool hw = cpu_has_sse42();
  return hw ? detail::crc32c_sse42(data, bytes, crc) : crc32c_portable(data, bytes, crc);
}

std::string_view crc32c_path() noexcept { return cpu_has_sse42() ? "sse4.2" : "table"; }

}  // namespace zoe::io
