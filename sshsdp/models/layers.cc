// Shared layer kernels of the reference models (see layers.h), moved unchanged from gpt.cc
// so the dense GPT keeps its exact numerics; SwiGLU added for the MoE experts. Reductions
// marked `omp simd` are vectorised (-fopenmp-simd; no OpenMP runtime).
#include "sshsdp/models/layers.h"

#include <cstring>

#include <algorithm>
#include <cmath>

#include "sshsdp/kernels/elementwise.h"
#include "sshsdp/kernels/matmul.h"

namespace sshsdp::layers {

// ---- RMSNorm: y = x · rstd · g, rstd = 1/sqrt(mean(x²) + eps). ----

void RmsNormForward(const float* x, const float* g, float* y, float* rstd, int64_t rows, int d) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < d; ++i) ss += xr[i] * xr[i];
    float s = 1.0f / std::sqrt(ss / static_cast<float>(d) + kRmsEps);
    rstd[r] = s;
    for (int i = 0; i < d; ++i) yr[i] = xr[i] * s * g[i];
  }
}

// dx (+)= ∂/∂x, dg = Σ_rows dy·x·rstd (overwritten).
void RmsNormBackward(const float* dy, const float* x, const float* g, const float* rstd, float* dx,
                     float* dg, int64_t rows, int d, bool accumulate_dx) {
  std::fill_n(dg, d, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
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
      dg[i] += dyr[i] * xr[i] * s;
    }
  }
}

// ---- GELU, tanh approximation. ----

namespace {

// e^x for the vectorised loops: x clamped to [-87, 88] (normal fp32 results), e^x = 2^n · p(r)
// with n = round(x / ln 2), r = x − n·ln 2 (two-constant Cody–Waite), p the degree-6 Taylor
// polynomial of e^r on |r| <= ln2/2 (relative error < 3e-8), and 2^n written into the
// exponent bits. No calls, no branches: `omp simd` vectorises it. NaN stays NaN.
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

// tanh(z) = 1 − 2/(e^{2z} + 1), z clamped to [-10, 10] (where tanh rounds to ±1 exactly).
inline float TanhVec(float z) {
  z = std::min(std::max(z, -10.0f), 10.0f);
  return 1.0f - 2.0f / (ExpVec(2.0f * z) + 1.0f);
}

}  // namespace

#define SSHSDP_ACT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

SSHSDP_ACT_CLONES void GeluForward(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + TanhVec(kGeluC * (v + 0.044715f * v * v * v)));
  }
}

// dx = dy · gelu'(x), in place on dy.
SSHSDP_ACT_CLONES void GeluBackwardInPlace(const float* x, float* dy, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = TanhVec(kGeluC * (v + 0.044715f * v * v * v));
    const float dt = (1.0f - t * t) * kGeluC * (1.0f + 3.0f * 0.044715f * v * v);
    dy[i] *= 0.5f * (1.0f + t) + 0.5f * v * dt;
  }
}

// ---- Causal multi-head attention over packed qkv rows [q (d) | k (d) | v (d)]. ----
// Per (batch, head), with Q, K, V the head's [T, dh] column blocks of qkv (row stride 3d):
//   S = Q·Kᵀ/√dh (fp32 GEMM), P = causal softmax(S) (fp32 loops), O = P·V.
// The GEMMs compute the full T×T product; the masked upper triangle of P is zero, so the
// products that use P are exact. Attention always runs in fp32, whatever the weight dtype.

void AttentionForward(const float* qkv, float* att, float* out, int B, int T, int H, int dh) {
  const int64_t d = static_cast<int64_t>(H) * dh, d3 = 3 * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  for (int b = 0; b < B; ++b) {
    const float* base = qkv + static_cast<int64_t>(b) * T * d3;
    for (int h = 0; h < H; ++h) {
      const float* q = base + h * dh;
      const float* k = base + d + h * dh;
      const float* v = base + 2 * d + h * dh;
      float* p = att + (static_cast<int64_t>(b) * H + h) * T * T;
      kernels::GemmStrided(false, true, T, T, dh, q, d3, k, d3, DType::kF32, p, T, DType::kF32,
                           false, scale);
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
      kernels::GemmStrided(false, false, T, dh, T, p, T, v, d3, DType::kF32,
                           out + static_cast<int64_t>(b) * T * d + h * dh, d, DType::kF32, false);
    }
  }
}

// dqkv is overwritten (every head's Q, K and V block is written by one GEMM each).
// dp is a [T, T] scratch.
void AttentionBackward(const float* dout, const float* qkv, const float* att, float* dqkv,
                       float* dp, int B, int T, int H, int dh) {
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
      kernels::GemmStrided(true, false, T, dh, T, p, T, goh, d, DType::kF32, dbase + 2 * d + h * dh,
                           d3, DType::kF32, false);
      kernels::GemmStrided(false, true, T, T, dh, goh, d, v, d3, DType::kF32, dp, T, DType::kF32,
                           false);
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
      kernels::GemmStrided(false, false, T, dh, T, dp, T, k, d3, DType::kF32, dbase + h * dh, d3,
                           DType::kF32, false);
      kernels::GemmStrided(true, false, T, dh, T, dp, T, q, d3, DType::kF32, dbase + d + h * dh, d3,
                           DType::kF32, false);
    }
  }
}

