// Layer kernels of the reference models, on fp32 activations (llm.c-style forward/backward
// pairs; models/layers.h re-exports them as layers::): RMSNorm, GELU (tanh), SwiGLU and the
// softmax cross-entropy. Here, below the model layer, so a device backend (backend/backend.h)
// can offer them as the CPU reference of its own kernels. Rows or elements go to the
// process's kernel threads (parallel.h) with the same bits at any thread count; the
// exponentials are one vectorised polynomial e^x (vec_math.h), built for AVX-512, AVX2 and
// the baseline ISA and picked at load time. Reductions marked `omp simd` are vectorised
// (-fopenmp-simd; no OpenMP runtime).
#include "sshsdp/kernels/layer_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "sshsdp/kernels/elementwise.h"
#include "sshsdp/kernels/parallel.h"
#include "sshsdp/kernels/vec_math.h"

namespace sshsdp::kernels {

#define SSHSDP_ACT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace {

// Items per thread below which a kernel runs on the caller's thread alone (parallel.h).
constexpr int64_t kGrainElements = 16384;
int64_t RowGrain(int64_t d) {
  return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(d, 1));
}

}  // namespace

// ---- RMSNorm: y = x · rstd · g, rstd = 1/sqrt(mean(x²) + eps). ----
// Rows go to threads (ParallelFor); the gain gradient, a sum over rows, goes by
// columns, each summed over the rows in order: the same bits at any thread count.

namespace {

SSHSDP_ACT_CLONES void RmsNormForwardRows(const float* x, const float* g, float* y, float* rstd,
                                          int64_t r0, int64_t r1, int d, float eps) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < d; ++i) ss += xr[i] * xr[i];
    float s = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    rstd[r] = s;
    for (int i = 0; i < d; ++i) yr[i] = xr[i] * s * g[i];
  }
}

// dx rows [r0, r1); with dg non-null also dg += Σ_rows dy·x·rstd over them, rows in order —
// the same products in the same order as GainGradientColumns, so one pass (one thread) and
// two (threads) give the same bits.
SSHSDP_ACT_CLONES void RmsNormBackwardRows(const float* dy, const float* x, const float* g,
                                           const float* rstd, float* dx, float* dg, int64_t r0,
                                           int64_t r1, int d, bool accumulate_dx) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* dyr = dy + r * d;
    const float* xr = x + r * d;
    float* dxr = dx + r * d;
    const float s = rstd[r];
    float dot = 0.0f;  // Σ dy·g·x
#pragma omp simd reduction(+ : dot)
    for (int i = 0; i < d; ++i) dot += dyr[i] * g[i] * xr[i];
    const float c = s * s * dot / static_cast<float>(d);
    for (int i = 0; i < d; ++i) {
      float v = s * (g[i] * dyr[i] - xr[i] * c);
      dxr[i] = accumulate_dx ? dxr[i] + v : v;
    }
    if (dg) {
      for (int i = 0; i < d; ++i) dg[i] += dyr[i] * xr[i] * s;
    }
  }
}

// dg[c0..c1) = Σ_rows dy·x·rstd, rows in order.
SSHSDP_ACT_CLONES void GainGradientColumns(const float* dy, const float* x, const float* rstd,
                                           float* dg, int64_t rows, int d, int64_t c0, int64_t c1) {
  for (int64_t i = c0; i < c1; ++i) dg[i] = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * d;
    const float* xr = x + r * d;
    const float s = rstd[r];
    for (int64_t i = c0; i < c1; ++i) dg[i] += dyr[i] * xr[i] * s;
  }
}

}  // namespace

void RmsNormForward(const float* x, const float* g, float* y, float* rstd, int64_t rows, int d,
                    float eps) {
  ParallelFor(rows, RowGrain(d),
              [&](int64_t r0, int64_t r1) { RmsNormForwardRows(x, g, y, rstd, r0, r1, d, eps); });
}

// dx (+)= ∂/∂x, dg = Σ_rows dy·x·rstd (overwritten).
void RmsNormBackward(const float* dy, const float* x, const float* g, const float* rstd, float* dx,
                     float* dg, int64_t rows, int d, bool accumulate_dx) {
  if (KernelThreads() == 1 || rows < 2 * RowGrain(d)) {  // one pass
    std::fill_n(dg, d, 0.0f);
    RmsNormBackwardRows(dy, x, g, rstd, dx, dg, 0, rows, d, accumulate_dx);
    return;
  }
  ParallelFor(rows, RowGrain(d), [&](int64_t r0, int64_t r1) {
    RmsNormBackwardRows(dy, x, g, rstd, dx, nullptr, r0, r1, d, accumulate_dx);
  });
  // Columns in chunks of 16 floats at least.
  const int64_t column_grain = std::max<int64_t>(16, RowGrain(rows));
  ParallelFor(d, column_grain, [&](int64_t c0, int64_t c1) {
    GainGradientColumns(dy, x, rstd, dg, rows, d, c0, c1);
  });
}

