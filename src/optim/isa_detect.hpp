// Internal CPUID queries beyond the public Isa choice.
#pragma once

#include "src/optim/cpu_adam.hpp"

namespace zoe::optim {

/// The best ISA this CPU supports, ignoring ZOE_ISA.
Isa best_isa();
/// True if the AVX-512 path may use vcvtneps2bf16 (AVX512_BF16) for bf16 outputs.
bool cpu_has_avx512_bf16_convert();

}  // namespace zoe::optim
