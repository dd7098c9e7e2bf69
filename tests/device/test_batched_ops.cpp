// The batched device operations on the host device, unified and discrete (the discrete model
// routes each region of a batch through its copy engines as copy() would).
#include "tests/device/batched_ops_check.hpp"

#include "src/device/host_device.hpp"

using namespace zoe;

TEST(BatchedOps, UnifiedHostDeviceEqualsOneAtATime) {
  HostDevice dev;
  testing_batched::check_batched_ops(dev);
}

TEST(BatchedOps, DiscreteHostDeviceEqualsOneAtATime) {
  HostDevice dev(HostDeviceOptions{.memory = HostMemoryModel::discrete});
  testing_batched::check_batched_ops(dev);
}
