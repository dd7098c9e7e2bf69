// CRC32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78), as used by iSCSI
// (RFC 3720, appendix B.4) and ext4/btrfs metadata. crc32c("123456789") = 0xE3069283.
// Hardware path: the SSE4.2 crc32 instruction over three interleaved streams, combined
// with GF(2) "append zeros" operators (Mark Adler's method); portable path: slicing-by-8
// tables. The path is chosen once at run time from CPUID.
// Thread-safety: every function is pure and may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zoe::io {

/// CRC32C of `bytes` bytes at `data`, continuing from `crc` (the value a previous call
/// returned; 0 to start). crc32c(b, crc32c(a)) == crc32c(a ++ b). Any alignment.
std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc = 0) noexcept;

/// The same with the portable table path (tests compare the two paths).
std::uint32_t crc32c_portable(const void* data, std::size_t bytes, std::uint32_t crc = 0) noexcept;

/// "sse4.2" or "table": the path crc32c() uses on this CPU.
std::string_view crc32c_path() noexcept;

namespace detail {
/// The SSE4.2 path (io/crc32c_sse42.cpp, the only file compiled with -msse4.2).
/// Only call when the CPU supports SSE4.2.
std::uint32_t crc32c_sse42(const void* data, std::size_t bytes, std::uint32_t crc) noexcept;
}  // namespace detail

}  // namespace zoe::io
