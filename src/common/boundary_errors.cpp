#include "src/common/boundary_errors.hpp"

#include <cerrno>
#include <exception>
#include <new>
#include <system_error>

#include "src/common/check.hpp"
#include "src/common/quote.hpp"

namespace zoe::detail {
namespace {
constexpr std::size_t kShownChars = 1000;
}  // namespace

void rethrow_as_zoe_error(const char* call) {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc& e) {
    ZOE_THROW(OutOfMemoryError, call, ": out of host memory (", e.what(), ")");
  } catch (const std::system_error& e) {
    // An errno only where the code is one (the generic or system category).
    const std::error_category& cat = e.code().category();
    const bool os = cat == std::generic_category() || cat == std::system_category();
    ZOE_THROW_ERRNO(os ? e.code().value() : EIO, call, ": ", detail::excerpt(e.what(), kShownChars));
  } catch (const std::exception& e) {
    ZOE_THROW(Error, call, ": ", detail::excerpt(e.what(), kShownChars));
  } catch (...) {
    ZOE_THROW(Error, call, ": an exception that is not a std::exception");
  }
}

}  // namespace zoe::detail
