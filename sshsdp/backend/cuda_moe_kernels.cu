// The CUDA backend's MoE kernels (cuda_kernels_internal.h): the router (top-k and scores per
// token, per-expert counts and score sums, the stable counting sort, the router's backward per
// token), the row gather that permutes tokens to their experts, the gated combination that
// un-permutes their outputs, and their backward — one block per destination row, threads over the
// row's d floats, so every output element is written by one thread and the k-term sums run in the
// CPU's order (kernels/moe_kernels.h). Compiled with --fmad=false: GatherRows, MoeCombine and
// MoeUnpermuteSum equal the CPU bit for bit; the dot products of MoeCombineBackward sum in tree
// order, not the CPU's.
#include "sshsdp/backend/cuda_common.cuh"
#include "sshsdp/backend/cuda_kernels_internal.h"

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

// ---- The router (kernels/moe_kernels.h's loops, one token per thread or one expert per
// block). exp and expf are CUDA's (within 1 and 2 ulp), not glibc's: scores may differ from
// the CPU's in their last bit; selection reads the logits, before they are overwritten. ----

// Whether expert e is among sel[0..j).
__device__ __forceinline__ bool Taken(const int32_t* sel, int j, int e) {
  for (int i = 0; i < j; ++i)
    if (sel[i] == e) return true;
  return false;
}

__global__ void TopKKernel(float* score, int64_t N, int E, int k, bool softmax, bool renormalize,
                           int32_t* sel_all, float* gate_all) {
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < N;
       t += int64_t{gridDim.x} * blockDim.x) {
    float* z = score + t * E;
    int32_t* sel = sel_all + t * k;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e)
        if (!Taken(sel, j, e) && (best < 0 || z[e] > z[best])) best = e;
      sel[j] = best;
    }
    if (softmax) {
      float mx = z[0];
      for (int e = 1; e < E; ++e) mx = z[e] > mx ? z[e] : mx;
      double sum = 0.0;
      for (int e = 0; e < E; ++e) sum += exp(static_cast<double>(z[e] - mx));
      for (int e = 0; e < E; ++e)
        z[e] = static_cast<float>(static_cast<double>(expf(z[e] - mx)) / sum);
    } else {
      for (int e = 0; e < E; ++e) z[e] = 1.0f / (1.0f + expf(-z[e]));
    }
    float* gate = gate_all + t * k;
    float s = 0.0f;
    for (int j = 0; j < k; ++j) s += z[sel[j]];
    for (int j = 0; j < k; ++j) gate[j] = renormalize ? z[sel[j]] / s : z[sel[j]];
  }
}

// One block per expert: its assignments and Σ_t q_{t,e}, reduced in shared memory.
__global__ void ExpertStatsKernel(const float* score, const int32_t* sel, int64_t N, int E, int k,
                                  bool softmax, int32_t* count, double* psum) {
  __shared__ double part[kThreads];
  __shared__ int cnt[kThreads];
  const int e = blockIdx.x;
  double p = 0.0;
  int c = 0;
  for (int64_t t = threadIdx.x; t < N; t += blockDim.x) {
    const float* z = score + t * E;
    for (int j = 0; j < k; ++j) c += sel[t * k + j] == e;
    double qsum = 1.0;
    if (!softmax) {
      qsum = 0.0;
      for (int i = 0; i < E; ++i) qsum += z[i];
    }
    p += z[e] / qsum;
  }
  part[threadIdx.x] = p;
  cnt[threadIdx.x] = c;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) {
      part[threadIdx.x] += part[threadIdx.x + w];
      cnt[threadIdx.x] += cnt[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    psum[e] = part[0];
    count[e] = cnt[0];
  }
}

// One block per expert: its assignments in order, kThreads at a time, placed by a block-wide
// prefix sum of the "is mine" flags (stable: the CPU's counting-sort order).
__global__ void PermuteKernel(const int32_t* sel, const int32_t* offsets, int64_t N, int k,
                              int32_t* row, int32_t* token) {
  __shared__ int scan[kThreads];
  const int e = blockIdx.x;
  const int64_t total = N * k;
  int64_t base = offsets[e];
  for (int64_t a0 = 0; a0 < total; a0 += blockDim.x) {
    const int64_t a = a0 + threadIdx.x;
    const int mine = a < total && sel[a] == e;
    scan[threadIdx.x] = mine;
    __syncthreads();
    for (int w = 1; w < static_cast<int>(blockDim.x); w *= 2) {  // inclusive Hillis–Steele scan
      const int v = static_cast<int>(threadIdx.x) >= w ? scan[threadIdx.x - w] : 0;
      __syncthreads();
      scan[threadIdx.x] += v;
      __syncthreads();
    }
    if (mine) {
      const int64_t r = base + scan[threadIdx.x] - 1;
      row[a] = static_cast<int32_t>(r);
      token[r] = static_cast<int32_t>(a / k);
    }
    base += scan[blockDim.x - 1];
    __syncthreads();
  }
}

// ds_e of one token: Σ over its chosen slots j with sel[j] == e of dsel_j (the CPU's ds array,
// whose entries get at most one term each: the k experts are distinct).
__device__ __forceinline__ double SlotGrad(const int32_t* sel, const double* dsel, int k, int e) {
  double d = 0.0;
  for (int j = 0; j < k; ++j)
    if (sel[j] == e) d += dsel[j];
  return d;
}

