// ZOE_HD marks a function for host and device: __host__ __device__ under nvcc,
// plain inline elsewhere. Elementwise math is written once with it (DESIGN.md,
// "GPU code that CPU tests can cover") and called by the CUDA kernels, the host
// device and the CPU optimizer's scalar path.
#pragma once

#if defined(__CUDACC__)
#define ZOE_HD __host__ __device__ __forceinline__
#else
#define ZOE_HD inline
#endif
