#include "src/comm/tcp_store.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "src/comm/socket_io.hpp"
#include "src/common/check.hpp"
#include "src/common/log.hpp"

namespace zoe {
namespace {
constexpr std::uint8_t kSet = 1, kGet = 2;
using socket_io::read_all;
using socket_io::write_all;
}  // namespace

TcpStore::TcpStore(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout)
    : address_(host + ":" + std::to_string(port)), is_server_(is_server) {
  if (is_server_) {
    listen_fd_ = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool v6 = listen_fd_ >= 0;
    if (!v6) listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) ZOE_THROW_ERRNO(errno, "TcpStore: socket() for the rendezvous server failed");
    int one = 1, zero = 0;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc;
    if (v6) {
      ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // accept IPv4 too
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<std::uint16_t>(port));
      rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<std::uint16_t>(port));
      rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    if (rc != 0 || ::listen(listen_fd_, 1024) != 0) {
      int err = errno;
      ::close(listen_fd_);
      ZOE_THROW_ERRNO(err, "TcpStore: rank 0 cannot serve the rendezvous store on port ", port,
                      " (MASTER_PORT; is it in use?)");
    }
    acceptor_ = std::thread([this] { serve_accept(); });
    return;
  }
  fd_ = socket_io::connect_tcp(host, port, timeout, "the rendezvous store of rank 0", "MASTER_ADDR:MASTER_PORT");
}

TcpStore::TcpStore(LocalSocket where, bool is_server, std::chrono::milliseconds timeout)
    : address_("abstract socket '" + where.name + "'"), is_server_(is_server) {
  if (is_server_) {
    listen_fd_ = socket_io::listen_local(where.name);
    acceptor_ = std::thread([this] { serve_accept(); });
  } else {
    fd_ = socket_io::connect_local(where.name, timeout, "the rendezvous store of rank 0",
                                   "one host, no MASTER_ADDR; ranks in other network namespaces or on other hosts "
                                   "need MASTER_ADDR=<rank 0's host> MASTER_PORT=<free port> (mpirun -x)");
  }
}

TcpStore::~TcpStore() {
  if (!is_server_) {
    if (fd_ >= 0) ::close(fd_);
    return;
  }
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  acceptor_.join();
  ::close(listen_fd_);
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(clients_mutex_);
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);  // wakes recv()
    threads = std::move(client_threads_);
  }
  for (auto& t : threads) t.join();
  for (int fd : client_fds_) ::close(fd);
}

void TcpStore::serve_accept() {
  for (;;) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      ZOE_LOG_ERROR("TcpStore {}: accept failed: {}", address_, std::strerror(errno));
      return;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard lock(clients_mutex_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    client_fds_.push_back(fd);
    client_threads_.emplace_back([this, fd] { serve_client(fd); });
  }
}

void TcpStore::serve_client(int fd) {
  for (;;) {
    std::uint8_t op;
    std::uint32_t klen;
    if (!read_all(fd, &op, 1) || !read_all(fd, &klen, 4)) return;
    std::string key(klen, '\0');
    if (!read_all(fd, key.data(), klen)) return;
    if (op == kSet) {
      std::uint64_t vlen;
      if (!read_all(fd, &vlen, 8)) return;
      std::vector<char> value(vlen);
      if (!read_all(fd, value.data(), vlen)) return;
      {
        std::lock_guard lock(map_mutex_);
        map_[key] = std::move(value);
      }
      std::uint8_t ack = 1;
      if (!write_all(fd, &ack, 1)) return;
    } else if (op == kGet) {
      std::optional<std::vector<char>> value;
      {
        std::lock_guard lock(map_mutex_);
        auto it = map_.find(key);
        if (it != map_.end()) value = it->second;
      }
      std::uint8_t found = value ? 1 : 0;
      if (!write_all(fd, &found, 1)) return;
      if (value) {
        std::uint64_t vlen = value->size();
        if (!write_all(fd, &vlen, 8) || !write_all(fd, value->data(), vlen)) return;
      }
    } else {
      ZOE_LOG_ERROR("TcpStore {}: unknown request {} from a client; closing it", address_, int(op));
      return;
    }
  }
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  if (is_server_) {
    std::lock_guard lock(map_mutex_);
    map_[key] = value;
    return;
  }
  std::lock_guard lock(request_mutex_);
  std::uint8_t op = kSet, ack = 0;
  std::uint32_t klen = static_cast<std::uint32_t>(key.size());
  std::uint64_t vlen = value.size();
  if (!write_all(fd_, &op, 1) || !write_all(fd_, &klen, 4) || !write_all(fd_, key.data(), klen) ||
      !write_all(fd_, &vlen, 8) || !write_all(fd_, value.data(), vlen) || !read_all(fd_, &ack, 1))
    throw CommError(detail::concat("TcpStore: lost the connection to the rendezvous store at ", address_,
                                   " while setting '", key, "' (did rank 0 exit?)"),
                    0, __FILE__, __LINE__);
}

std::optional<std::vector<char>> TcpStore::try_get(const std::string& key) {
  if (is_server_) {
    std::lock_guard lock(map_mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  std::lock_guard lock(request_mutex_);
  std::uint8_t op = kGet, found = 0;
  std::uint32_t klen = static_cast<std::uint32_t>(key.size());
  bool ok = write_all(fd_, &op, 1) && write_all(fd_, &klen, 4) && write_all(fd_, key.data(), klen) &&
            read_all(fd_, &found, 1);
  std::vector<char> value;
  if (ok && found) {
    std::uint64_t vlen = 0;
    ok = read_all(fd_, &vlen, 8);
    if (ok) {
      value.resize(vlen);
      ok = read_all(fd_, value.data(), vlen);
    }
  }
  if (!ok)
    throw CommError(detail::concat("TcpStore: lost the connection to the rendezvous store at ", address_,
                                   " while reading '", key, "' (did rank 0 exit?)"),
                    0, __FILE__, __LINE__);
  if (!found) return std::nullopt;
  return value;
}

}  // namespace zoe
