// The public device factories of include/zoe/ranks.hpp.
#include "src/common/check.hpp"
#include "src/common/log.hpp"
#include "src/device/host_device.hpp"
#include "zoe/ranks.hpp"
#if ZOE_HAVE_CUDA
#include "src/device/cuda_device.hpp"
#endif

namespace zoe {

std::shared_ptr<Device> make_host_device() {
  return std::make_shared<HostDevice>(host_device_options_from_environment());
}

std::shared_ptr<Device> best_available_device(int ordinal) {
#if ZOE_HAVE_CUDA
  try {
    return std::make_shared<CudaDevice>(ordinal);
  } catch (const CudaError& e) {
    ZOE_LOG_INFO("no usable CUDA device {} ({}); using the host device", ordinal, e.message());
  }
#else
  ZOE_LOG_INFO("zoe was built without CUDA; using the host device (requested cuda:{})", ordinal);
#endif
  return make_host_device();
}

}  // namespace zoe
