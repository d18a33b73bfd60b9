// QK-norm, RoPE and GQA head sharing between the QKV projection and attention (rope.h):
// per row, each head's dh values normalised (Qwen3), rotated, and copied to the Q/K/V slots
// attention reads; the backward in reverse, K/V copies summed in order.
#include "sshsdp/kernels/rope.h"

#include <algorithm>
#include <cmath>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/parallel.h"

namespace sshsdp::kernels {
namespace {

constexpr int kMaxHeadDim = 1024;  // the per-row scratch below

// y = x·rstd·g over n values; returns rstd.
float NormHead(const float* x, const float* g, float eps, int n, float* y) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float s = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int i = 0; i < n; ++i) y[i] = x[i] * s * g[i];
  return s;
}

// In place: dn (∂/∂ the normed head) becomes ∂/∂x (RMSNorm's backward, layer_kernels.cc).
void NormHeadBackward(const float* x, const float* g, float s, int n, float* d) {
  float dot = 0.0f;
  for (int i = 0; i < n; ++i) dot += d[i] * g[i] * x[i];
  const float c = s * s * dot / static_cast<float>(n);
  for (int i = 0; i < n; ++i) d[i] = s * (g[i] * d[i] - x[i] * c);
}

void Rotate(const float* x, const float* c, const float* s, int half, float* y) {
  for (int i = 0; i < half; ++i) {
    y[i] = x[i] * c[i] - x[i + half] * s[i];
    y[i + half] = x[i + half] * c[i] + x[i] * s[i];
  }
}

// The transpose of Rotate (a rotation by the opposite angle).
void RotateBack(const float* dy, const float* c, const float* s, int half, float* dx) {
  for (int i = 0; i < half; ++i) {
    const float a = dy[i], b = dy[i + half];
    dx[i] = a * c[i] + b * s[i];
    dx[i + half] = b * c[i] - a * s[i];
  }
}

}  // namespace

RopeTables MakeRopeTables(int positions, int dh, double theta) {
  SSHSDP_CHECK(positions > 0 && dh > 0 && dh % 2 == 0 && theta > 0, NumericsError,
               "RoPE tables: need positions > 0, an even head width and theta > 0, got {}, {}, {}",
               positions, dh, theta);
  const int half = dh / 2;
  RopeTables t;
  t.cos.resize(static_cast<size_t>(positions) * half);
  t.sin.resize(t.cos.size());
  // fp32 throughout, as transformers' default rotary embedding computes it.
  const float base = static_cast<float>(theta);
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dh);
    const float inv = 1.0f / std::pow(base, e);
    for (int p = 0; p < positions; ++p) {
      const float a = static_cast<float>(p) * inv;
      t.cos[static_cast<size_t>(p) * half + i] = std::cos(a);
      t.sin[static_cast<size_t>(p) * half + i] = std::sin(a);
    }
  }
  return t;
}

void CheckRopeShape(const RopeShape& s, const char* op) {
  SSHSDP_CHECK(s.B >= 0 && s.T >= 0 && s.Hq > 0 && s.Hkv > 0 && s.Hq % s.Hkv == 0 && s.dh > 0 &&
                   s.dh % 2 == 0 && s.dh <= kMaxHeadDim,
               NumericsError,
               "{}: need B, T >= 0, Hkv dividing Hq and an even head width <= {}, got B={} T={} "
               "Hq={} Hkv={} dh={}",
               op, kMaxHeadDim, s.B, s.T, s.Hq, s.Hkv, s.dh);
}

