// Run-time ISA selection from CPUID (GCC's __builtin_cpu_supports, which also checks that the OS
// saves the AVX / AVX-512 register state), with the ZOE_ISA override for tests and benches.
#include <cstdlib>
#include <string>

#include "src/common/check.hpp"
#include "src/optim/cpu_adam.hpp"
#include "src/optim/isa_detect.hpp"

namespace zoe::optim {

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "unknown";
}

bool isa_supported(Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Isa::scalar: return true;
    case Isa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  }
  return false;
}

bool cpu_has_avx512_bf16_convert() {
  __builtin_cpu_init();
  return isa_supported(Isa::avx512) && __builtin_cpu_supports("avx512bf16");
}

Isa best_isa() {
  if (isa_supported(Isa::avx512)) return Isa::avx512;
  if (isa_supported(Isa::avx2)) return Isa::avx2;
  return Isa::scalar;
}

Isa active_isa() {
  const char* env = std::getenv("ZOE_ISA");
  if (!env || !*env) return best_isa();
  const std::string want(env);
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (want != isa_name(isa)) continue;
    if (!isa_supported(isa)) ZOE_THROW_CONFIG("ZOE_ISA", "'", want, "' is not supported by this CPU");
    return isa;
  }
  ZOE_THROW_CONFIG("ZOE_ISA", "'", want, "' is not one of scalar, avx2, avx512");
}

}  // namespace zoe::optim
