// Helpers shared by the io and offload_store tests: a temporary directory removed on
// destruction, deterministic test data, and a 4096-aligned buffer filled with it.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

#include "src/common/aligned_buffer.hpp"

namespace zoe::test {

class TempDir {
 public:
  explicit TempDir(const std::string& parent = "/tmp") {
    std::string pattern = parent + "/zoe-test-XXXXXX";
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed under " + parent);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// splitmix64 stream (Steele et al. 2014): distinct, reproducible bytes per seed.
inline void fill_pattern(void* data, std::size_t bytes, std::uint64_t seed) {
  auto* p = static_cast<unsigned char*>(data);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (std::size_t i = 0; i < bytes; i += 8) {
    std::uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    std::memcpy(p + i, &z, std::min<std::size_t>(8, bytes - i));
  }
}

inline AlignedBuffer pattern_buffer(std::size_t bytes, std::uint64_t seed) {
  AlignedBuffer b(bytes == 0 ? 1 : bytes);
  fill_pattern(b.data(), bytes, seed);
  return b;
}

/// Index of the first differing byte, or -1 if equal.
inline long long first_difference(const void* a, const void* b, std::size_t bytes) {
  auto* x = static_cast<const unsigned char*>(a);
  auto* y = static_cast<const unsigned char*>(b);
  for (std::size_t i = 0; i < bytes; ++i)
    if (x[i] != y[i]) return static_cast<long long>(i);
  return -1;
}

}  // namespace zoe::test
