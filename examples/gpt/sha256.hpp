// SHA-256 (FIPS 180-4) of bytes and files, as lowercase hex: the trainer's content checks of
// its data (the pinned tokenizer files, the books a token cache was built from, the cache
// itself). OpenSSL's libcrypto (Debian's libssl-dev) computes it: a well-kept implementation
// using the CPU's SHA extensions, about 1.4 GB/s on this machine, so checking the 12 MB of
// books, 1.5 MB of tokenizer files and the 6 MB cache on every start costs ~15 ms. The same digests as `sha256sum`, so the values
// scripts/fetch-data.sh pins are the ones the trainer checks.
// Thread-safety: free functions, safe from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace gpt {

/// SHA-256 of `bytes` bytes at `data`, 64 lowercase hex digits.
std::string sha256_hex(const void* data, std::size_t bytes);
inline std::string sha256_hex(std::string_view text) { return sha256_hex(text.data(), text.size()); }

/// SHA-256 of the file at `path`. Throws zoe::Error naming the path if it cannot be read.
std::string sha256_file(const std::string& path);

/// Throws zoe::Error naming `path`, the expected and the actual sha256 unless the file's
/// sha256 is `expected` (a truncated, edited or replaced file); `what` names the file's role
/// in the message ("tokenizer file").
void require_sha256(const std::string& path, std::string_view expected, std::string_view what);

}  // namespace gpt
