// The direct path's device reduction (cuda_direct_memory.cc): out (=|+=) the fp32 sum of the
// node's slices, read in place from the peers' mapped regions, in slice order — the adds of
// comm/direct_reduce_scatter.cc's HostReduceSlices in the same order (--fmad=false), so the
// device and host direct paths agree bit for bit.
#include "sshsdp/backend/cuda_common.cuh"
#include "sshsdp/backend/cuda_kernels_internal.h"

namespace sshsdp::cuda {
namespace {

__global__ void ReduceSlicesKernel(SliceArgs a, int m, bool src_bf16, void* out, bool out_bf16,
                                   int64_t n, bool accumulate) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    auto load = [&](int j) {
      return src_bf16 ? Bf16BitsToFloat(static_cast<const uint16_t*>(a.src[j])[i])
                      : static_cast<const float*>(a.src[j])[i];
    };
    float sum = load(0);
    for (int j = 1; j < m; ++j) sum += load(j);
    if (out_bf16) {
      uint16_t* o = static_cast<uint16_t*>(out);
      o[i] = FloatToBf16Bits(accumulate ? Bf16BitsToFloat(o[i]) + sum : sum);
    } else {
      float* o = static_cast<float*>(out);
      o[i] = accumulate ? o[i] + sum : sum;
    }
  }
}

}  // namespace

cudaError_t LaunchReduceSlices(const SliceArgs& a, int m, bool src_bf16, void* out, bool out_bf16,
                               int64_t n, bool accumulate, cudaStream_t s) {
  SSHSDP_LAUNCH(ReduceSlicesKernel, GridFor(n), kThreads, 0, s)
  (a, m, src_bf16, out, out_bf16, n, accumulate);
  return cudaGetLastError();
}

}  // namespace sshsdp::cuda
