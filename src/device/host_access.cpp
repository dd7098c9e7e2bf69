#include "src/device/host_access.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "src/device/device.hpp"

namespace zoe {
namespace {
struct Guards {
  std::mutex mutex;
  std::vector<const Device*> devices;
  std::atomic<std::size_t> count{0};
};
Guards& guards() {
  static Guards g;
  return g;
}
}  // namespace

void add_host_access_guard(const Device* device) {
  Guards& g = guards();
  std::lock_guard lock(g.mutex);
  g.devices.push_back(device);
  g.count.store(g.devices.size(), std::memory_order_relaxed);
}

void remove_host_access_guard(const Device* device) {
  Guards& g = guards();
  std::lock_guard lock(g.mutex);
  g.devices.erase(std::remove(g.devices.begin(), g.devices.end(), device), g.devices.end());
  g.count.store(g.devices.size(), std::memory_order_relaxed);
}

void check_host_accessible_in_process(const void* ptr, std::size_t bytes, const char* what) {
  if (!ptr || bytes == 0) return;
  Guards& g = guards();
  if (g.count.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard lock(g.mutex);
  for (const Device* d : g.devices) d->check_host_accessible(ptr, bytes, what);
}

}  // namespace zoe
