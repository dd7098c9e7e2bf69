// A stand-in for torch.distributed's TCPStore server, speaking one dialect of its wire protocol
// the way torch's servers do (torch/csrc/distributed/c10d/TCPStoreBackend.cpp and
// TCPStoreLibUvBackend.cpp; facts, not code): the commands SET / GET / CHECK, a GET of a missing
// key drops the connection, and in the validated dialect a first query that is not VALIDATE
// closes the connection (classic backend) or is ignored (libuv backend). It records what a
// client must never make a real server do: read a SET key length over 1 MiB (the ~1 GB
// allocation an old server would make of VALIDATE's bytes), or, after VALIDATE, a CHECK of no
// keys (the libuv server's trace log reads keys[0]).
// Thread-safety: the accessors may be called from any thread.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/comm/socket_io.hpp"

namespace zoe::test {

class FakeTorchStore {
 public:
  enum class Flavor { unvalidated, validated_closes, validated_ignores, not_a_store };

  explicit FakeTorchStore(Flavor flavor) : flavor_(flavor) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;  // the kernel picks a free port
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listen_fd_, 64);
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~FakeTorchStore() {
    stopping_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    ::close(listen_fd_);
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mutex_);
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
      threads = std::move(threads_);
    }
    for (auto& t : threads) t.join();
    for (int fd : fds_) ::close(fd);
  }

  int port() const { return port_; }
  int connections() const { return connections_; }
  bool saw_huge_key() const { return huge_key_; }
  bool saw_validated_empty_check() const { return empty_check_; }
  std::map<std::string, std::string> keys() {
    std::lock_guard lock(mutex_);
    return map_;
  }

 private:
  void accept_loop() {
    for (;;) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      ++connections_;
      std::lock_guard lock(mutex_);
      if (stopping_) {
        ::close(fd);
        return;
      }
      fds_.push_back(fd);
      threads_.emplace_back([this, fd] { serve(fd); });
    }
  }

  bool read_string(int fd, std::string& s) {
    std::uint64_t n = 0;
    if (!socket_io::read_all(fd, &n, 8)) return false;
    if (n > (1u << 20)) {
      huge_key_ = true;
      return false;
    }
    s.resize(n);
    return socket_io::read_all(fd, s.data(), n);
  }

  void serve(int fd) {
    const bool validated = flavor_ == Flavor::validated_closes || flavor_ == Flavor::validated_ignores;
    const std::uint8_t set = validated ? 1 : 0, get = validated ? 3 : 2, check = validated ? 5 : 4;
    bool first = true;
    for (;;) {
      std::uint8_t cmd = 0;
      if (!socket_io::read_all(fd, &cmd, 1)) break;
      if (flavor_ == Flavor::not_a_store) {
        std::uint8_t junk = 0x7f;
        socket_io::write_all(fd, &junk, 1);
        continue;
      }
      if (validated && first) {
        first = false;
        std::uint32_t magic = 0;
        if (cmd == 0 && socket_io::read_all(fd, &magic, 4) && magic == 0x3C85F7CE) continue;
        if (flavor_ == Flavor::validated_closes) break;
        char sink[256];  // libuv: the unvalidated bytes are never answered
        while (::recv(fd, sink, sizeof sink, 0) > 0) {
        }
        break;
      }
      if (cmd == set) {
        std::string key, value;
        if (!read_string(fd, key) || !read_string(fd, value)) break;
        std::lock_guard lock(mutex_);
        map_[key] = value;
      } else if (cmd == get) {
        std::string key, value;
        if (!read_string(fd, key)) break;
        {
          std::lock_guard lock(mutex_);
          auto it = map_.find(key);
          if (it == map_.end()) break;  // torch: tcpStore_.at(key) throws, the connection is dropped
          value = it->second;
        }
        std::uint64_t n = value.size();
        if (!socket_io::write_all(fd, &n, 8) || !socket_io::write_all(fd, value.data(), n)) break;
      } else if (cmd == check) {
        std::uint64_t n = 0;
        if (!socket_io::read_all(fd, &n, 8)) break;
        if (validated && n == 0) empty_check_ = true;
        bool all = true;
        for (std::uint64_t i = 0; i < n; ++i) {
          std::string key;
          if (!read_string(fd, key)) return;
          std::lock_guard lock(mutex_);
          all = all && map_.count(key) > 0;
        }
        std::uint8_t reply = all ? 0 : 1;
        if (!socket_io::write_all(fd, &reply, 1)) break;
      } else {
        break;
      }
    }
    ::shutdown(fd, SHUT_RDWR);
  }

  Flavor flavor_;
  int listen_fd_ = -1, port_ = 0;
  std::atomic<bool> stopping_{false}, huge_key_{false}, empty_check_{false};
  std::atomic<int> connections_{0};
  std::mutex mutex_;
  std::map<std::string, std::string> map_;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

}  // namespace zoe::test
