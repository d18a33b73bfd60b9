// The CUDA execution model emulated on the CPU, so the CUDA kernel files (device/*.cu) and the
// CUDA backend's host code (backend/cuda_backend.cc) run in CI on machines without a GPU, op by
// op against the CPU backend (backend_emulated_test). It is a test tool, not a backend:
// it says nothing of speed, and the real GPU check (scripts/gpu_check.sh) stays the proof.
//
// What it runs for real: every kernel, block by block; in a block every thread is a fiber
// (ucontext) on the launching thread, run until it reaches __syncthreads() or returns, then the
// next, so a barrier is a real barrier and shared memory is shared. What it checks that a GPU
// would fail on: launch limits (threads per block, grid dimensions, 48 KiB of dynamic shared
// memory without opt-in) as cudaGetLastError's error; a __syncthreads() that some threads of
// the block never reach (divergent barriers: undefined on a GPU) as an error too. Races inside
// a phase between barriers: SSHSDP_CUDA_EMULATION_ORDER=reverse runs each phase's threads in
// reverse order, so a result that depends on the order differs between the two runs. Dynamic
// shared memory starts as NaN bytes per block (a read before a write shows).
//
// What it does not emulate: warps (no shuffles or warp-synchronous code: the kernels use none),
// streams (every launch and copy completes at once, in order), device memory (host memory from
// aligned_alloc), the GPU's libm (glibc's expf, not CUDA's: the ops with exp or log have
// tolerances), cuBLAS (the CPU backend's GEMMs stand in: testing/cuda_emulation.cc).
//
// Use: compile a .cu file as C++ with this header first (-ffp-contract=off, as --fmad=false):
//   #include "sshsdp/backend/testing/cuda_emulation.h"
//   #include "sshsdp/backend/cuda_kernels.cu"
// and link testing/cuda_emulation.cc in place of libcudart and libcublas.
#pragma once

#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace sshsdp::emu {

// The executing thread's index, and the block's and grid's, as CUDA's built-ins give them.
const dim3& ThreadIdx();
const dim3& BlockIdx();
const dim3& BlockDim();
const dim3& GridDim();
// The calling fiber waits until every thread of its block has called it.
void SyncThreads();
// The block's dynamic shared memory (the launch's shared_bytes).
void* DynamicShared();
// cudaEventCreateWithFlags calls so far (backend_test holds the CUDA backend's event pool to
// it; declared there too, as this header is for kernel files).
int64_t EventsCreated();
// Runs `kernel` (one thread's body) over the grid; a launch error is kept for cudaGetLastError.
void RunGrid(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& kernel);

// `kernel` calls the kernel function with the launch's arguments (a generic lambda, so a
// template kernel's arguments are deduced as in a <<<...>>> launch).
template <typename Kernel>
struct Launch {
  Kernel kernel;
  dim3 grid, block;
  size_t shared;
  template <typename... Args>
  void operator()(const Args&... args) const {
    RunGrid(grid, block, shared, [&] { kernel(args...); });
  }
};
template <typename Kernel>
Launch<Kernel> MakeLaunch(Kernel kernel, dim3 grid, dim3 block, size_t shared, cudaStream_t) {
  return {kernel, grid, block, shared};
}

}  // namespace sshsdp::emu

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// Blocks run one at a time, their threads as fibers of one host thread: a function's static
// array is the running block's shared memory.
#define __shared__ static
#define threadIdx (::sshsdp::emu::ThreadIdx())
#define blockIdx (::sshsdp::emu::BlockIdx())
#define blockDim (::sshsdp::emu::BlockDim())
#define gridDim (::sshsdp::emu::GridDim())
#define __syncthreads() ::sshsdp::emu::SyncThreads()
#define SSHSDP_LAUNCH(kernel, grid, block, shared, stream) \
  ::sshsdp::emu::MakeLaunch([](const auto&... a) { kernel(a...); }, grid, block, shared, stream)
#define SSHSDP_DYNAMIC_SHARED(type, name) \
  type* name = static_cast<type*>(::sshsdp::emu::DynamicShared())

// The device intrinsics the kernels use, on the host (IEEE round-to-nearest float operations:
// the emulated files are built with -ffp-contract=off, as nvcc's with --fmad=false).
inline uint32_t __float_as_uint(float f) { return std::bit_cast<uint32_t>(f); }
inline float __uint_as_float(uint32_t u) { return std::bit_cast<float>(u); }
inline uint32_t __umulhi(uint32_t a, uint32_t b) {
  return static_cast<uint32_t>((uint64_t{a} * b) >> 32);
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
// Fibers of one host thread never interleave inside an atomic.
inline int atomicMax(int* p, int v) {
  const int old = *p;
  if (v > old) *p = v;
  return old;
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
  const unsigned old = *p;
  if (v > old) *p = v;
  return old;
}
