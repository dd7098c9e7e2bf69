# zoe_gpt_cuda: the GPT model's CUDA backend (CudaOps: cuBLAS plus the kernels of cuda_ops.cu),
# built when zoe has CUDA and cuBLAS is found. Users get ZOE_GPT_HAVE_CUDA=1 and zoe_gpt_core.
# Links the CUDA runtime statically and libcublas.so, never the driver library libcuda.so.1, so
# its binaries start on machines without a GPU (CudaOps then throws; cuda_usable() says why).
# Included at the end of gpt_core.cmake (once).
include_guard(GLOBAL)
if(ZOE_HAVE_CUDA AND TARGET CUDA::cublas)
  add_library(zoe_gpt_cuda STATIC ${PROJECT_SOURCE_DIR}/examples/gpt/cuda_ops.cu)
  # CMake 3.25 (Debian 12) knows no C++20 flag for nvcc, so the device code is C++17 (as
  # kernels/); kernel_math.hpp's __host__ __device__ functions call constexpr std:: functions
  # (numeric_limits), hence --expt-relaxed-constexpr. CudaOps equals KernelOps to rounding, not
  # bitwise (cuBLAS and Eigen sum in other orders, and GCC contracts multiply-adds on the host
  # too), so the kernels keep nvcc's default fused multiply-adds.
  set_target_properties(zoe_gpt_cuda PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  target_compile_options(zoe_gpt_cuda PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
  target_include_directories(zoe_gpt_cuda PUBLIC ${PROJECT_SOURCE_DIR})
  # zoe_gpt_core only for users: its PUBLIC host flags (-march=native) are not nvcc options.
  target_link_libraries(zoe_gpt_cuda PRIVATE zoe::zoe CUDA::cudart_static CUDA::cublas
    INTERFACE zoe_gpt_core)
  target_compile_definitions(zoe_gpt_cuda PUBLIC ZOE_GPT_HAVE_CUDA=1)
  # The trainer then computes with CudaOps on a rank whose engine lives on a GPU.
  if(TARGET zoe_gpt_trainer)
    target_link_libraries(zoe_gpt_trainer PRIVATE zoe_gpt_cuda)
  endif()
elseif(ZOE_HAVE_CUDA)
  message(STATUS "examples/gpt: CudaOps skipped (CUDA found but not cuBLAS)")
endif()
