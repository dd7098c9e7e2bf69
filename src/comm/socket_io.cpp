#include "src/comm/socket_io.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "src/common/check.hpp"

namespace zoe::socket_io {
namespace {
using Clock = std::chrono::steady_clock;

sockaddr_un local_address(const std::string& name, socklen_t& length) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  ZOE_CHECK(name.size() + 1 <= sizeof a.sun_path, "abstract socket name '", name, "' is longer than ",
            sizeof a.sun_path - 1, " bytes");
  // Abstract namespace: a leading NUL, then the name (not NUL-terminated).
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

template <class TryOnce>
int connect_retrying(TryOnce try_once, std::chrono::milliseconds timeout, const std::string& what,
                     const std::string& address, const std::string& where) {
  auto deadline = Clock::now() + timeout;
  std::string last_error = "not tried";
  for (;;) {
    int fd = try_once(last_error);
    if (fd >= 0) return fd;
    if (Clock::now() >= deadline)
      ZOE_THROW(TimeoutError, "could not reach ", what, " at ", address, where.empty() ? "" : " (" + where + ")",
                " within ", timeout.count() / 1000.0, " s (last error: ", last_error, ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}
}  // namespace

bool write_all(int fd, const void* data, std::size_t n) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* data, std::size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

ReadOutcome read_within(int fd, void* data, std::size_t n, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return ReadOutcome::timed_out;
    pollfd pfd{fd, POLLIN, 0};
    int ready = ::poll(&pfd, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return ReadOutcome::closed;
    if (ready == 0) return ReadOutcome::timed_out;
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return ReadOutcome::closed;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return ReadOutcome::complete;
}

int connect_tcp(const std::string& host, int port, std::chrono::milliseconds timeout, const std::string& what,
                const std::string& where) {
  auto once = [&](std::string& last_error) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0) {
      last_error = std::string("getaddrinfo: ") + ::gai_strerror(gai);
      return -1;
    }
    int connected = -1;
    for (addrinfo* ai = res; ai && connected < 0; ai = ai->ai_next) {
      int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        connected = fd;
      } else {
        last_error = std::string("connect: ") + std::strerror(errno);
        ::close(fd);
      }
    }
    ::freeaddrinfo(res);
    if (connected >= 0) {
      int one = 1;
      ::setsockopt(connected, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return connected;
  };
  return connect_retrying(once, timeout, what, host + ":" + std::to_string(port), where);
}

int connect_local(const std::string& name, std::chrono::milliseconds timeout, const std::string& what,
                  const std::string& where) {
  socklen_t length = 0;
  sockaddr_un a = local_address(name, length);
  auto once = [&](std::string& last_error) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_error = std::string("socket: ") + std::strerror(errno);
      return -1;
    }
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), length) == 0) return fd;
    last_error = std::string("connect: ") + std::strerror(errno);
    ::close(fd);
    return -1;
  };
  return connect_retrying(once, timeout, what, "abstract socket '" + name + "'", where);
}

int listen_local(const std::string& name) {
  socklen_t length = 0;
  sockaddr_un a = local_address(name, length);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) ZOE_THROW_ERRNO(errno, "socket(AF_UNIX) for abstract socket '", name, "' failed");
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), length) != 0 || ::listen(fd, 1024) != 0) {
    int err = errno;
    ::close(fd);
    ZOE_THROW_ERRNO(err, "cannot listen on abstract socket '", name, "'",
                    err == EADDRINUSE ? " (another process of this job, or a job with the same id, holds it)" : "");
  }
  return fd;
}

}  // namespace zoe::socket_io
