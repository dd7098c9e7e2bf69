#include "src/comm/torch_store_client.hpp"

#include <unistd.h>

#include <cstring>

#include "src/comm/socket_io.hpp"
#include "src/common/check.hpp"
#include "src/common/log.hpp"

// CommError with this file:line (its constructor also takes a backend code: 0 on the host).
#define STORE_FAIL(...) throw ::zoe::CommError(::zoe::detail::concat(__VA_ARGS__), 0, __FILE__, __LINE__)

namespace zoe {
namespace {
using socket_io::ReadOutcome;

struct Commands {
  std::uint8_t set, get, check;
};
constexpr Commands kUnvalidated{0, 2, 4};
constexpr Commands kValidated{1, 3, 5};
constexpr std::uint8_t kValidate = 0;
constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;
constexpr std::uint8_t kReady = 0, kNotReady = 1;
constexpr std::size_t kMaxKey = 8 * 1024, kMaxValue = 8 * 1024 * 1024;  // torch's libuv server

const Commands& commands(TorchStoreDialect d) { return d == TorchStoreDialect::validated ? kValidated : kUnvalidated; }

// Appends little-endian fields of a query (x86-64 and aarch64 hosts are little-endian, as
// torch's own client assumes).
struct Query {
  std::vector<char> bytes;
  explicit Query(std::uint8_t command) { bytes.push_back(static_cast<char>(command)); }
  template <class T>
  Query& value(T v) {
    const char* p = reinterpret_cast<const char*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof v);
    return *this;
  }
  Query& string(const std::string& s) {
    value<std::uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  Query& blob(const std::vector<char>& v) {
    value<std::uint64_t>(v.size());
    bytes.insert(bytes.end(), v.begin(), v.end());
    return *this;
  }
  bool send(int fd) const { return socket_io::write_all(fd, bytes.data(), bytes.size()); }
};
}  // namespace

const char* dialect_name(TorchStoreDialect d) {
  return d == TorchStoreDialect::validated ? "validated (torch >= 2.1)" : "unvalidated (torch < 2.1)";
}

TorchStoreClient::TorchStoreClient(const std::string& host, int port, std::string key_prefix,
                                   std::chrono::milliseconds timeout, std::chrono::milliseconds probe_wait)
    : address_(host + ":" + std::to_string(port)) {
  prefix_.reserve(1 + key_prefix.size());
  prefix_.push_back('/');
  prefix_.append(key_prefix);
  const std::string what = "torchrun's rendezvous store (TORCHELASTIC_USE_AGENT_STORE=True)";
  const std::string where = "MASTER_ADDR:MASTER_PORT";
  fd_ = socket_io::connect_tcp(host, port, timeout, what, where);
  // The unvalidated dialect's CHECK of no keys: an old server answers READY; a new one closes
  // the connection (classic backend) or ignores it (libuv backend).
  std::uint8_t reply = 0xff;
  ReadOutcome probe = Query(kUnvalidated.check).value<std::uint64_t>(0).send(fd_)
                          ? socket_io::read_within(fd_, &reply, 1, probe_wait)
                          : ReadOutcome::closed;
  if (probe == ReadOutcome::complete && reply == kReady) {
    dialect_ = TorchStoreDialect::unvalidated;
  } else if (probe == ReadOutcome::complete) {
    ::close(fd_);
    fd_ = -1;
    STORE_FAIL("the server at ", address_, " (", where, ") answered byte ", int(reply),
              " to a TCPStore CHECK: it is not a torch.distributed TCPStore. Unset TORCHELASTIC_USE_AGENT_STORE to "
              "have rank 0 serve zoe's own store on MASTER_PORT");
  } else {
    ::close(fd_);
    fd_ = socket_io::connect_tcp(host, port, timeout, what, where);
    dialect_ = TorchStoreDialect::validated;
    reply = 0xff;
    // Confirmed by a CHECK of one key (READY or NOT_READY both prove the dialect): the libuv
    // server's trace log reads keys[0] of a CHECK, so it never gets a CHECK of no keys.
    bool sent = Query(kValidate).value(kValidationMagic).send(fd_) &&
                Query(kValidated.check).value<std::uint64_t>(1).string(prefix_ + "dialect_probe").send(fd_);
    ReadOutcome confirm = sent ? socket_io::read_within(fd_, &reply, 1, timeout) : ReadOutcome::closed;
    if (confirm != ReadOutcome::complete || (reply != kReady && reply != kNotReady)) {
      ::close(fd_);
      fd_ = -1;
      STORE_FAIL("the server at ", address_, " (", where,
                ") speaks neither dialect of torch.distributed's TCPStore protocol (no answer to a CHECK before or after "
                "VALIDATE): is MASTER_PORT torchrun's store? Unset TORCHELASTIC_USE_AGENT_STORE to have rank 0 serve "
                "zoe's own store on MASTER_PORT");
    }
  }
  ZOE_LOG_DEBUG("TorchStoreClient {}: {} dialect", address_, dialect_name(dialect_));
}

TorchStoreClient::~TorchStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

void TorchStoreClient::lost(const std::string& doing, const std::string& key) const {
  STORE_FAIL("TorchStoreClient: lost the connection to torchrun's store at ", address_, " while ", doing, " '", key,
             "' (did the torchrun agent exit?)");
}

void TorchStoreClient::set(const std::string& key, const std::vector<char>& value) {
  const std::string full = prefix_ + key;
  ZOE_CHECK_USAGE(full.size() <= kMaxKey, "TorchStoreClient: key '", full, "' is ", full.size(),
                  " bytes; torch's TCPStore takes at most ", kMaxKey);
  ZOE_CHECK_USAGE(value.size() <= kMaxValue, "TorchStoreClient: the value of '", full, "' is ", value.size(),
                  " bytes; torch's TCPStore takes at most ", kMaxValue);
  std::lock_guard lock(request_mutex_);
  if (!Query(commands(dialect_).set).string(full).blob(value).send(fd_)) lost("setting", key);
}

std::optional<std::vector<char>> TorchStoreClient::try_get(const std::string& key) {
  const std::string full = prefix_ + key;
  const Commands& c = commands(dialect_);
  std::lock_guard lock(request_mutex_);
  std::uint8_t ready = 0xff;
  if (!Query(c.check).value<std::uint64_t>(1).string(full).send(fd_) || !socket_io::read_all(fd_, &ready, 1))
    lost("checking", key);
  if (ready == kNotReady) return std::nullopt;
  if (ready != kReady)
    STORE_FAIL("TorchStoreClient: torchrun's store at ", address_, " answered ", int(ready),
              " to CHECK '", full, "' (expected 0 or 1)");
  std::uint64_t length = 0;
  if (!Query(c.get).string(full).send(fd_) || !socket_io::read_all(fd_, &length, sizeof length)) lost("reading", key);
  if (length > kMaxValue)
    STORE_FAIL("TorchStoreClient: torchrun's store at ", address_, " announced a ", length,
              "-byte value for '", full, "' (more than torch's limit of ", kMaxValue, ")");
  std::vector<char> value(length);
  if (!socket_io::read_all(fd_, value.data(), value.size())) lost("reading", key);
  return value;
}

}  // namespace zoe
