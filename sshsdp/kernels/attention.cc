// Fused causal attention (see attention.h): per query block one batched score product over
// every (sequence, head) of a chunk, the row softmax in vectorised loops, one batched product
// with V; the backward recomputes the block's probabilities from the saved log-sum-exp.
//
// Scratch: two score-sized buffers [nb, H, block, T] (scores / probabilities, and their
// gradient) for a chunk of nb sequences, capped at kChunkFloats each, then D = rowsum(dO ⊙ O)
// [B, H, T] for the backward; with bf16 rounding (the bf16 attention's widened path) also
// the chunk's rounded qkv [nb·T, 3d] and dout [nb·T, d].
#include "sshsdp/kernels/attention.h"

#include <algorithm>
#include <cmath>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/attention_internal.h"
#include "sshsdp/kernels/elementwise.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/kernels/parallel.h"
#include "sshsdp/kernels/vec_math.h"

namespace sshsdp::kernels {
namespace attention_internal {
namespace {

// Scores of one chunk and block at most this many floats (16 MiB), unless one sequence
// alone needs more.
constexpr int64_t kChunkFloats = int64_t{1} << 22;

// Sequences per chunk for this shape.
int64_t ChunkSequences(int B, int T, int H, int block) {
  const int64_t per_sequence = static_cast<int64_t>(H) * std::min(block, T) * T;
  if (per_sequence == 0) return std::max(B, 1);
  return std::clamp<int64_t>(kChunkFloats / per_sequence, 1, std::max(B, 1));
}

}  // namespace

void CheckShape(const char* what, int B, int T, int H, int dh, int block) {
  SSHSDP_CHECK(B >= 0 && T >= 0 && H >= 0 && dh >= 0 && block > 0, NumericsError,
               "{}: invalid shape B={} T={} H={} dh={} block={}", what, B, T, H, dh, block);
}

#define SSHSDP_ATT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace {

// Row softmax over the first `valid` of `width` scores, in place (rounded through bf16 when
// round_bf16); the rest become exactly 0. Returns the log of the denominator relative to the
// row's scores: lse = max + log Σ e^(s−max).
SSHSDP_ATT_CLONES float SoftmaxRow(float* row, int64_t valid, int64_t width, bool round_bf16) {
  const float mx = MaxVec(row, valid);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t u = 0; u < valid; ++u) {
    const float e = ExpVec(row[u] - mx);
    row[u] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
  if (round_bf16) {
#pragma omp simd
    for (int64_t u = 0; u < valid; ++u) row[u] = RoundBf16Vec(row[u] * inv);
  } else {
#pragma omp simd
    for (int64_t u = 0; u < valid; ++u) row[u] *= inv;
  }
  for (int64_t u = valid; u < width; ++u) row[u] = 0.0f;
  return mx + std::log(sum);
}

// Probabilities recomputed from scores and the saved log-sum-exp: p = e^(s − lse) on the first
// `valid` entries, exactly 0 on the rest.
SSHSDP_ATT_CLONES void ProbabilitiesRow(float* row, int64_t valid, int64_t width, float lse) {
#pragma omp simd
  for (int64_t u = 0; u < valid; ++u) row[u] = ExpVec(row[u] - lse);
  for (int64_t u = valid; u < width; ++u) row[u] = 0.0f;
}

// dS = P ⊙ (dP − D) · scale, in place on dP (0 wherever P is 0); with round_bf16 dS and then
// P are rounded through bf16 in place, for the products that read them.
SSHSDP_ATT_CLONES void ScoreGradientRow(float* p, float* dp, int64_t width, float D, float scale,
                                        bool round_bf16) {
  if (round_bf16) {
#pragma omp simd
    for (int64_t u = 0; u < width; ++u) {
      dp[u] = RoundBf16Vec(p[u] * (dp[u] - D) * scale);
      p[u] = RoundBf16Vec(p[u]);
    }
    return;
  }
#pragma omp simd
  for (int64_t u = 0; u < width; ++u) dp[u] = p[u] * (dp[u] - D) * scale;
}

}  // namespace

SSHSDP_ATT_CLONES float Dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

namespace {

// One query block of one chunk: rows [q0, q0 + nr) of sequences [b0, b0 + nb).
struct Block {
  int64_t b0, nb, q0, nr, e;  // e = q0 + nr keys
};

// S[o, h] = scale · Q[o, h, q0 : q0+nr] · K[o, h, 0 : e]ᵀ, dense [nb, H, nr, e]; `base` is
// the chunk's first qkv row.
void Scores(const float* base, const Block& k, int T, int H, int dh, float scale, float* s) {
  const int64_t d = static_cast<int64_t>(H) * dh, d3 = 3 * d;
  GemmBatchedStrided(false, true, k.nb, H, k.nr, k.e, dh, base + k.q0 * d3, d3, {T * d3, dh},
                     base + d, d3, {T * d3, dh}, s, k.e, {H * k.nr * k.e, k.nr * k.e}, false,
                     scale);
}

// f(plane) for every (sequence, head) plane o·H + h of the block's chunk, planes spread over
// the kernel threads when each gets 4K scores or more.
template <typename F>
void ForPlanes(const Block& k, int H, F&& f) {
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(k.nr * k.e, 1));
  ParallelFor(k.nb * H, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t plane = p0; plane < p1; ++plane) f(plane);
  });
}

