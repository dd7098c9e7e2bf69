// Runs a function in a forked child process and reports how it ended, so a test can cap the
// child's memory (setrlimit) and watch it fail without taking the test runner down.
// Call only from a single-threaded process (fork copies just the calling thread): the tests
// using it create no threads in the parent.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <new>
#include <string>

#include "src/common/sanitizers.hpp"
#include "zoe/error.hpp"

namespace zoe::test {

/// Why a memory-cap test cannot run in this build, or empty: under a sanitizer the shadow memory
/// counts against RLIMIT_DATA and a refused allocation aborts in the sanitizer's allocator
/// instead of throwing, so the cap would measure the sanitizer, not zoe.
inline std::string cap_unmeasurable_reason() {
  if (!sanitizers::address && !sanitizers::thread) return {};
  return std::string("under ") + (sanitizers::address ? "AddressSanitizer" : "ThreadSanitizer") +
         " the shadow memory counts against RLIMIT_DATA and a refused allocation aborts in the sanitizer's "
         "allocator: the cap cannot be measured (runs in the plain build)";
}

/// GTEST_SKIP()s a memory-cap test under a sanitizer, saying why (cap_unmeasurable_reason).
#define ZOE_SKIP_CAP_TEST_UNDER_SANITIZERS()                                          \
  do {                                                                                \
    if (const std::string why = ::zoe::test::cap_unmeasurable_reason(); !why.empty()) \
      GTEST_SKIP() << why;                                                            \
  } while (0)

/// Exit codes of run_in_child's child.
enum ChildExit : int { kChildOk = 0, kChildOutOfMemory = 3, kChildOtherError = 4 };

struct ChildStatus {
  bool exited = false;  // normal exit (else killed by `signal`)
  int code = -1;        // exit code if exited
  int signal = 0;       // terminating signal if not exited
  std::string describe() const {
    return exited ? "exited with code " + std::to_string(code) : "killed by signal " + std::to_string(signal);
  }
};

/// Forks; the child runs fn() under an alarm of `timeout_s` seconds (SIGALRM ends it) and
/// exits kChildOk, kChildOutOfMemory (std::bad_alloc or zoe::OutOfMemoryError escaped fn)
/// or kChildOtherError (any other exception; its message goes to stderr). The parent waits.
inline ChildStatus run_in_child(const std::function<void()>& fn, unsigned timeout_s) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::alarm(timeout_s);
    int code = kChildOk;
    try {
      fn();
    } catch (const std::bad_alloc& e) {
      std::fprintf(stderr, "child: std::bad_alloc: %s\n", e.what());
      code = kChildOutOfMemory;
    } catch (const OutOfMemoryError& e) {
      std::fprintf(stderr, "child: OutOfMemoryError: %s\n", e.what());
      code = kChildOutOfMemory;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      code = kChildOtherError;
    }
    std::fflush(nullptr);
    ::_exit(code);  // no atexit handlers or static destructors of the test runner
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
  }
  ChildStatus s;
  s.exited = WIFEXITED(status);
  s.code = s.exited ? WEXITSTATUS(status) : -1;
  s.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return s;
}

/// This process's VmData (bytes of private writable mappings: what RLIMIT_DATA limits), read
/// from /proc/self/status; -1 if unreadable.
inline long long vm_data_bytes() {
  std::ifstream f("/proc/self/status");
  std::string key;
  long long kb = -1;
  while (f >> key) {
    if (key == "VmData:") {
      f >> kb;
      return kb * 1024;
    }
    f.ignore(1 << 12, '\n');
  }
  return -1;
}

/// Sets the soft RLIMIT_DATA (bytes; RLIM_INFINITY lifts it), keeping the hard limit so the
/// process can lift it again. Returns false if setrlimit failed.
inline bool set_data_limit(rlim_t bytes) {
  rlimit r{};
  if (::getrlimit(RLIMIT_DATA, &r) != 0) return false;
  r.rlim_cur = bytes;
  return ::setrlimit(RLIMIT_DATA, &r) == 0;
}

}  // namespace zoe::test