// ---- GELU, tanh approximation. ----

namespace {

// tanh(z) = 1 − 2/(e^{2z} + 1), z clamped to [-10, 10] (where tanh rounds to ±1 exactly).
inline float TanhVec(float z) {
  z = std::min(std::max(z, -10.0f), 10.0f);
  return 1.0f - 2.0f / (ExpVec(2.0f * z) + 1.0f);
}

SSHSDP_ACT_CLONES void GeluForwardRange(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + TanhVec(kGeluC * (v + 0.044715f * v * v * v)));
  }
}

// dx = dy · gelu'(x); dx may be dy (in place).
SSHSDP_ACT_CLONES void GeluBackwardRange(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = TanhVec(kGeluC * (v + 0.044715f * v * v * v));
    const float dt = (1.0f - t * t) * kGeluC * (1.0f + 3.0f * 0.044715f * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * dt);
  }
}

}  // namespace

void GeluForward(const float* x, float* y, int64_t n) {
  ParallelFor(n, kGrainElements,
              [&](int64_t b, int64_t e) { GeluForwardRange(x + b, y + b, e - b); });
}

// dx = dy · gelu'(x), in place on dy.
void GeluBackwardInPlace(const float* x, float* dy, int64_t n) {
  ParallelFor(n, kGrainElements,
              [&](int64_t b, int64_t e) { GeluBackwardRange(x + b, dy + b, dy + b, e - b); });
}

// One vectorised exp per logit (ExpVec): e = e^{z - max} is stored and summed in the same
// pass, then scaled by 1/Σe; the log-sum-exp and the loss are formed in double. Rows go to
// threads; each row's double loss is kept and the total summed in row order afterwards.
namespace {

SSHSDP_ACT_CLONES void SoftmaxCrossEntropyRows(float* logits, const int32_t* targets, float* losses,
                                               double* row_loss, int64_t r0, int64_t r1, int64_t V,
                                               int64_t ld) {
  for (int64_t r = r0; r < r1; ++r) {
    float* p = logits + r * ld;
    for (int64_t v = V; v < ld; ++v) p[v] = 0.0f;  // padded vocabulary: no mass
    const float mx = MaxVec(p, V);
    const float target_logit = p[targets[r]];
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t v = 0; v < V; ++v) {
      const float e = ExpVec(p[v] - mx);
      p[v] = e;
      sum += e;
    }
    const double lse = mx + std::log(static_cast<double>(sum));
    const double loss = lse - target_logit;
    losses[r] = static_cast<float>(loss);
    row_loss[r] = loss;
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) p[v] *= inv;
  }
}

SSHSDP_ACT_CLONES void SoftmaxCrossEntropyBackwardRows(const float* probs, const int32_t* targets,
                                                       float* dlogits, int64_t r0, int64_t r1,
                                                       int64_t ld, float scale) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* p = probs + r * ld;
    float* dl = dlogits + r * ld;
#pragma omp simd
    for (int64_t v = 0; v < ld; ++v) dl[v] = p[v] * scale;
    dl[targets[r]] -= scale;
  }
}

}  // namespace

double SoftmaxCrossEntropyForward(float* logits, const int32_t* targets, float* losses,
                                  int64_t rows, int64_t V, int64_t ld) {
  // Per-row losses of this call (every entry written below); kept per thread so the forward
  // allocates nothing after its first call.
  static thread_local std::vector<double> row_loss;
  row_loss.resize(static_cast<size_t>(std::max<int64_t>(rows, 0)));
  double* per_row = row_loss.data();  // the caller's: worker threads have their own thread_locals
  ParallelFor(rows, RowGrain(ld), [&](int64_t r0, int64_t r1) {
    SoftmaxCrossEntropyRows(logits, targets, losses, per_row, r0, r1, V, ld);
  });
  double total = 0.0;
  for (double l : row_loss) total += l;
  return total;
}

void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits,
                                 int64_t rows, int64_t ld, float scale) {
  ParallelFor(rows, RowGrain(ld), [&](int64_t r0, int64_t r1) {
    SoftmaxCrossEntropyBackwardRows(probs, targets, dlogits, r0, r1, ld, scale);
  });
}

// ---- SwiGLU. σ(z) = 1/(1 + e^{−z}); silu'(z) = σ(z)·(1 + z·(1 − σ(z))). ----
// One vectorised e^{−z} per element (ExpVec; clamped, so σ saturates to 0 and 1 cleanly),
// elements split over the kernel threads.

namespace {

SSHSDP_ACT_CLONES void SwigluForwardRange(const float* h1, const float* h3, float* a, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float z = h1[i];
    const float s = 1.0f / (1.0f + ExpVec(-z));
    a[i] = z * s * h3[i];
  }
}

