// Test-only hooks into the engine (never set in production code). Not thread-safe to
// change while an engine runs.
#pragma once

#include <functional>

namespace zoe::core::test_hooks {
/// Called on the update thread after each group's optimizer update (argument: group index).
inline std::function<void(int)> after_group_update;
}  // namespace zoe::core::test_hooks
