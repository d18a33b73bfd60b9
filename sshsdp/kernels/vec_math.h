// Branch-free fp32 math for vectorised loops: `omp simd` loops calling these compile to
// straight-line AVX2 / AVX-512 code (no libm calls), where a libm expf per element would
// keep the loop scalar. Shared by the activations, the softmax cross-entropy (models layer)
// and the fused attention (attention.cc).
//
//   #pragma omp simd
//   for (int i = 0; i < n; ++i) y[i] = kernels::ExpVec(x[i] - mx);
//
// Build the calling file with -fno-trapping-math so GCC turns the clamps into blends.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace sshsdp::kernels {

// e^x: x clamped to [-87, 88] (normal fp32 results), e^x = 2^n · p(r) with
// n = round(x / ln 2), r = x − n·ln 2 (two-constant Cody–Waite), p the degree-6 Taylor
// polynomial of e^r on |r| <= ln2/2 (relative error < 3e-8), and 2^n written into the
// exponent bits. NaN stays NaN; -inf gives e^-87 (≈ 1.6e-38), not 0 — callers that need an
// exact 0 for masked entries write it themselves.
inline float ExpVec(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);  // std::max(NaN, c) is NaN: NaN stays NaN
  const float kMagic = 12582912.0f;          // 1.5·2^23: adding it rounds to an integer
  const float fn = (x * 1.44269504088896341f + kMagic) - kMagic;
  const float r = (x - fn * 0.693145751953125f) - fn * 1.428606765330187e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(fn) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// x rounded to bf16 (nearest even; NaN stays a quiet NaN) and kept in fp32, as numerics'
// RoundToBf16, branch-free for vectorised loops.
inline float RoundBf16Vec(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) & 0xFFFF0000u;
  const uint32_t quiet_nan = (x & 0xFFFF0000u) | 0x400000u;
  const uint32_t y = (x & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded;
  float r;
  std::memcpy(&r, &y, 4);
  return r;
}

// max of x[0, n), n >= 1, in 16 running maxima a vector each (GCC leaves an `omp simd
// reduction(max)` over std::max a scalar chain, 3 cycles per element). NaN only where x[0]
// is NaN, as a running std::max from x[0] gives; max is exact, so the order changes no result
// (only which of +0 and -0 wins a tie).
inline float MaxVec(const float* x, int64_t n) {
  float m[16];
  for (int j = 0; j < 16; ++j) m[j] = x[0];
  int64_t u = 0;
  for (; u + 16 <= n; u += 16) {
#pragma omp simd
    for (int j = 0; j < 16; ++j) m[j] = x[u + j] > m[j] ? x[u + j] : m[j];
  }
  float r = x[0];
  for (; u < n; ++u) r = x[u] > r ? x[u] : r;
  for (int j = 0; j < 16; ++j) r = m[j] > r ? m[j] : r;
  return r;
}

}  // namespace sshsdp::kernels
