// The CUDA backend's MoE permutation kernels (cuda_kernels_internal.h): the row gather that
// permutes tokens to their experts, the gated combination that un-permutes their outputs, and
// their backward — one block per destination row, threads over the row's d floats, so every
// output element is written by one thread and the k-term sums run in the CPU's order
// (kernels/moe_kernels.h). Compiled with --fmad=false: GatherRows, MoeCombine and
// MoeUnpermuteSum equal the CPU bit for bit; the dot products of MoeCombineBackward sum in tree
// order, not the CPU's.
#include "sshsdp/device/cuda_common.cuh"
#include "sshsdp/device/cuda_kernels_internal.h"

namespace sshsdp::cuda {
namespace {

// Rows go one per block: the grid is capped at 65535 blocks and strides over the rest.
constexpr int64_t kMaxRowBlocks = 65535;

__global__ void GatherRowsKernel(const float* src, const int32_t* idx, float* dst, int64_t rows,
                                 int64_t d) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* s = src + int64_t{idx[r]} * d;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dst[r * d + i] = s[i];
  }
}

__global__ void CombineKernel(const float* yp, const int32_t* row, const float* gate, float* out,
                              int64_t N, int k, int64_t d, bool accumulate) {
  for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      float acc = accumulate ? out[t * d + i] : 0.0f;
      for (int j = 0; j < k; ++j) {
        const float g = gate[t * k + j];
        acc += g * yp[int64_t{row[t * k + j]} * d + i];
      }
      out[t * d + i] = acc;
    }
  }
}

// One block per token: dyp rows elementwise, then each dot product reduced in shared memory.
__global__ void CombineBackwardKernel(const float* dy, const float* yp, const int32_t* row,
                                      const float* gate, float* dgate, float* dyp, int64_t N, int k,
                                      int64_t d) {
  __shared__ float part[kThreads];
  for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
    const float* dyt = dy + t * d;
    for (int j = 0; j < k; ++j) {
      const int64_t r = row[t * k + j];
      const float g = gate[t * k + j];
      float s = 0.0f;
      for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        s += dyt[i] * yp[r * d + i];
        dyp[r * d + i] = g * dyt[i];
      }
      part[threadIdx.x] = s;
      __syncthreads();
      for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
      }
      if (threadIdx.x == 0) dgate[t * k + j] = part[0];
      __syncthreads();
    }
  }
}

__global__ void UnpermuteSumKernel(const float* dxp, const int32_t* row, float* dx, int64_t N,
                                   int k, int64_t d) {
  for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      float acc = dxp[int64_t{row[t * k]} * d + i];
      for (int j = 1; j < k; ++j) acc = acc + dxp[int64_t{row[t * k + j]} * d + i];
      dx[t * d + i] = acc;
    }
  }
}

unsigned RowBlocks(int64_t rows) { return static_cast<unsigned>(std::min(rows, kMaxRowBlocks)); }

}  // namespace

cudaError_t LaunchGatherRows(const float* src, const int32_t* idx, float* dst, int64_t rows,
                             int64_t d, cudaStream_t s) {
  GatherRowsKernel<<<RowBlocks(rows), kThreads, 0, s>>>(src, idx, dst, rows, d);
  return cudaGetLastError();
}

cudaError_t LaunchMoeCombine(const float* yp, const int32_t* row, const float* gate, float* out,
                             int64_t N, int k, int64_t d, bool accumulate, cudaStream_t s) {
  CombineKernel<<<RowBlocks(N), kThreads, 0, s>>>(yp, row, gate, out, N, k, d, accumulate);
  return cudaGetLastError();
}

cudaError_t LaunchMoeCombineBackward(const float* dy, const float* yp, const int32_t* row,
                                     const float* gate, float* dgate, float* dyp, int64_t N, int k,
                                     int64_t d, cudaStream_t s) {
  CombineBackwardKernel<<<RowBlocks(N), kThreads, 0, s>>>(dy, yp, row, gate, dgate, dyp, N, k, d);
  return cudaGetLastError();
}

cudaError_t LaunchMoeUnpermuteSum(const float* dxp, const int32_t* row, float* dx, int64_t N, int k,
                                  int64_t d, cudaStream_t s) {
  UnpermuteSumKernel<<<RowBlocks(N), kThreads, 0, s>>>(dxp, row, dx, N, k, d);
  return cudaGetLastError();
}

}  // namespace sshsdp::cuda
