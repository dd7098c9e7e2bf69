// Which sanitizer this translation unit is built with (GCC: __SANITIZE_ADDRESS__ /
// __SANITIZE_THREAD__; Clang: __has_feature), for the few places that must know: tests that
// cannot run under one (skipped with the reason), and ThreadSanitizer's happens-before
// annotations where synchronisation happens inside an uninstrumented library (oneTBB).
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define ZOE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZOE_ASAN 1
#endif
#endif
#ifndef ZOE_ASAN
#define ZOE_ASAN 0
#endif

#if defined(__SANITIZE_THREAD__)
#define ZOE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ZOE_TSAN 1
#endif
#endif
#ifndef ZOE_TSAN
#define ZOE_TSAN 0
#endif

#if ZOE_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace zoe::sanitizers {
inline constexpr bool address = ZOE_ASAN != 0;
inline constexpr bool thread = ZOE_TSAN != 0;

/// The two happens-before edges of a fork-join loop (tbb::parallel_for) that ThreadSanitizer
/// cannot see, because oneTBB hands tasks to its workers and waits for them inside libtbb,
/// which Debian does not build with TSan: what the calling thread wrote before the loop is
/// visible to every body, and what every body wrote is visible after the loop returns. Create
/// one just before the loop, call body_begins() / body_ends() first and last in each body,
/// and joined() after the loop. Without TSan every call is empty. Races between two bodies
/// stay visible (no edge is stated between them). Thread-safety: the body calls from any
/// thread; construction and joined() on the calling thread.
class ForkJoin {
 public:
  ForkJoin() { release(&fork_); }
  void body_begins() { acquire(&fork_); }
  void body_ends() { release(&join_); }
  void joined() { acquire(&join_); }

 private:
#if ZOE_TSAN
  static void acquire(void* p) { __tsan_acquire(p); }
  static void release(void* p) { __tsan_release(p); }
#else
  static void acquire(void*) {}
  static void release(void*) {}
#endif
  char fork_ = 0, join_ = 0;  // addresses only: TSan's sync objects
};
}  // namespace zoe::sanitizers
