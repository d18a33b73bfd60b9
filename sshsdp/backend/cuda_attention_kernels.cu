// The CUDA backend's causal attention over the packed QKV activation [B·T, 3d]
// (kernels/attention.h's layout and contract): FlashAttention-2's tiling in fp32 on the CUDA
// cores. No [T, T] matrix exists anywhere, shared memory holds tiles only (so T is bounded by
// the grid, not by shared memory), and tiles above the causal diagonal are never computed.
//
// - Forward: one block per (query tile, head, sequence). Key tiles stream through shared
//   memory; each query row keeps its running max m, sum l and output in registers, rescaled by
//   exp(m_old − m_new) per tile (the online softmax), and lse = m + log l is kept for the
//   backward.
// - Backward: two kernels, no atomics, so the result does not depend on scheduling. The query
//   kernel computes D = rowsum(dO ⊙ O) for its rows, recomputes P = exp(S − lse) tile by tile
//   and accumulates dQ = dS·K; the key kernel, one block per key tile, walks the query tiles at
//   or below the diagonal and accumulates dV = Pᵀ·dO and dK = dSᵀ·Q.
//   dS = P ⊙ (dP − D) · scale, as kernels/attention.cc forms it.
//
// Threads own whole rows of a tile's output (threads_per_row consecutive threads per row, each
// with up to kAttnCols columns in registers), so head widths up to kMaxAttentionHeadDim take
// smaller tiles; every tile fits the default 48 KiB of dynamic shared memory. Rows of shared
// tiles are padded to an odd stride so a column read by consecutive rows spreads over the
// banks. Compiled with --fmad=false like the other kernel files; the sums run in tile order,
// not the CPU kernel's, and backend/backend_test.cc holds the results to the CPU backend's
// within its stated tolerance. Not on tensor cores (fp32 products, as the CPU reference).
#include "sshsdp/backend/cuda_common.cuh"
#include "sshsdp/backend/cuda_kernels_internal.h"