// The chunk's operands as the products read them: qkv itself, or its rows [b0·T, (b0+nb)·T)
// rounded through bf16 into `copy` (indexed from the chunk's first row).
const float* ChunkOperand(const float* x, int64_t row_floats, const Block& k, int T,
                          bool round_bf16, float* copy) {
  const float* rows = x + k.b0 * T * row_floats;
  if (!round_bf16) return rows;
  RoundThroughBf16(rows, copy, k.nb * T * row_floats);
  return copy;
}

}  // namespace

int64_t ChunkedScratchFloats(int B, int T, int H, int dh, int block, bool round_bf16) {
  CheckShape("AttentionScratchFloats", B, T, H, dh, block);
  const int64_t sequences = ChunkSequences(B, T, H, block);
  const int64_t chunk = sequences * H * std::min(block, T) * T;
  const int64_t copies = round_bf16 ? sequences * T * 4 * int64_t{H} * dh : 0;
  return 2 * chunk + static_cast<int64_t>(B) * H * T + copies;
}

void ChunkedForward(const float* qkv, float* out, float* lse, float* scratch, int B, int T, int H,
                    int dh, int block, bool round_bf16) {
  CheckShape("CausalAttentionForward", B, T, H, dh, block);
  const int64_t d = static_cast<int64_t>(H) * dh, d3 = 3 * d;
  const float scale = dh > 0 ? 1.0f / std::sqrt(static_cast<float>(dh)) : 1.0f;
  const int64_t chunk = ChunkSequences(B, T, H, block);
  const int64_t chunk_floats = chunk * H * std::min(block, T) * T;
  float* s = scratch;
  float* rounded_qkv = scratch + 2 * chunk_floats + static_cast<int64_t>(B) * H * T;
  for (int64_t b0 = 0; b0 < B; b0 += chunk) {
    const Block whole{b0, std::min<int64_t>(chunk, B - b0), 0, 0, 0};
    const float* base = ChunkOperand(qkv, d3, whole, T, round_bf16, rounded_qkv);
    for (int64_t q0 = 0; q0 < T; q0 += block) {
      const int64_t nr = std::min<int64_t>(block, T - q0);
      const Block k{b0, whole.nb, q0, nr, q0 + nr};
      Scores(base, k, T, H, dh, scale, s);
      ForPlanes(k, H, [&](int64_t plane) {
        for (int64_t r = 0; r < nr; ++r) {
          float* row = s + (plane * nr + r) * k.e;
          lse[(b0 * H + plane) * T + q0 + r] = SoftmaxRow(row, q0 + r + 1, k.e, round_bf16);
        }
      });
      GemmBatchedStrided(false, false, k.nb, H, nr, dh, k.e, s, k.e, {H * nr * k.e, nr * k.e},
                         base + 2 * d, d3, {T * d3, dh}, out + (b0 * T + q0) * d, d, {T * d, dh},
                         false);
    }
  }
}

