// Blocking socket helpers shared by the rendezvous stores (TcpStore, TorchStoreClient):
// full-length reads and writes, a read bounded by a timeout, and connecting with retries
// (the order processes start in must not matter) to a TCP address or to a Linux abstract
// Unix socket (a name in the network namespace, no file: gone when its owner exits).
// Thread-safety: the functions are reentrant; one socket must not be read (or written) by
// two threads at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace zoe::socket_io {

/// Writes all `n` bytes. False when the peer closed or the socket failed (errno kept).
/// Never raises SIGPIPE.
bool write_all(int fd, const void* data, std::size_t n);
/// Reads exactly `n` bytes. False on end of stream or error.
bool read_all(int fd, void* data, std::size_t n);

/// What a bounded read found.
enum class ReadOutcome : unsigned char { complete, closed, timed_out };
/// Reads exactly `n` bytes, waiting at most `timeout` in total. `closed` covers end of stream,
/// a reset and any socket error.
ReadOutcome read_within(int fd, void* data, std::size_t n, std::chrono::milliseconds timeout);

/// Connects to host:port (every address getaddrinfo gives, IPv4 or IPv6), retrying every
/// 50 ms until `timeout`; returns the socket (TCP_NODELAY, close-on-exec). Throws
/// TimeoutError "<what> at host:port (<where>) ... (last error: ...)" when it does not connect
/// in time; `where` names the variables the address came from, e.g. "MASTER_ADDR:MASTER_PORT".
int connect_tcp(const std::string& host, int port, std::chrono::milliseconds timeout, const std::string& what,
                const std::string& where);

/// Connects to the abstract Unix socket `name` (at most 107 bytes), retrying like connect_tcp;
/// `where` (may be empty) goes into the TimeoutError's message like connect_tcp's.
int connect_local(const std::string& name, std::chrono::milliseconds timeout, const std::string& what,
                  const std::string& where);
/// Listens on the abstract Unix socket `name`. Throws SystemError (EADDRINUSE when another
/// process of this network namespace holds the name).
int listen_local(const std::string& name);

}  // namespace zoe::socket_io
