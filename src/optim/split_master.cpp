#include "src/optim/split_master.hpp"

#include <bit>
#include <cstring>

namespace zoe::optim {

// Eight elements per byte of bits: whole bytes first, with the bit position a constant of the
// unrolled inner loop and no branch (the compiler vectorises both), then the tail.

void join_master(const std::uint16_t* high, const std::uint16_t* low, const std::uint8_t* rounded_up, float* master,
                 std::size_t n) {
  auto one = [&](std::size_t i, std::uint32_t r) {
    const std::uint32_t hi = static_cast<std::uint32_t>(high[i]) - r;
    master[i] = std::bit_cast<float>((hi << 16) | low[i]);
  };
  const std::size_t whole = n / 8;
  for (std::size_t j = 0; j < whole; ++j) {
    const std::uint32_t b = rounded_up[j];
#pragma GCC unroll 8
    for (std::size_t k = 0; k < 8; ++k) one(8 * j + k, (b >> k) & 1u);
  }
  for (std::size_t i = 8 * whole; i < n; ++i) one(i, (rounded_up[i / 8] >> (i % 8)) & 1u);
}

void split_master(const float* master, const std::uint16_t* high, std::uint16_t* low, std::uint8_t* rounded_up,
                  std::size_t n) {
  // Bit k of the result: whether element i's stored high half is not its own (it was rounded up).
  auto one = [&](std::size_t i, std::size_t k) {
    const std::uint32_t w = std::bit_cast<std::uint32_t>(master[i]);
    low[i] = static_cast<std::uint16_t>(w & 0xffffu);
    return static_cast<std::uint32_t>(high[i] != static_cast<std::uint16_t>(w >> 16)) << k;
  };
  const std::size_t whole = n / 8;
  for (std::size_t j = 0; j < whole; ++j) {
    std::uint32_t b = 0;
#pragma GCC unroll 8
    for (std::size_t k = 0; k < 8; ++k) b |= one(8 * j + k, k);
    rounded_up[j] = static_cast<std::uint8_t>(b);
  }
  if (whole * 8 < n) {
    std::uint32_t b = 0;  // bits past n stay 0
    for (std::size_t i = 8 * whole; i < n; ++i) b |= one(i, i % 8);
    rounded_up[whole] = static_cast<std::uint8_t>(b);
  }
}

}  // namespace zoe::optim