void ChunkedBackward(const float* dout, const float* qkv, const float* out, const float* lse,
                     float* dqkv, float* scratch, int B, int T, int H, int dh, int block,
                     bool round_bf16) {
  CheckShape("CausalAttentionBackward", B, T, H, dh, block);
  const int64_t d = static_cast<int64_t>(H) * dh, d3 = 3 * d;
  const float scale = dh > 0 ? 1.0f / std::sqrt(static_cast<float>(dh)) : 1.0f;
  const int64_t chunk = ChunkSequences(B, T, H, block);
  const int64_t chunk_floats = chunk * H * std::min(block, T) * T;
  float* p = scratch;
  float* dp = scratch + chunk_floats;
  float* D = scratch + 2 * chunk_floats;  // [B, H, T]: rowsum(dO ⊙ O) = rowsum(P ⊙ dP)
  float* rounded_qkv = D + static_cast<int64_t>(B) * H * T;
  float* rounded_dout = rounded_qkv + chunk * T * d3;
  ParallelFor(static_cast<int64_t>(B) * T, std::max<int64_t>(1, 4096 / std::max<int64_t>(d, 1)),
              [&](int64_t i0, int64_t i1) {
                for (int64_t i = i0; i < i1; ++i) {
                  const int64_t b = i / T, t = i % T, at = i * d;
                  for (int64_t h = 0; h < H; ++h) {
                    D[(b * H + h) * T + t] = Dot(dout + at + h * dh, out + at + h * dh, dh);
                  }
                }
              });
  // The last query block meets every key: it writes dK and dV, earlier blocks add to them.
  const int64_t last_q0 = T > 0 ? (T - 1) / block * block : 0;
  for (int64_t b0 = 0; b0 < B; b0 += chunk) {
    const Block whole{b0, std::min<int64_t>(chunk, B - b0), 0, 0, 0};
    const float* base = ChunkOperand(qkv, d3, whole, T, round_bf16, rounded_qkv);
    const float* gout = ChunkOperand(dout, d, whole, T, round_bf16, rounded_dout);
    float* dbase = dqkv + b0 * T * d3;
    for (int64_t q0 = last_q0; q0 >= 0 && T > 0; q0 -= block) {
      const int64_t nr = std::min<int64_t>(block, T - q0);
      const Block k{b0, whole.nb, q0, nr, q0 + nr};
      const bool acc = q0 != last_q0;
      const GridStrides sp{H * nr * k.e, nr * k.e}, sqkv{T * d3, dh}, so{T * d, dh};
      const float* go = gout + q0 * d;
      Scores(base, k, T, H, dh, scale, p);
      ForPlanes(k, H, [&](int64_t plane) {
        for (int64_t r = 0; r < nr; ++r) {
          ProbabilitiesRow(p + (plane * nr + r) * k.e, q0 + r + 1, k.e,
                           lse[(b0 * H + plane) * T + q0 + r]);
        }
      });
      // dP = dO · V[0:e]ᵀ, then dS from the fp32 probabilities; only then are P and dS
      // rounded (bf16) for the products that read them.
      GemmBatchedStrided(false, true, k.nb, H, nr, k.e, dh, go, d, so, base + 2 * d, d3, sqkv, dp,
                         k.e, sp, false);
      ForPlanes(k, H, [&](int64_t plane) {
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t at = (plane * nr + r) * k.e;
          ScoreGradientRow(p + at, dp + at, k.e, D[(b0 * H + plane) * T + q0 + r], scale,
                           round_bf16);
        }
      });
      // dV[0:e] (+)= Pᵀ · dO, dQ[q0:q0+nr] = dS · K[0:e], dK[0:e] (+)= dSᵀ · Q[q0:q0+nr].
      GemmBatchedStrided(true, false, k.nb, H, k.e, dh, nr, p, k.e, sp, go, d, so, dbase + 2 * d,
                         d3, sqkv, acc);
      GemmBatchedStrided(false, false, k.nb, H, nr, dh, k.e, dp, k.e, sp, base + d, d3, sqkv,
                         dbase + q0 * d3, d3, sqkv, false);
      GemmBatchedStrided(true, false, k.nb, H, k.e, dh, nr, dp, k.e, sp, base + q0 * d3, d3, sqkv,
                         dbase + d, d3, sqkv, acc);
    }
  }
}

}  // namespace attention_internal

int64_t AttentionScratchFloats(int B, int T, int H, int block) {
  return attention_internal::ChunkedScratchFloats(B, T, H, 0, block, false);
}

void CausalAttentionForward(const float* qkv, float* out, float* lse, float* scratch, int B, int T,
                            int H, int dh, int block) {
  attention_internal::ChunkedForward(qkv, out, lse, scratch, B, T, H, dh, block, false);
}

void CausalAttentionBackward(const float* dout, const float* qkv, const float* out,
                             const float* lse, float* dqkv, float* scratch, int B, int T, int H,
                             int dh, int block) {
  attention_internal::ChunkedBackward(dout, qkv, out, lse, dqkv, scratch, B, T, H, dh, block,
                                      false);
}

}  // namespace sshsdp::kernels
