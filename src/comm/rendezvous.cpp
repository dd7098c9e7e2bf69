// rank_from_environment of include/zoe/ranks.hpp: ranks as processes.
#include <unistd.h>

#include <cstdlib>

#include "src/comm/host_communicator.hpp"
#include "src/comm/launch_env.hpp"
#include "src/comm/tcp_store.hpp"
#include "src/comm/torch_store_client.hpp"
#include "src/common/boundary_errors.hpp"
#include "src/common/check.hpp"
#include "src/common/log.hpp"
#include "zoe/ranks.hpp"
#if ZOE_HAVE_CUDA
#include "src/comm/nccl_communicator.hpp"
#include "src/device/cuda_device.hpp"
#endif

namespace zoe {
namespace {
std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// ZOE_DEVICE=host|cuda|auto (default auto: the best available device).
std::shared_ptr<Device> device_for(const LaunchEnv& env) {
  std::string choice = env_or("ZOE_DEVICE", "auto");
  if (choice == "host") return make_host_device();
  if (choice == "cuda") {
#if ZOE_HAVE_CUDA
    return std::make_shared<CudaDevice>(env.local_rank);
#else
    ZOE_THROW(Error, "ZOE_DEVICE=cuda but zoe was built without CUDA");
#endif
  }
  if (choice != "auto") ZOE_THROW(Error, "ZOE_DEVICE='", choice, "': expected host, cuda or auto");
  return best_available_device(env.local_rank);
}

// The address other ranks reach this rank's Gloo pairs at: ZOE_GLOO_HOSTNAME if set,
// loopback when the job runs on one host (MASTER_ADDR is a loopback address), else this
// host's name.
std::string gloo_hostname(const LaunchEnv& env) {
  const std::string& m = env.master_addr;
  bool loopback = m.empty() || m == "localhost" || m == "::1" || m.rfind("127.", 0) == 0;
  if (loopback) return env_or("ZOE_GLOO_HOSTNAME", "127.0.0.1");
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) ZOE_THROW_ERRNO(errno, "gethostname failed");
  return env_or("ZOE_GLOO_HOSTNAME", name);
}
// The store the ranks rendezvous through (see RendezvousKind).
std::shared_ptr<KeyValueStore> rendezvous_store(const LaunchEnv& env, std::chrono::milliseconds timeout) {
  switch (env.rendezvous) {
    case RendezvousKind::none: return nullptr;
    case RendezvousKind::zoe_store_tcp:
      return std::make_shared<TcpStore>(env.master_addr, env.master_port, env.rank == 0, timeout);
    case RendezvousKind::torch_agent_store:
      return std::make_shared<TorchStoreClient>(env.master_addr, env.master_port, agent_store_key_prefix(env),
                                                timeout);
    case RendezvousKind::zoe_store_local:
      return std::make_shared<TcpStore>(TcpStore::LocalSocket{local_socket_name(env, ::getuid())}, env.rank == 0,
                                        timeout);
  }
  ZOE_THROW(Error, "unknown rendezvous kind ", int(env.rendezvous));
}
}  // namespace

// rank_from_environment without the boundary (a Gloo or socket library's exception passes).
static RankContext rank_from_environment_of(double timeout_s) {
  auto timeout = timeout_from_seconds(timeout_s);
  LaunchEnv env = launch_env_from_process();
  auto device = device_for(env);
  std::shared_ptr<KeyValueStore> store = rendezvous_store(env, timeout);
  RankContext ctx;
  ctx.rank = env.rank;
  ctx.world_size = env.world_size;
  ctx.local_world_size = env.local_world_size;
  ctx.device = device;
#if ZOE_HAVE_CUDA
  if (device->kind() == DeviceKind::cuda) {
    ctx.comm = std::make_shared<NcclCommunicator>(device, store, env.rank, env.world_size, timeout);
  }
#endif
  if (!ctx.comm) {
    HostCommOptions options;
    options.timeout = timeout;
    options.hostname = gloo_hostname(env);
    ctx.comm = std::make_shared<HostCommunicator>(device, store, env.rank, env.world_size, options);
  }
  ZOE_LOG_INFO("rank {} of {} ({} variables, local rank {}, rendezvous: {}) on {}", env.rank, env.world_size,
               env.launcher, env.local_rank, rendezvous_name(env.rendezvous), device->name());
  return ctx;
}

RankContext rank_from_environment(double timeout_s) {
  return detail::at_public_boundary("rank_from_environment", [&] { return rank_from_environment_of(timeout_s); });
}

}  // namespace zoe