constexpr int kMaxTopK = 64;

__global__ void RouterBackwardKernel(const float* score, const int32_t* sel_all,
                                     const float* gate_all, const float* frac, const float* dgate,
                                     int64_t N, int E, int k, bool softmax, bool renormalize,
                                     float aux_weight, float* dz_all) {
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < N;
       t += int64_t{gridDim.x} * blockDim.x) {
    const float* s = score + t * E;
    const int32_t* sel = sel_all + t * k;
    const float* gate = gate_all + t * k;
    const float* dg = dgate + t * k;
    double dsel[kMaxTopK];
    if (renormalize) {
      double S = 0.0, dot = 0.0;
      for (int j = 0; j < k; ++j) S += s[sel[j]], dot += static_cast<double>(dg[j]) * gate[j];
      for (int j = 0; j < k; ++j) dsel[j] = 0.0 + (dg[j] - dot) / S;
    } else {
      for (int j = 0; j < k; ++j) dsel[j] = 0.0 + dg[j];
    }
    float* dz = dz_all + t * E;
    auto c_aux = [&](int e) { return aux_weight * E * frac[e] / static_cast<double>(N); };
    if (softmax) {
      double pds = 0.0;
      for (int e = 0; e < E; ++e) pds += s[e] * (SlotGrad(sel, dsel, k, e) + c_aux(e));
      for (int e = 0; e < E; ++e)
        dz[e] = static_cast<float>(s[e] * ((SlotGrad(sel, dsel, k, e) + c_aux(e)) - pds));
    } else {
      double ssum = 0.0, cq = 0.0;
      for (int e = 0; e < E; ++e) ssum += s[e];
      for (int e = 0; e < E; ++e) cq += c_aux(e) * s[e] / ssum;
      for (int e = 0; e < E; ++e) {
        const double ds = SlotGrad(sel, dsel, k, e) + (c_aux(e) - cq) / ssum;
        dz[e] = static_cast<float>(ds * s[e] * (1.0f - s[e]));
      }
    }
  }
}

}  // namespace

cudaError_t LaunchMoeTopK(float* score, int64_t N, int E, int k, bool softmax, bool renormalize,
                          int32_t* sel, float* gate, cudaStream_t s) {
  SSHSDP_LAUNCH(TopKKernel, GridFor(N), kThreads, 0, s)
  (score, N, E, k, softmax, renormalize, sel, gate);
  return cudaGetLastError();
}

cudaError_t LaunchMoeExpertStats(const float* score, const int32_t* sel, int64_t N, int E, int k,
                                 bool softmax, int32_t* count, double* psum, cudaStream_t s) {
  SSHSDP_LAUNCH(ExpertStatsKernel, static_cast<unsigned>(E), kThreads, 0, s)
  (score, sel, N, E, k, softmax, count, psum);
  return cudaGetLastError();
}

cudaError_t LaunchMoePermute(const int32_t* sel, const int32_t* offsets, int64_t N, int E, int k,
                             int32_t* row, int32_t* token, cudaStream_t s) {
  SSHSDP_LAUNCH(PermuteKernel, static_cast<unsigned>(E), kThreads, 0, s)
  (sel, offsets, N, k, row, token);
  return cudaGetLastError();
}

cudaError_t LaunchMoeRouterBackward(const float* score, const int32_t* sel, const float* gate,
                                    const float* frac, const float* dgate, int64_t N, int E, int k,
                                    bool softmax, bool renormalize, float aux_weight, float* dz,
                                    cudaStream_t s) {
  if (k > kMaxTopK) return cudaErrorInvalidValue;
  SSHSDP_LAUNCH(RouterBackwardKernel, GridFor(N), kThreads, 0, s)
  (score, sel, gate, frac, dgate, N, E, k, softmax, renormalize, aux_weight, dz);
  return cudaGetLastError();
}

cudaError_t LaunchGatherRows(const float* src, const int32_t* idx, float* dst, int64_t rows,
                             int64_t d, cudaStream_t s) {
  SSHSDP_LAUNCH(GatherRowsKernel, RowBlocks(rows), kThreads, 0, s)(src, idx, dst, rows, d);
  return cudaGetLastError();
}

cudaError_t LaunchMoeCombine(const float* yp, const int32_t* row, const float* gate, float* out,
                             int64_t N, int k, int64_t d, bool accumulate, cudaStream_t s) {
  SSHSDP_LAUNCH(CombineKernel, RowBlocks(N), kThreads, 0, s)
  (yp, row, gate, out, N, k, d, accumulate);
  return cudaGetLastError();
}

cudaError_t LaunchMoeCombineBackward(const float* dy, const float* yp, const int32_t* row,
                                     const float* gate, float* dgate, float* dyp, int64_t N, int k,
                                     int64_t d, cudaStream_t s) {
  SSHSDP_LAUNCH(CombineBackwardKernel, RowBlocks(N), kThreads, 0, s)
  (dy, yp, row, gate, dgate, dyp, N, k, d);
  return cudaGetLastError();
}

cudaError_t LaunchMoeUnpermuteSum(const float* dxp, const int32_t* row, float* dx, int64_t N, int k,
                                  int64_t d, cudaStream_t s) {
  SSHSDP_LAUNCH(UnpermuteSumKernel, RowBlocks(N), kThreads, 0, s)(dxp, row, dx, N, k, d);
  return cudaGetLastError();
}

}  // namespace sshsdp::cuda
