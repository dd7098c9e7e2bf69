// Only zoe's error types (include/zoe/error.hpp) leave a public call: an exception from a
// library zoe uses (nlohmann::json, std::filesystem, std::thread's std::system_error,
// std::bad_alloc) is turned into the zoe error that says the same at the call's boundary, so a
// trainer's `catch (const zoe::Error&)` sees every failure. Thread-safe (no state).
#pragma once

#include <utility>

namespace zoe::detail {

/// Call only inside a catch block. Rethrows the exception being handled as a zoe error: a
/// zoe::Error as it is; std::bad_alloc as OutOfMemoryError; std::system_error (which
/// std::filesystem::filesystem_error is) as SystemError with its errno; any other
/// std::exception as Error; anything else as Error saying so. The new message reads
/// "<call>: <the exception's what(), escaped and cut to 1000 characters>".
[[noreturn]] void rethrow_as_zoe_error(const char* call);

/// f(), with any exception it throws passed through rethrow_as_zoe_error(call).
template <class F>
decltype(auto) at_public_boundary(const char* call, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (...) {
    rethrow_as_zoe_error(call);
  }
}

}  // namespace zoe::detail
