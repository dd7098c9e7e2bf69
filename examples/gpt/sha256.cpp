#include "examples/gpt/sha256.hpp"

#include <openssl/evp.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "examples/gpt/error.hpp"

namespace gpt {
namespace {

struct DigestContext {
  DigestContext() : ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free) {
    GPT_CHECK(ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1, "OpenSSL: cannot start a SHA-256");
  }
  void update(const void* data, std::size_t bytes) {
    GPT_CHECK(EVP_DigestUpdate(ctx.get(), data, bytes) == 1, "OpenSSL: SHA-256 update failed");
  }
  std::string hex() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    GPT_CHECK(EVP_DigestFinal_ex(ctx.get(), digest, &n) == 1, "OpenSSL: SHA-256 final failed");
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string out(2 * n, '0');
    for (unsigned int i = 0; i < n; ++i) {
      out[2 * i] = kDigits[digest[i] >> 4];
      out[2 * i + 1] = kDigits[digest[i] & 15];
    }
    return out;
  }
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx;
};

}  // namespace

std::string sha256_hex(const void* data, std::size_t bytes) {
  DigestContext d;
  d.update(data, bytes);
  return d.hex();
}

std::string sha256_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  GPT_CHECK(in, "cannot open '", path, "' to check its sha256: ", std::strerror(errno));
  DigestContext d;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    d.update(buf.data(), static_cast<std::size_t>(in.gcount()));
  }
  GPT_CHECK(in.eof(), "cannot read '", path, "' to check its sha256");
  return d.hex();
}

void require_sha256(const std::string& path, std::string_view expected, std::string_view what) {
  const std::string actual = sha256_file(path);
  GPT_CHECK(actual == expected, what, " '", path, "' is not the expected file: sha256 ", actual, ", expected ",
            expected, " (truncated or edited? fetch it again with scripts/fetch-data.sh)");
}

}  // namespace gpt
