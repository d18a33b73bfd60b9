// The CUDA backend's optimizer kernels (cuda_kernels_internal.h): AdamW per span and Muon's
// elementwise stages (momentum with the Newton–Schulz input u, and the weight update), one
// thread per element (grid-stride). Compiled with --fmad=false: each applies the fp32
// operations of its update/ function in the same order, so it equals the CPU bit for bit
// (backend/backend_test.cc).
#include "sshsdp/backend/cuda_common.cuh"
#include "sshsdp/backend/cuda_kernels_internal.h"

namespace sshsdp::cuda {
namespace {

// update/adamw.h's AdamWStep on one span, the same operations in the same order.
__global__ void AdamWKernel(float* w, const float* g, float* m, float* v, int64_t n, float b1,
                            float b2, float eps, float step_size, float inv_sqrt_bc2, float decay,
                            float grad_scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float gi = g[i] * grad_scale;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) * inv_sqrt_bc2 + eps;
    w[i] = w[i] * decay - step_size * mi / denom;
  }
}

// update/muon.h's MuonMomentum: u is fp32 (u32) or bf16 bits (round to nearest even).
__global__ void MuonMomentumKernel(const float* grad, float* m, void* u, bool u32, int64_t n,
                                   float mu, bool nesterov, float gs) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float gi = gs * grad[i];
    const float mi = mu * m[i] + gi;
    m[i] = mi;
    const float out = nesterov ? gi + mu * mi : mi;
    if (u32)
      static_cast<float*>(u)[i] = out;
    else
      static_cast<uint16_t*>(u)[i] = FloatToBf16Bits(out);
  }
}

// update/muon.h's MuonWeightUpdate, decay = 1 − lr·wd computed by the caller as the CPU does.
__global__ void MuonWeightUpdateKernel(float* w, const float* v, int64_t n, float decay, float lr) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    w[i] = w[i] * decay - lr * v[i];
}

}  // namespace

cudaError_t LaunchAdamW(float* w, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a,
                        cudaStream_t s) {
  SSHSDP_LAUNCH(AdamWKernel, GridFor(n), kThreads, 0, s)
  (w, g, m, v, n, a.beta1, a.beta2, a.eps, a.step_size, a.inv_sqrt_bc2, a.decay, a.grad_scale);
  return cudaGetLastError();
}

cudaError_t LaunchMuonMomentum(const float* grad, float* m, void* u, bool u_f32, int64_t n,
                               float momentum, bool nesterov, float grad_scale, cudaStream_t s) {
  SSHSDP_LAUNCH(MuonMomentumKernel, GridFor(n), kThreads, 0, s)
  (grad, m, u, u_f32, n, momentum, nesterov, grad_scale);
  return cudaGetLastError();
}

cudaError_t LaunchMuonWeightUpdate(float* w, const float* v, int64_t n, float decay, float lr,
                                   cudaStream_t s) {
  SSHSDP_LAUNCH(MuonWeightUpdateKernel, GridFor(n), kThreads, 0, s)(w, v, n, decay, lr);
  return cudaGetLastError();
}

}  // namespace sshsdp::cuda