// Row `row` of a [rows, d] fp32/bf16 table as fp32.
void LoadRow(const TensorRef& t, int64_t row, int d, float* out) {
  if (t.dtype == DType::kF32) {
    std::copy_n(static_cast<const float*>(t.data) + row * d, d, out);
  } else {
    Bf16ToFloat(static_cast<const bf16*>(t.data) + row * d, out, static_cast<size_t>(d));
  }
}

void EmbeddingForward(const TensorRef& wte, const TensorRef& wpe, const int32_t* tokens, int B,
                      int T, int d, float* out) {
  std::vector<float> pos(d);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* x = out + (static_cast<int64_t>(b) * T + t) * d;
      LoadRow(wte, tokens[static_cast<int64_t>(b) * T + t], d, x);
      LoadRow(wpe, t, d, pos.data());
      for (int i = 0; i < d; ++i) x[i] += pos[i];
    }
  }
}

void EmbeddingBackward(const float* dx, const int32_t* tokens, int B, int T, int d,
                       const TensorRef& dwte, int64_t vocab, const TensorRef& dwpe, int64_t seq_len,
                       bool accumulate, std::vector<float>& scratch) {
  // Each table: scatter-add rows into fp32 (the view itself when it is fp32; a scratch table
  // when bf16, written once at the end so bf16 rounding happens once per element).
  auto scatter = [&](const TensorRef& g, int64_t rows, auto&& row_of) {
    const int64_t n = rows * d;
    float* dst;
    bool direct = g.dtype == DType::kF32;
    if (direct) {
      dst = static_cast<float*>(g.data);
      if (!accumulate) kernels::Fill(dst, n, 0.0f);  // rows that never occur get explicit zeros
    } else {
      if (static_cast<int64_t>(scratch.size()) < n) scratch.resize(n);
      dst = scratch.data();
      kernels::Fill(dst, n, 0.0f);
    }
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const float* g_row = dx + (static_cast<int64_t>(b) * T + t) * d;
        float* row = dst + row_of(b, t) * d;
        for (int i = 0; i < d; ++i) row[i] += g_row[i];  // repeated tokens add up
      }
    }
    if (!direct) kernels::WriteOrAccumulate(dst, g.data, g.dtype, n, accumulate);
  };
  scatter(dwte, vocab, [&](int b, int t) {
    return static_cast<int64_t>(tokens[static_cast<int64_t>(b) * T + t]);
  });
  scatter(dwpe, seq_len, [](int, int t) { return static_cast<int64_t>(t); });
}

// One vectorised exp per logit (ExpVec): e = e^{z - max} is stored and summed in the same
// pass, then scaled by 1/Σe; the log-sum-exp and the loss are formed in double.
SSHSDP_ACT_CLONES double SoftmaxCrossEntropyForward(float* logits, const int32_t* targets,
                                                    float* losses, int64_t rows, int64_t V,
                                                    int64_t ld) {
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    float* p = logits + r * ld;
    for (int64_t v = V; v < ld; ++v) p[v] = 0.0f;  // padded vocabulary: no mass
    float mx = p[0];
#pragma omp simd reduction(max : mx)
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, p[v]);
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
    total += loss;
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) p[v] *= inv;
  }
  return total;
}

void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits,
                                 int64_t rows, int64_t ld, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = probs + r * ld;
    float* dl = dlogits + r * ld;
    for (int64_t v = 0; v < ld; ++v) dl[v] = p[v] * scale;
    dl[targets[r]] -= scale;
  }
}

RuntimeParamSpec Single(std::string name, std::vector<int64_t> shape, UpdateKind kind,
                        InitSpec init) {
  RuntimeParamSpec s{name, shape, {}};
  s.parts.push_back(UpdatePart{std::move(name), std::move(shape), 0, kind, init});
  return s;
}

// ---- SwiGLU. σ(z) = 1/(1 + e^{−z}); silu'(z) = σ(z)·(1 + z·(1 − σ(z))). ----

void SwigluForward(const float* h1, const float* h3, float* a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float z = h1[i];
    const float s = 1.0f / (1.0f + std::exp(-z));
    a[i] = z * s * h3[i];
  }
}

void SwigluBackward(const float* h1, const float* h3, const float* da, float* dh1, float* dh3,
                    int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float z = h1[i], g = da[i];
    const float s = 1.0f / (1.0f + std::exp(-z));
    dh1[i] = g * h3[i] * s * (1.0f + z * (1.0f - s));
    dh3[i] = g * z * s;
  }
}

}  // namespace sshsdp::layers
