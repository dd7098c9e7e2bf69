#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <thread>

#include "src/offload/pinned_pool.hpp"
#include "zoe/error.hpp"

using namespace zoe;
using namespace zoe::offload;

TEST(PinnedPool, BuffersAreAlignedDistinctAndRounded) {
  PinnedPool pool({.buffer_count = 3, .buffer_bytes = 10000});
  EXPECT_EQ(pool.buffer_bytes(), 12288u);
  EXPECT_EQ(pool.total_bytes(), 3u * 12288);
  std::vector<PinnedBuffer> leased;
  std::set<void*> seen;
  for (int i = 0; i < 3; ++i) {
    leased.push_back(pool.acquire());
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(leased.back().data()) % 4096, 0u);
    EXPECT_EQ(leased.back().size(), 12288u);
    EXPECT_TRUE(pool.contains(leased.back().data(), 12288));
    seen.insert(leased.back().data());
    std::memset(leased.back().data(), i + 1, 12288);  // writable end to end
  }
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(pool.available(), 0u);
  EXPECT_EQ(static_cast<unsigned char*>(leased[0].data())[12287], 1);  // no overlap
  EXPECT_FALSE(pool.contains(static_cast<char*>(leased[0].data()) + 4096, 12288)) << "spans two buffers";
}

TEST(PinnedPool, ExhaustionIsAnErrorAndReleaseRefills) {
  PinnedPool pool({.buffer_count = 2, .buffer_bytes = 4096});
  PinnedBuffer a = pool.acquire();
  PinnedBuffer b = pool.acquire();
  try {
    pool.acquire();
    FAIL() << "no error";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("all 2 buffers"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(pool.try_acquire().has_value());
  void* pa = a.data();
  a.release();
  EXPECT_EQ(pool.available(), 1u);
  PinnedBuffer c = pool.acquire();
  EXPECT_EQ(c.data(), pa);
  // acquire_wait blocks until another thread gives a buffer back.
  std::thread giver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    b.release();
  });
  PinnedBuffer d = pool.acquire_wait();
  EXPECT_TRUE(d);
  giver.join();
}

TEST(PinnedPool, BudgetIsNeverExceeded) {
  auto budget = std::make_shared<PinnedBudget>((6u << 20) - 1);
  {
    PinnedPool first({.buffer_count = 2, .buffer_bytes = 1 << 20, .budget = budget, .holder = "first"});
    EXPECT_EQ(budget->reserved_bytes(), 2u << 20);
    try {  // 2 MiB held + 4 MiB asked > 6 MiB - 1
      PinnedPool second({.buffer_count = 4, .buffer_bytes = 1 << 20, .budget = budget, .holder = "second"});
      FAIL() << "no error";
    } catch (const OutOfMemoryError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("zoe.pinned_budget_bytes"), std::string::npos) << what;
      EXPECT_NE(what.find("second needs 4194304 bytes"), std::string::npos) << what;
      EXPECT_NE(what.find("held: first 2097152"), std::string::npos) << what;
    }
    EXPECT_EQ(budget->reserved_bytes(), 2u << 20);  // the refused pool reserved nothing
    PinnedPool fits({.buffer_count = 3, .buffer_bytes = 1 << 20, .budget = budget, .holder = "third"});
    EXPECT_EQ(budget->reserved_bytes(), 5u << 20);
  }
  EXPECT_EQ(budget->reserved_bytes(), 0u);  // destroyed pools give their bytes back
  auto exact = std::make_shared<PinnedBudget>(4u << 20);
  PinnedPool pool({.buffer_count = 4, .buffer_bytes = 1 << 20, .budget = exact});
  EXPECT_EQ(pool.total_bytes(), 4u << 20);
  EXPECT_THROW(PinnedPool({.buffer_count = 0, .buffer_bytes = 4096}), UsageError);
}

TEST(PinnedPool, LocksWhenAllowedAndFallsBackToPageable) {
  rlimit limit{};
  ::getrlimit(RLIMIT_MEMLOCK, &limit);
  const std::size_t bytes = 16 << 20;  // twice the default 8 MiB limit
  bool may_lock = ::geteuid() == 0 || limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= bytes;
  {
    PinnedPool pool({.buffer_count = 4, .buffer_bytes = bytes / 4});
    EXPECT_EQ(pool.locked(), may_lock) << "euid " << ::geteuid() << ", RLIMIT_MEMLOCK " << limit.rlim_cur;
  }
  PinnedPool pool({.buffer_count = 4, .buffer_bytes = bytes / 4, .simulate_mlock_failure = true});
  EXPECT_FALSE(pool.locked());
  PinnedBuffer b = pool.acquire();
  auto span = b.as<std::uint32_t>();
  for (std::size_t i = 0; i < span.size(); ++i) span[i] = static_cast<std::uint32_t>(i * 2654435761u);
  for (std::size_t i = 0; i < span.size(); i += 997) ASSERT_EQ(span[i], static_cast<std::uint32_t>(i * 2654435761u));
  PinnedPool unlocked({.buffer_count = 1, .buffer_bytes = 4096, .lock = false});
  EXPECT_FALSE(unlocked.locked());
}

TEST(PinnedPool, CallsTheDeviceRegistrationCallbacks) {
  void* registered_ptr = nullptr;
  std::size_t registered_bytes = 0;
  void* unregistered_ptr = nullptr;
  {
    PinnedPool pool({.buffer_count = 3,
                     .buffer_bytes = 8192,
                     .register_fn = [&](void* p, std::size_t n) { registered_ptr = p; registered_bytes = n; return true; },
                     .unregister_fn = [&](void* p) { unregistered_ptr = p; }});
    EXPECT_TRUE(pool.registered());
    EXPECT_EQ(registered_bytes, 3u * 8192);
    EXPECT_EQ(pool.buffers().front().data(), registered_ptr);
    EXPECT_EQ(unregistered_ptr, nullptr);
  }
  EXPECT_EQ(unregistered_ptr, registered_ptr);
  bool unregister_called = false;
  {
    PinnedPool refused({.buffer_count = 1,
                        .buffer_bytes = 4096,
                        .register_fn = [](void*, std::size_t) { return false; },
                        .unregister_fn = [&](void*) { unregister_called = true; }});
    EXPECT_FALSE(refused.registered());
    EXPECT_TRUE(refused.acquire());
  }
  EXPECT_FALSE(unregister_called) << "nothing to unregister after a refusal";
}
