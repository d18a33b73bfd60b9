// The optimizers' elementwise kernels (see optimizer.h).
#include "sshsdp/kernels/optimizer.h"

#include <algorithm>
#include <cmath>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/elementwise.h"

namespace sshsdp {

void ValidateAdamW(const AdamWConfig& c) {
  SSHSDP_CHECK(std::isfinite(c.lr) && c.lr >= 0, ConfigError,
               "AdamW lr (--lr) must be a finite number >= 0, got {}", c.lr);
  SSHSDP_CHECK(c.beta1 >= 0 && c.beta1 < 1, ConfigError,
               "AdamW beta1 (--beta1) must lie in [0, 1), got {}", c.beta1);
  SSHSDP_CHECK(c.beta2 >= 0 && c.beta2 < 1, ConfigError,
               "AdamW beta2 (--beta2) must lie in [0, 1), got {}", c.beta2);
  SSHSDP_CHECK(std::isfinite(c.eps) && c.eps > 0, ConfigError,
               "AdamW eps (--eps) must be a finite number > 0, got {}", c.eps);
  SSHSDP_CHECK(std::isfinite(c.weight_decay) && c.weight_decay >= 0, ConfigError,
               "AdamW weight decay (--weight-decay) must be a finite number >= 0, got {}",
               c.weight_decay);
}

AdamWScalars AdamWStepScalars(const AdamWConfig& cfg, int64_t step) {
  SSHSDP_CHECK(step >= 1, PlanError, "AdamW step must be >= 1, got {}", step);
  const float bc1 = 1.0f - std::pow(cfg.beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(cfg.beta2, static_cast<float>(step));
  return {cfg.beta1, cfg.beta2, cfg.eps, cfg.lr / bc1, 1.0f / std::sqrt(bc2)};
}

void AdamWStep(const AdamWSpan* spans, int count, const AdamWConfig& cfg, int64_t step,
               float grad_scale) {
  const AdamWScalars k = AdamWStepScalars(cfg, step);
  const float b1 = k.beta1, b2 = k.beta2;
  for (int j = 0; j < count; ++j) {
    const AdamWSpan& s = spans[j];
    const float decay = 1.0f - cfg.lr * s.weight_decay;
    float* __restrict w = s.w;
    const float* __restrict g = s.g;
    float* __restrict m = s.m;
    float* __restrict v = s.v;
    for (int64_t i = 0; i < s.n; ++i) {
      float gi = g[i] * grad_scale;
      float mi = b1 * m[i] + (1.0f - b1) * gi;
      float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      float denom = std::sqrt(vi) * k.inv_sqrt_bc2 + k.eps;
      w[i] = w[i] * decay - k.step_size * mi / denom;
    }
  }
}

void MuonMomentum(const float* grad, float* m, void* u, DType u_dtype, int64_t n, float momentum,
                  bool nesterov, float grad_scale) {
  SSHSDP_CHECK(n >= 0 && (u_dtype == DType::kF32 || u_dtype == DType::kBF16), NumericsError,
               "MuonMomentum: need n >= 0 and a bf16 or fp32 u, got n={} u={}", n,
               DTypeName(u_dtype));
  const bool u32 = u_dtype == DType::kF32;
  const float mu = momentum, gs = grad_scale;
  constexpr int64_t kTile = 256;
  float tmp[kTile];
  for (int64_t i0 = 0; i0 < n; i0 += kTile) {
    const int64_t k = std::min(kTile, n - i0);
    const float* __restrict g = grad + i0;
    float* __restrict mt = m + i0;
    float* __restrict out = u32 ? static_cast<float*>(u) + i0 : tmp;
    for (int64_t i = 0; i < k; ++i) {
      const float gi = gs * g[i];
      const float mi = mu * mt[i] + gi;
      mt[i] = mi;
      out[i] = nesterov ? gi + mu * mi : mi;
    }
    if (!u32) kernels::CastToBf16(tmp, static_cast<bf16*>(u) + i0, k);
  }
}

void MuonWeightUpdate(float* w, const float* v, int64_t n, float lr, float weight_decay) {
  SSHSDP_CHECK(n >= 0, NumericsError, "MuonWeightUpdate: n must be >= 0, got {}", n);
  const float decay = 1.0f - lr * weight_decay;
  float* __restrict wr = w;
  const float* __restrict vr = v;
  for (int64_t i = 0; i < n; ++i) wr[i] = wr[i] * decay - lr * vr[i];
}

}  // namespace sshsdp
