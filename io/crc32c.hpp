// CRC32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78), as used by iSCSI
// (RFC 3720, appendix B.4) and ext4/btrfs metadata. crc32c("123456789") = 0xE3069283.
// Paths (crc32c() takes the first this CPU runs, chosen once at run time from CPUID):
//  1. vpclmulqdq: folding 64-byte registers by carry-less multiplication (AVX-512 + VPCLMULQDQ;
//     the folding and its constants: io/crc32c_fold.hpp); past memory speed on long buffers;
//     buffers under 512 bytes and the last < 64 bytes go through the SSE4.2 path;
//  2. sse4.2: the crc32 instruction over three interleaved streams, combined with GF(2)
//     "append zeros" operators (Mark Adler's method);
//  3. pclmulqdq: the same folding on 16-byte registers (PCLMULQDQ + SSE4.2). It comes after
//     SSE4.2 because it was measured slower: on a Zen 5 (AMD EPYC, 1 MiB in L2, one thread)
//     13 GB/s against 25 GB/s for SSE4.2 and 49 GB/s for VPCLMULQDQ; 8 lanes instead of 4 did
//     not change it (the 128-bit multiplier's throughput is the limit there). It is kept
//     reachable through crc32c_via and tested;
//  4. table: portable slicing-by-8.
// Every path gives the same value for every input (tested bitwise at every length and alignment).
// Thread-safety: every function is pure and may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zoe::io {

/// CRC32C of `bytes` bytes at `data`, continuing from `crc` (the value a previous call
/// returned; 0 to start). crc32c(b, crc32c(a)) == crc32c(a ++ b). Any alignment.
std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc = 0) noexcept;

/// The same with the portable table path (tests compare the paths).
std::uint32_t crc32c_portable(const void* data, std::size_t bytes, std::uint32_t crc = 0) noexcept;

/// The implementations (crc32c() prefers them in the order listed in the file comment).
enum class Crc32cPath { table, sse42, pclmul, vpclmul };

/// "table", "sse4.2", "pclmulqdq" or "vpclmulqdq".
std::string_view crc32c_path_name(Crc32cPath path) noexcept;

/// Whether this CPU (and OS, for AVX-512 register state) can run `path`.
bool crc32c_path_supported(Crc32cPath path) noexcept;

/// The path crc32c() uses on this CPU: the first supported of vpclmul, sse42, pclmul, table.
Crc32cPath crc32c_active_path() noexcept;

/// crc32c_path_name(crc32c_active_path()).
std::string_view crc32c_path() noexcept;

/// crc32c() through the given path (tests, benches). Throws zoe::UsageError naming the path
/// if crc32c_path_supported(path) is false.
std::uint32_t crc32c_via(Crc32cPath path, const void* data, std::size_t bytes, std::uint32_t crc = 0);

namespace detail {
/// The paths, each in its own file, the only one compiled with its ISA flags. Only call one
/// when crc32c_path_supported says the CPU runs it.
std::uint32_t crc32c_sse42(const void* data, std::size_t bytes, std::uint32_t crc) noexcept;
std::uint32_t crc32c_pclmul(const void* data, std::size_t bytes, std::uint32_t crc) noexcept;
std::uint32_t crc32c_vpclmul(const void* data, std::size_t bytes, std::uint32_t crc) noexcept;
}  // namespace detail

}  // namespace zoe::io
