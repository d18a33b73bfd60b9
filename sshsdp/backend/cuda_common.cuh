// What the CUDA kernel files share (cuda_kernels.cu, cuda_direct_kernels.cu): the launch shape
// of grid-stride loops and the bf16 scalar rules of numerics/dtype.h (round to nearest even,
// NaN stays NaN). Nothing of sshsdp's is included (see cuda_kernels_internal.h).
//
// Kernels are launched with SSHSDP_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...)
// and declare dynamic shared memory with SSHSDP_DYNAMIC_SHARED(type, name): nvcc's <<<...>>>
// and extern __shared__ here, the CPU emulation's where testing/cuda_emulation.h defined them
// first (it compiles these files as C++ and runs their kernels on the CPU in CI).
#pragma once

#include <cuda_runtime.h>

#ifndef SSHSDP_LAUNCH
#define SSHSDP_LAUNCH(kernel, grid, block, shared, stream) kernel<<<grid, block, shared, stream>>>
#define SSHSDP_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

#include <algorithm>
#include <cstdint>

namespace sshsdp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;  // grid-stride loops beyond

inline int GridFor(int64_t work_items) {
  const int64_t b = (work_items + kThreads - 1) / kThreads;
  return static_cast<int>(std::clamp<int64_t>(b, 1, kMaxBlocks));
}

__device__ __forceinline__ uint16_t FloatToBf16Bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ float Bf16BitsToFloat(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

}  // namespace
}  // namespace sshsdp::cuda