namespace sshsdp::cuda {
namespace {

constexpr int kAttnThreads = 256;
constexpr int kAttnCols = 16;  // most output columns one thread accumulates

// Query rows per forward block (keys per tile: at most 32) and rows = keys per backward tile,
// by head width: threads_per_row = kAttnThreads / rows, columns per thread ≤ kAttnCols.
constexpr int ForwardRows(int dh) { return dh <= 64 ? 64 : dh <= 128 ? 32 : 16; }
constexpr int ForwardKeys(int dh) { return ForwardRows(dh) < 32 ? ForwardRows(dh) : 32; }
constexpr int BackwardRows(int dh) { return dh <= 64 ? 32 : dh <= 128 ? 16 : 8; }
// The widest head of each tile shape fits a thread's registers.
constexpr bool ColumnsFit(int rows, int dh) {
  return (dh + kAttnThreads / rows - 1) / (kAttnThreads / rows) <= kAttnCols;
}
static_assert(ColumnsFit(ForwardRows(64), 64) && ColumnsFit(ForwardRows(128), 128) &&
                  ColumnsFit(ForwardRows(kMaxAttentionHeadDim), kMaxAttentionHeadDim),
              "forward tiles");
static_assert(ColumnsFit(BackwardRows(64), 64) && ColumnsFit(BackwardRows(128), 128) &&
                  ColumnsFit(BackwardRows(kMaxAttentionHeadDim), kMaxAttentionHeadDim),
              "backward tiles");

// Shared row stride for width n: odd.
__host__ __device__ __forceinline__ int Pad(int n) { return n | 1; }

// sh[r][0, dh) = src row (r0 + r) for r < n, zeros for rows at or past T; src rows are
// `stride` floats apart.
__device__ void LoadRows(const float* src, int64_t stride, int r0, int n, int T, int dh, float* sh,
                         int ld) {
  for (int e = threadIdx.x; e < n * dh; e += blockDim.x) {
    const int r = e / dh, c = e % dh;
    sh[r * ld + c] = r0 + r < T ? src[(r0 + r) * stride + c] : 0.0f;
  }
}

__device__ __forceinline__ float Dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// Forward over queries [q0, q0 + Br) of head h of sequence b, keys in tiles of Bc.
__global__ void FlashForwardKernel(const float* qkv, float* out, float* lse, int T, int H, int dh,
                                   float scale, int Br, int Bc) {
  SSHSDP_DYNAMIC_SHARED(float, sh);
  const int ld = Pad(dh), lds = Bc + 1;
  float* Qs = sh;             // [Br][ld]
  float* KVs = Qs + Br * ld;  // [Bc][ld]: K, then V
  float* S = KVs + Bc * ld;   // [Br][lds]: scores, then probabilities
  const int h = blockIdx.y, b = blockIdx.z, d = H * dh, q0 = blockIdx.x * Br;
  const int64_t ld3 = int64_t{3} * d;
  const float* base = qkv + int64_t{b} * T * ld3 + h * dh;
  const int tpr = blockDim.x / Br, r = threadIdx.x / tpr, lane = threadIdx.x % tpr;
  LoadRows(base, ld3, q0, Br, T, dh, Qs, ld);
  float m = -INFINITY, l = 0.0f, acc[kAttnCols];
  for (int u = 0; u < kAttnCols; ++u) acc[u] = 0.0f;
  const int last = (q0 + Br < T ? q0 + Br : T) - 1;  // the last query, so the last key
  for (int k0 = 0; k0 <= last; k0 += Bc) {
    __syncthreads();  // the previous tile's P·V is done with KVs and S
    LoadRows(base + d, ld3, k0, Bc, T, dh, KVs, ld);
    __syncthreads();
    for (int e = threadIdx.x; e < Br * Bc; e += blockDim.x) {
      const int i = e / Bc, j = e % Bc;
      const bool live = k0 + j <= q0 + i && k0 + j < T;
      S[i * lds + j] = live ? Dot(Qs + i * ld, KVs + j * ld, dh) * scale : -INFINITY;
    }
    __syncthreads();
    LoadRows(base + 2 * d, ld3, k0, Bc, T, dh, KVs, ld);  // V (K is done)
    float mt = m;
    for (int j = 0; j < Bc; ++j) mt = S[r * lds + j] > mt ? S[r * lds + j] : mt;
    __syncthreads();  // every thread of the row has read the scores
    // Key 0 is live for every row, so m is finite from the first tile on.
    for (int j = lane; j < Bc; j += tpr) S[r * lds + j] = expf(S[r * lds + j] - mt);
    __syncthreads();
    float lt = 0.0f;
    for (int j = 0; j < Bc; ++j) lt += S[r * lds + j];
    const float alpha = m == -INFINITY ? 0.0f : expf(m - mt);
    l = l * alpha + lt;
    m = mt;
    for (int u = 0; u < kAttnCols; ++u) {
      const int c = lane + u * tpr;
      if (c >= dh) break;
      float a = acc[u] * alpha;
      for (int j = 0; j < Bc; ++j) a += S[r * lds + j] * KVs[j * ld + c];
      acc[u] = a;
    }
  }
  const int t = q0 + r;
  if (t >= T) return;
  float* o = out + (int64_t{b} * T + t) * d + h * dh;
  const float inv = 1.0f / l;
  for (int u = 0; u < kAttnCols; ++u) {
    const int c = lane + u * tpr;
    if (c >= dh) break;
    o[c] = acc[u] * inv;
  }
  if (lane == 0) lse[(int64_t{b} * H + h) * T + t] = m + logf(l);
}

// The shared layout both backward kernels use, tiles of n rows (queries and keys alike).
struct BackwardTiles {
  float *Qs, *dOs, *Ks, *Vs, *P, *dS, *rowL, *rowD;
  int ld, lds;
  __device__ BackwardTiles(float* sh, int dh, int n) : ld(Pad(dh)), lds(n + 1) {
    Qs = sh;
    dOs = Qs + n * ld;
    Ks = dOs + n * ld;
    Vs = Ks + n * ld;
    P = Vs + n * ld;
    dS = P + n * lds;
    rowL = dS + n * lds;
    rowD = rowL + n;
  }
};
__host__ __device__ __forceinline__ size_t BackwardSharedBytes(int dh, int n) {
  return sizeof(float) * (size_t{4} * n * Pad(dh) + size_t{2} * n * (n + 1) + size_t{2} * n);
}

// The block's (head h, sequence b) plane: its rows of qkv (q at column 0, k at d, v at 2d; rows
// ld3 apart) and of dO, and where its T values of lse and D start.
struct Plane {
  int h, b, d;
  int64_t ld3, at;
  const float *qkv, *dout;
  __device__ Plane(const float* qkv_all, const float* dout_all, int T, int H, int dh)
      : h(blockIdx.y),
        b(blockIdx.z),
        d(H * dh),
        ld3(int64_t{3} * d),
        at((int64_t{b} * H + h) * T),
        qkv(qkv_all + int64_t{b} * T * ld3 + h * dh),
        dout(dout_all + int64_t{b} * T * d + h * dh) {}
};

// Loads the query tile [q0, q0 + n) (Q, dO, lse, D; zeros past T) into the shared tiles.
__device__ void LoadQueryTile(const BackwardTiles& s, const float* base, const float* dout_base,
                              const float* lse_row, const float* D_row, int q0, int n, int T, int d,
                              int dh) {
  LoadRows(base, int64_t{3} * d, q0, n, T, dh, s.Qs, s.ld);
  LoadRows(dout_base, d, q0, n, T, dh, s.dOs, s.ld);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    s.rowL[i] = q0 + i < T ? lse_row[q0 + i] : 0.0f;
    s.rowD[i] = q0 + i < T && D_row ? D_row[q0 + i] : 0.0f;
  }
}

// P and dS of the tile (queries q0 + i, keys k0 + j), 0 where masked or past T.
__device__ void TileGradients(const BackwardTiles& s, int q0, int k0, int n, int T, int dh,
                              float scale) {
  for (int e = threadIdx.x; e < n * n; e += blockDim.x) {
    const int i = e / n, j = e % n;
    float p = 0.0f, g = 0.0f;
    if (k0 + j <= q0 + i && q0 + i < T) {
      const float sc = Dot(s.Qs + i * s.ld, s.Ks + j * s.ld, dh) * scale;
      const float dp = Dot(s.dOs + i * s.ld, s.Vs + j * s.ld, dh);
      p = expf(sc - s.rowL[i]);
      g = p * (dp - s.rowD[i]) * scale;
    }
    s.P[i * s.lds + j] = p;
    s.dS[i * s.lds + j] = g;
  }
}

// dQ for queries [q0, q0 + n) of head h of sequence b; writes D = rowsum(dO ⊙ O) for the key
// kernel.
__global__ void FlashBackwardQueryKernel(const float* dout, const float* qkv, const float* out,
                                         const float* lse, float* dqkv, float* Dbuf, int T, int H,
                                         int dh, float scale, int n) {
  SSHSDP_DYNAMIC_SHARED(float, sh);
  const BackwardTiles s(sh, dh, n);
  const Plane p(qkv, dout, T, H, dh);
  const int q0 = blockIdx.x * n;
  const int tpr = blockDim.x / n, r = threadIdx.x / tpr, lane = threadIdx.x % tpr;
  LoadQueryTile(s, p.qkv, p.dout, lse + p.at, nullptr, q0, n, T, p.d, dh);
  __syncthreads();
  for (int i = threadIdx.x; i < n && q0 + i < T; i += blockDim.x) {
    const float* o = out + (int64_t{p.b} * T + q0 + i) * p.d + p.h * dh;
    float D = 0.0f;
    for (int c = 0; c < dh; ++c) D += s.dOs[i * s.ld + c] * o[c];
    s.rowD[i] = D;
    Dbuf[p.at + q0 + i] = D;
  }
  float acc[kAttnCols];
  for (int u = 0; u < kAttnCols; ++u) acc[u] = 0.0f;
  const int last = (q0 + n < T ? q0 + n : T) - 1;
  for (int k0 = 0; k0 <= last; k0 += n) {
    __syncthreads();  // rowD is written; the previous tile's dS·K is done
    LoadRows(p.qkv + p.d, p.ld3, k0, n, T, dh, s.Ks, s.ld);
    LoadRows(p.qkv + 2 * p.d, p.ld3, k0, n, T, dh, s.Vs, s.ld);
    __syncthreads();
    TileGradients(s, q0, k0, n, T, dh, scale);
    __syncthreads();
    for (int u = 0; u < kAttnCols; ++u) {
      const int c = lane + u * tpr;
      if (c >= dh) break;
      float a = acc[u];
      for (int j = 0; j < n; ++j) a += s.dS[r * s.lds + j] * s.Ks[j * s.ld + c];
      acc[u] = a;
    }
  }
  if (q0 + r >= T) return;
  float* dq = dqkv + (int64_t{p.b} * T + q0 + r) * p.ld3 + p.h * dh;
  for (int u = 0; u < kAttnCols; ++u) {
    const int c = lane + u * tpr;
    if (c >= dh) break;
    dq[c] = acc[u];
  }
}

// dK and dV for keys [k0, k0 + n) of head h of sequence b, over the queries at or after them.
__global__ void FlashBackwardKeyKernel(const float* dout, const float* qkv, const float* lse,
                                       const float* Dbuf, float* dqkv, int T, int H, int dh,
                                       float scale, int n) {
  SSHSDP_DYNAMIC_SHARED(float, sh);
  const BackwardTiles s(sh, dh, n);
  const Plane p(qkv, dout, T, H, dh);
  const int k0 = blockIdx.x * n;
  const int tpk = blockDim.x / n, j = threadIdx.x / tpk, lane = threadIdx.x % tpk;
  LoadRows(p.qkv + p.d, p.ld3, k0, n, T, dh, s.Ks, s.ld);
  LoadRows(p.qkv + 2 * p.d, p.ld3, k0, n, T, dh, s.Vs, s.ld);
  float acc_k[kAttnCols], acc_v[kAttnCols];
  for (int u = 0; u < kAttnCols; ++u) acc_k[u] = acc_v[u] = 0.0f;
  for (int q0 = k0; q0 < T; q0 += n) {  // tiles are aligned: the diagonal tile starts at k0
    __syncthreads();                    // K, V are loaded; the previous tile's sums are done
    LoadQueryTile(s, p.qkv, p.dout, lse + p.at, Dbuf + p.at, q0, n, T, p.d, dh);
    __syncthreads();
    TileGradients(s, q0, k0, n, T, dh, scale);
    __syncthreads();
    for (int u = 0; u < kAttnCols; ++u) {
      const int c = lane + u * tpk;
      if (c >= dh) break;
      float ak = acc_k[u], av = acc_v[u];
      for (int i = 0; i < n; ++i) {
        ak += s.dS[i * s.lds + j] * s.Qs[i * s.ld + c];
        av += s.P[i * s.lds + j] * s.dOs[i * s.ld + c];
      }
      acc_k[u] = ak;
      acc_v[u] = av;
    }
  }
  if (k0 + j >= T) return;
  float* dk = dqkv + (int64_t{p.b} * T + k0 + j) * p.ld3 + p.d + p.h * dh;
  float* dv = dk + p.d;
  for (int u = 0; u < kAttnCols; ++u) {
    const int c = lane + u * tpk;
    if (c >= dh) break;
    dk[c] = acc_k[u];
    dv[c] = acc_v[u];
  }
}

dim3 AttentionGrid(int B, int T, int H, int rows) {
  return dim3(static_cast<unsigned>((T + rows - 1) / rows), static_cast<unsigned>(H),
              static_cast<unsigned>(B));
}

}  // namespace

