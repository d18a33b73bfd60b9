// The attention the models ran before the fused kernel (attention.h), kept as its oracle:
// per (batch, head) one strided fp32 GEMM for the whole T×T score matrix, the causal
// softmax in scalar loops with libm's expf, the probabilities materialised [B, H, T, T] and
// read back by the backward. Straightforward on purpose; tests only.
//
//   testing::ReferenceAttentionForward(qkv, att, out, B, T, H, dh);
//   testing::ReferenceAttentionBackward(dout, qkv, att, dqkv, dp, B, T, H, dh);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "sshsdp/kernels/matmul.h"

namespace sshsdp::kernels::testing {

// ---- Causal multi-head attention over packed qkv rows [q (d) | k (d) | v (d)]. ----
// Per (batch, head), with Q, K, V the head's [T, dh] column blocks of qkv (row stride 3d):
//   S = Q·Kᵀ/√dh (fp32 GEMM), P = causal softmax(S) (fp32 loops), O = P·V.
// The GEMMs compute the full T×T product; the masked upper triangle of P is zero, so the
// products that use P are exact. Attention always runs in fp32, whatever the weight dtype.

inline void ReferenceAttentionForward(const float* qkv, float* att, float* out, int B, int T, int H,
                                      int dh) {
  const int64_t d = static_cast<int64_t>(H) * dh, d3 = 3 * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  for (int b = 0; b < B; ++b) {
    const float* base = qkv + static_cast<int64_t>(b) * T * d3;
    for (int h = 0; h < H; ++h) {
      const float* q = base + h * dh;
      const float* k = base + d + h * dh;
      const float* v = base + 2 * d + h * dh;
      float* p = att + (static_cast<int64_t>(b) * H + h) * T * T;
      GemmStrided(false, true, T, T, dh, q, d3, k, d3, DType::kF32, p, T, DType::kF32, false,
                  scale);
      for (int t = 0; t < T; ++t) {
        float* row = p + static_cast<int64_t>(t) * T;
        float mx = row[0];
        for (int u = 1; u <= t; ++u) mx = std::max(mx, row[u]);
        float sum = 0.0f;
        for (int u = 0; u <= t; ++u) {
          row[u] = std::exp(row[u] - mx);
          sum += row[u];
        }
        const float inv = 1.0f / sum;
        for (int u = 0; u <= t; ++u) row[u] *= inv;
        for (int u = t + 1; u < T; ++u) row[u] = 0.0f;
      }
      GemmStrided(false, false, T, dh, T, p, T, v, d3, DType::kF32,
                  out + static_cast<int64_t>(b) * T * d + h * dh, d, DType::kF32, false);
    }
  }
}

// dqkv is overwritten (every head's Q, K and V block is written by one GEMM each).
// dp is a [T, T] scratch.
inline void ReferenceAttentionBackward(const float* dout, const float* qkv, const float* att,
                                       float* dqkv, float* dp, int B, int T, int H, int dh) {
  const int64_t d = static_cast<int64_t>(H) * dh, d3 = 3 * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  for (int b = 0; b < B; ++b) {
    const float* base = qkv + static_cast<int64_t>(b) * T * d3;
    float* dbase = dqkv + static_cast<int64_t>(b) * T * d3;
    const float* go = dout + static_cast<int64_t>(b) * T * d;
    for (int h = 0; h < H; ++h) {
      const float* q = base + h * dh;
      const float* k = base + d + h * dh;
      const float* v = base + 2 * d + h * dh;
      const float* p = att + (static_cast<int64_t>(b) * H + h) * T * T;
      const float* goh = go + h * dh;
      // dV = Pᵀ·dO, dP = dO·Vᵀ.
      GemmStrided(true, false, T, dh, T, p, T, goh, d, DType::kF32, dbase + 2 * d + h * dh, d3,
                  DType::kF32, false);
      GemmStrided(false, true, T, T, dh, goh, d, v, d3, DType::kF32, dp, T, DType::kF32, false);
      // dS = P ⊙ (dP − rowsum(P ⊙ dP)) / √dh (zero above the diagonal, where P is).
      for (int t = 0; t < T; ++t) {
        const float* pr = p + static_cast<int64_t>(t) * T;
        float* dr = dp + static_cast<int64_t>(t) * T;
        float pdp = 0.0f;
#pragma omp simd reduction(+ : pdp)
        for (int u = 0; u <= t; ++u) pdp += pr[u] * dr[u];
#pragma omp simd
        for (int u = 0; u <= t; ++u) dr[u] = pr[u] * (dr[u] - pdp) * scale;
        for (int u = t + 1; u < T; ++u) dr[u] = 0.0f;
      }
      // dQ = dS·K, dK = dSᵀ·Q.
      GemmStrided(false, false, T, dh, T, dp, T, k, d3, DType::kF32, dbase + h * dh, d3,
                  DType::kF32, false);
      GemmStrided(true, false, T, dh, T, dp, T, q, d3, DType::kF32, dbase + d + h * dh, d3,
                  DType::kF32, false);
    }
  }
}

}  // namespace sshsdp::kernels::testing