SSHSDP_ACT_CLONES void SwigluBackwardRange(const float* h1, const float* h3, const float* da,
                                           float* dh1, float* dh3, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float z = h1[i], g = da[i];
    const float s = 1.0f / (1.0f + ExpVec(-z));
    dh1[i] = g * h3[i] * s * (1.0f + z * (1.0f - s));
    dh3[i] = g * z * s;
  }
}

}  // namespace

void SwigluForward(const float* h1, const float* h3, float* a, int64_t n) {
  ParallelFor(n, kGrainElements,
              [&](int64_t b, int64_t e) { SwigluForwardRange(h1 + b, h3 + b, a + b, e - b); });
}

void SwigluBackward(const float* h1, const float* h3, const float* da, float* dh1, float* dh3,
                    int64_t n) {
  ParallelFor(n, kGrainElements, [&](int64_t b, int64_t e) {
    SwigluBackwardRange(h1 + b, h3 + b, da + b, dh1 + b, dh3 + b, e - b);
  });
}

// ---- bf16 outputs: the fp32 kernels above into a per-thread buffer, then CastToBf16. ----

namespace {

constexpr int64_t kCastTile = 2048;  // elements per buffer of the elementwise kernels

// Row r of a [rows, d] output computed in fp32 by row(r, buffer), then rounded into y.
template <typename RowFn>
void RowsToBf16(int64_t rows, int64_t d, bf16* y, RowFn row) {
  ParallelFor(rows, RowGrain(d), [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> buffer;
    buffer.resize(static_cast<size_t>(d));
    for (int64_t r = r0; r < r1; ++r) {
      row(r, buffer.data());
      CastToBf16(buffer.data(), y + r * d, d);
    }
  });
}

// Elements [i, i + len) computed in fp32 by tile(i, len, buffer), then rounded into y.
template <typename TileFn>
void ElementsToBf16(int64_t n, bf16* y, TileFn tile) {
  ParallelFor(n, kGrainElements, [&](int64_t b, int64_t e) {
    float buffer[kCastTile];
    for (int64_t i = b; i < e; i += kCastTile) {
      const int64_t len = std::min(kCastTile, e - i);
      tile(i, len, buffer);
      CastToBf16(buffer, y + i, len);
    }
  });
}

}  // namespace

void RmsNormForwardBf16(const float* x, const float* g, bf16* y, float* rstd, int64_t rows, int d,
                        float eps) {
  RowsToBf16(rows, d, y, [&](int64_t r, float* out) {
    RmsNormForwardRows(x + r * d, g, out, rstd + r, 0, 1, d, eps);
  });
}

void GeluForwardBf16(const float* x, bf16* y, int64_t n) {
  ElementsToBf16(n, y,
                 [&](int64_t i, int64_t len, float* out) { GeluForwardRange(x + i, out, len); });
}

void GeluBackwardBf16(const float* x, const float* dy, bf16* dx, int64_t n) {
  ElementsToBf16(n, dx, [&](int64_t i, int64_t len, float* out) {
    GeluBackwardRange(x + i, dy + i, out, len);
  });
}

void SoftmaxCrossEntropyBackwardBf16(const float* probs, const int32_t* targets, bf16* dlogits,
                                     int64_t rows, int64_t ld, float scale) {
  RowsToBf16(rows, ld, dlogits, [&](int64_t r, float* out) {
    SoftmaxCrossEntropyBackwardRows(probs + r * ld, targets + r, out, 0, 1, ld, scale);
  });
}

void EmbeddingForwardF32(const float* wte, const float* wpe, const int32_t* tokens, int B, int T,
                         int d, float* out) {
  for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; ++bt) {
    const float* e = wte + static_cast<int64_t>(tokens[bt]) * d;
    float* x = out + bt * d;
    if (wpe == nullptr) {
      std::copy_n(e, d, x);
      continue;
    }
    const float* p = wpe + (bt % T) * d;
    for (int i = 0; i < d; ++i) x[i] = e[i] + p[i];
  }
}

void EmbeddingBackwardF32(const float* dx, const int32_t* tokens, int B, int T, int d, float* dwte,
                          int64_t vocab, float* dwpe, int64_t seq_len, bool accumulate) {
  if (!accumulate) {
    std::fill_n(dwte, vocab * d, 0.0f);
    if (dwpe) std::fill_n(dwpe, seq_len * d, 0.0f);
  }
  for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; ++bt) {
    const float* g = dx + bt * d;
    float* e = dwte + static_cast<int64_t>(tokens[bt]) * d;
    for (int i = 0; i < d; ++i) e[i] += g[i];
  }
  for (int64_t bt = 0; dwpe && bt < static_cast<int64_t>(B) * T; ++bt) {
    const float* g = dx + bt * d;
    float* p = dwpe + (bt % T) * d;
    for (int i = 0; i < d; ++i) p[i] += g[i];
  }
}

}  // namespace sshsdp::kernels