cudaError_t LaunchAttentionForward(const float* qkv, float* out, float* lse, int B, int T, int H,
                                   int dh, float scale, cudaStream_t s) {
  const int Br = ForwardRows(dh), Bc = ForwardKeys(dh);
  const size_t shared =
      sizeof(float) * (static_cast<size_t>(Br + Bc) * Pad(dh) + static_cast<size_t>(Br) * (Bc + 1));
  SSHSDP_LAUNCH(FlashForwardKernel, AttentionGrid(B, T, H, Br), kAttnThreads, shared, s)
  (qkv, out, lse, T, H, dh, scale, Br, Bc);
  return cudaGetLastError();
}

cudaError_t LaunchAttentionBackward(const float* dout, const float* qkv, const float* out,
                                    const float* lse, float* dqkv, float* D, int B, int T, int H,
                                    int dh, float scale, cudaStream_t s) {
  const int n = BackwardRows(dh);
  const dim3 grid = AttentionGrid(B, T, H, n);
  const size_t shared = BackwardSharedBytes(dh, n);
  SSHSDP_LAUNCH(FlashBackwardQueryKernel, grid, kAttnThreads, shared, s)
  (dout, qkv, out, lse, dqkv, D, T, H, dh, scale, n);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  SSHSDP_LAUNCH(FlashBackwardKeyKernel, grid, kAttnThreads, shared, s)
  (dout, qkv, lse, D, dqkv, T, H, dh, scale, n);
  return cudaGetLastError();
}

}  // namespace sshsdp::cuda
