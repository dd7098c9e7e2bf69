#include "io/crc32c.hpp"

#include <array>
#include <cstring>

#include "io/crc32c_fold.hpp"
#include "src/common/check.hpp"

namespace zoe::io {
namespace {

constexpr std::uint32_t kPolyReflected = detail::kCrc32cPolyReflected;

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

bool cpu_supports(Crc32cPath path) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  switch (path) {
    case Crc32cPath::table: return true;
    case Crc32cPath::sse42: return __builtin_cpu_supports("sse4.2");
    case Crc32cPath::pclmul: return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul");
    case Crc32cPath::vpclmul:
      // avx512f also tells that the OS saves the AVX-512 register state.
      return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul") &&
             __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq");
  }
  return false;
#else
  return path == Crc32cPath::table;
#endif
}

using PathFn = std::uint32_t (*)(const void*, std::size_t, std::uint32_t) noexcept;

PathFn path_fn(Crc32cPath path) {
  switch (path) {
    case Crc32cPath::table: break;
    case Crc32cPath::sse42: return detail::crc32c_sse42;
    case Crc32cPath::pclmul: return detail::crc32c_pclmul;
    case Crc32cPath::vpclmul: return detail::crc32c_vpclmul;
  }
  return crc32c_portable;
}

// The preference order (crc32c.hpp says why PCLMULQDQ comes after SSE4.2).
constexpr Crc32cPath kPreference[] = {Crc32cPath::vpclmul, Crc32cPath::sse42, Crc32cPath::pclmul};

Crc32cPath best_path() {
  for (Crc32cPath p : kPreference)
    if (cpu_supports(p)) return p;
  return Crc32cPath::table;
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
  static const PathFn fn = path_fn(best_path());
  return fn(data, bytes, crc);
}

std::string_view crc32c_path_name(Crc32cPath path) noexcept {
  switch (path) {
    case Crc32cPath::table: return "table";
    case Crc32cPath::sse42: return "sse4.2";
    case Crc32cPath::pclmul: return "pclmulqdq";
    case Crc32cPath::vpclmul: return "vpclmulqdq";
  }
  return "unknown";
}

bool crc32c_path_supported(Crc32cPath path) noexcept { return cpu_supports(path); }

Crc32cPath crc32c_active_path() noexcept {
  static const Crc32cPath path = best_path();
  return path;
}

std::string_view crc32c_path() noexcept { return crc32c_path_name(crc32c_active_path()); }

std::uint32_t crc32c_via(Crc32cPath path, const void* data, std::size_t bytes, std::uint32_t crc) {
  ZOE_CHECK_USAGE(cpu_supports(path), "crc32c_via: path ", crc32c_path_name(path), " is not supported by this CPU");
  return path_fn(path)(data, bytes, crc);
}

}  // namespace zoe::io