void RopeQkvForward(const float* raw, const float* cos, const float* sin, const float* q_gain,
                    const float* k_gain, float eps, float* att, float* rstd, const RopeShape& s) {
  CheckRopeShape(s, "RopeQkvForward");
  const bool norm = q_gain != nullptr;
  SSHSDP_CHECK(norm == (k_gain != nullptr) && (!norm || rstd != nullptr), NumericsError,
               "RopeQkvForward: QK-norm takes both gains and an rstd array");
  const int dh = s.dh, half = dh / 2, G = s.Hq / s.Hkv;
  const int64_t rw = s.raw_width(), aw = s.att_width(), qd = int64_t{s.Hq} * dh;
  ParallelFor(s.rows(), 16, [&](int64_t r0, int64_t r1) {
    float tmp[kMaxHeadDim], rot[kMaxHeadDim];
    for (int64_t r = r0; r < r1; ++r) {
      const float* c = cos + (r % s.T) * half;
      const float* sn = sin + (r % s.T) * half;
      const float* x = raw + r * rw;
      float* y = att + r * aw;
      float* rs = norm ? rstd + r * s.norm_heads() : nullptr;
      for (int h = 0; h < s.Hq; ++h) {
        const float* xh = x + int64_t{h} * dh;
        if (norm) rs[h] = NormHead(xh, q_gain, eps, dh, tmp);
        Rotate(norm ? tmp : xh, c, sn, half, y + int64_t{h} * dh);
      }
      for (int j = 0; j < s.Hkv; ++j) {
        const float* kh = x + qd + int64_t{j} * dh;
        const float* vh = x + qd + int64_t{s.Hkv + j} * dh;
        if (norm) rs[s.Hq + j] = NormHead(kh, k_gain, eps, dh, tmp);
        Rotate(norm ? tmp : kh, c, sn, half, rot);
        for (int g = 0; g < G; ++g) {
          const int64_t h = int64_t{j} * G + g;
          std::copy_n(rot, dh, y + qd + h * dh);
          std::copy_n(vh, dh, y + 2 * qd + h * dh);
        }
      }
    }
  });
}

void RopeQkvBackward(const float* datt, const float* raw, const float* cos, const float* sin,
                     const float* q_gain, const float* k_gain, const float* rstd, float* draw,
                     float* dq_gain, float* dk_gain, const RopeShape& s) {
  CheckRopeShape(s, "RopeQkvBackward");
  const bool norm = q_gain != nullptr;
  SSHSDP_CHECK(norm == (k_gain != nullptr) &&
                   (!norm || (rstd != nullptr && dq_gain != nullptr && dk_gain != nullptr)),
               NumericsError,
               "RopeQkvBackward: QK-norm takes both gains, rstd and their gradients");
  const int dh = s.dh, half = dh / 2, G = s.Hq / s.Hkv, nh = s.norm_heads();
  const int64_t rw = s.raw_width(), aw = s.att_width(), qd = int64_t{s.Hq} * dh;
  // 1. ∂/∂(the normed heads) through RoPE, K / V copies summed; V is done.
  ParallelFor(s.rows(), 16, [&](int64_t r0, int64_t r1) {
    float sum[kMaxHeadDim];
    for (int64_t r = r0; r < r1; ++r) {
      const float* c = cos + (r % s.T) * half;
      const float* sn = sin + (r % s.T) * half;
      const float* dy = datt + r * aw;
      float* dx = draw + r * rw;
      for (int h = 0; h < s.Hq; ++h) RotateBack(dy + int64_t{h} * dh, c, sn, half, dx + h * dh);
      for (int j = 0; j < s.Hkv; ++j) {
        float* dv = dx + qd + int64_t{s.Hkv + j} * dh;
        std::fill_n(sum, dh, 0.0f);
        std::fill_n(dv, dh, 0.0f);
        for (int g = 0; g < G; ++g) {
          const int64_t h = int64_t{j} * G + g;
          for (int i = 0; i < dh; ++i) sum[i] += dy[qd + h * dh + i];
          for (int i = 0; i < dh; ++i) dv[i] += dy[2 * qd + h * dh + i];
        }
        RotateBack(sum, c, sn, half, dx + qd + int64_t{j} * dh);
      }
    }
  });
  if (!norm) return;
  // 2. The gains' gradients: Σ over rows, then heads, of dn·x·rstd, per column.
  ParallelFor(dh, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t i = c0; i < c1; ++i) {
      float gq = 0.0f, gk = 0.0f;
      for (int64_t r = 0; r < s.rows(); ++r)
        for (int h = 0; h < nh; ++h) {
          const int64_t at = r * rw + int64_t{h} * dh + i;
          const float v = draw[at] * raw[at] * rstd[r * nh + h];
          (h < s.Hq ? gq : gk) += v;
        }
      dq_gain[i] = gq;
      dk_gain[i] = gk;
    }
  });
  // 3. Through the norms, in place.
  ParallelFor(s.rows(), 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int h = 0; h < nh; ++h) {
        const int64_t at = r * rw + int64_t{h} * dh;
        NormHeadBackward(raw + at, h < s.Hq ? q_gain : k_gain, rstd[r * nh + h], dh, draw + at);
      }
  });
}

}  // namespace sshsdp::kernels
