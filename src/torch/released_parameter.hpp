// Released parameters: what a wrapped torch parameter holds between TorchModel::run calls.
// zoe keeps the values (sharded at stage 3), so torch's tensor keeps only its shape and dtype:
// no memory, and a tag naming the parameter and its part. The tensor carries libtorch's
// PrivateUse1 backend bit beside CPU, and a boxed fallback for PrivateUse1 throws zoe's
// UsageError naming that parameter, part and operator. Every operator reaches a backend kernel
// through its highest backend bit, so any use of the parameter outside run() (a wrapped part
// called directly, an optimizer or clip_grad_norm_ over module->parameters(), printing it)
// fails there, at once: libtorch's C++ modules have no forward hooks that could intercept the
// call itself. Keeping the CPU bit keeps Tensor::set_data between it and ordinary CPU tensors
// legal. A process that uses a PrivateUse1 backend of its own cannot also use zoe_torch (one
// fallback per backend key); none of Debian's libtorch packages does.
// Thread-safety: any thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace zoe::torch_detail {

/// A tensor of `shape` and `dtype` with no storage bytes, tagged with `what` (e.g. "parameter
/// 'fc.weight' of part 'blocks.0'"): every operator on it (or on a view of it) throws UsageError.
at::Tensor released_parameter(at::IntArrayRef shape, at::ScalarType dtype, std::string what);

}  // namespace zoe::torch_detail
